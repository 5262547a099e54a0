"""Priorities: a line's ``priority`` or its file's ``--priority``, claims by priority then as
before, a shared request taking the highest, and a running `aiq run` taking a higher file
added meanwhile (a real fake server, real `aiq` subprocesses)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import API_KEY, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer
from hypothesis import example, given
from hypothesis import strategies as st

from aiq.defaults import PRIORITY_MAX, PRIORITY_MIN
from aiq.enqueue import add_file
from aiq.inputs import Defaults, LineError, Request, parse_line
from aiq.records import QUEUED, Outcome
from aiq.requestfile import read_requests
from aiq.store import JobStore

M = Defaults(model="m")


def _write(path: Path, *lines: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


async def _add(store: JobStore, path: Path, defaults: Defaults = M) -> None:
    source = await store.add_source(str(path), out_path=f"{path}.o", dead_path=f"{path}.d")
    await add_file(store, source, read_requests(path, defaults))


def _prompt_of(body: bytes) -> str:
    return str(json.loads(body)["messages"][-1]["content"])


# -- the field -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        {"custom_id": "a", "prompt": "x", "priority": 7},
        {"custom_id": "a", "messages": [{"role": "user", "content": "x"}], "priority": 7},
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            "priority": 7,
        },
        {"custom_id": "a", "params": {"model": "m", "messages": [{"role": "user"}]}, "priority": 7},
    ],
    ids=["prompt", "chat", "batch-api", "message-batches"],
)
def test_priority_is_read_from_every_shape_and_kept_out_of_body_and_key(line: dict) -> None:
    with_it = parse_line(json.dumps(line).encode(), 1, M)
    without = parse_line(
        json.dumps({k: v for k, v in line.items() if k != "priority"}).encode(), 1, M
    )
    assert with_it.priority == 7 and without.priority == 0
    assert b"priority" not in with_it.body
    assert (with_it.body, with_it.key) == (without.body, without.key)


@given(st.integers(-(2**70), 2**70))
@example(-9_999_999_999_999_998_976)  # shown as -1e+19: no digits after the point
def test_a_whole_number_priority_is_taken_in_range_and_refused_outside(value: int) -> None:
    line = json.dumps({"prompt": "x", "priority": value}).encode()
    if PRIORITY_MIN <= value <= PRIORITY_MAX:
        assert parse_line(line, 1, M).priority == value
    else:
        # Past 64 bits, JSON's number is read as a float, and shown as one (-1e+19 too).
        got = str(value) if -(2**63) <= value < 2**64 else r"-?\d(\.\d+)?e\+\d+"
        with pytest.raises(LineError, match=f"field 'priority': expected .*, got {got}$"):
            parse_line(line, 1, M)


def test_the_files_priority_is_a_default_a_line_overrides() -> None:
    d = Defaults(model="m", priority=3)
    assert parse_line(b'{"prompt": "x"}', 1, d).priority == 3
    assert parse_line(b'{"prompt": "x", "priority": -2}', 1, d).priority == -2


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"high"', "got a string"),
        ("true", "got a boolean"),
        ("2.5", "got 2.5"),
        ("2.0", "2.0 (write it without the decimal point)"),
        ("null", "got null"),
        (str(PRIORITY_MAX + 1), f"got {PRIORITY_MAX + 1}"),
    ],
)
def test_a_bad_priority_names_file_line_and_field(tmp_path: Path, value: str, says: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": "x", "priority": ' + value + "}\n")
    fine, bad = list(read_requests(path, M))
    assert isinstance(fine, Request) and fine.priority == 0
    assert str(bad).startswith(f"{path}:2: field 'priority': expected a whole number from ")
    assert str(bad).endswith(says)
    with pytest.raises(LineError, match="field 'priority'"):
        parse_line(('{"prompt": "x", "priority": ' + value + "}").encode(), 1, M)


# -- claims ----------------------------------------------------------------------------------


def test_claims_take_priority_first_then_input_order_and_a_retry_keeps_its_priority(
    tmp_path: Path,
) -> None:
    nightly = _write(tmp_path / "n.jsonl", *({"prompt": f"n{i}"} for i in range(6)))
    urgent = _write(
        tmp_path / "u.jsonl",
        {"prompt": "u0", "priority": 10},
        {"prompt": "u1", "priority": 10},
        {"prompt": "low", "priority": -1},
        {"prompt": "u2", "priority": 5},
    )

    async def scenario() -> list[list[str]]:
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            await _add(store, nightly)
            first = await store.claim(2, now=100.0)  # n0, n1: only priority 0 so far
            await _add(store, urgent)
            # n1 fails and waits until 150: at its priority, 0, not first any more.
            retry = Outcome(first[1].id, QUEUED, 1, 100.0, next_at=150.0, error_type="server")
            taken = [first, await store.claim(3, now=200.0, record=[retry])]
            taken.append(await store.claim(100, now=200.0))
            return [[_prompt_of(j.body) for j in jobs] for jobs in taken]

    assert asyncio.run(scenario()) == [
        ["n0", "n1"],
        ["u0", "u1", "u2"],  # returned in claim order, not by id
        ["n1", "n2", "n3", "n4", "n5", "low"],  # the retry first among its priority's
    ]


def test_a_request_shared_by_lines_of_two_priorities_takes_the_highest(tmp_path: Path) -> None:
    nightly = _write(tmp_path / "n.jsonl", {"prompt": "shared"}, {"prompt": "n1"})
    urgent = _write(tmp_path / "u.jsonl", {"prompt": "shared", "priority": 9})

    async def scenario() -> list[tuple[Any, ...]]:
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            await _add(store, nightly)
            await _add(store, urgent)
            await _add(store, nightly, Defaults(model="m", priority=1))  # read again, at 1
            rows = await store.connection.execute_fetchall("SELECT priority FROM jobs ORDER BY id")
            return [tuple(r) for r in rows]

    # The nightly file again, at 1, raises n1 but does not lower what the urgent one asked.
    assert asyncio.run(scenario()) == [(9,), (1,)]


# -- end to end ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_running_run_takes_a_higher_priority_file_added_meanwhile(tmp_path: Path) -> None:
    nightly = [(f"n{i}", f"nightly {i}") for i in range(240)]
    urgent = [(f"u{i}", f"urgent {i}") for i in range(12)]
    write_prompts(tmp_path / "nightly.jsonl", nightly)
    write_prompts(tmp_path / "urgent.jsonl", urgent)
    with FakeServer(require_key=API_KEY, latency_s=0.02) as server:
        args = ("--base-url", server.base_url, "--model", "m")
        run = start_aiq("run", "nightly.jsonl", *args, "--concurrency", "2", cwd=tmp_path)
        try:
            deadline = time.monotonic() + 30
            while len(server.requests) < 20 and time.monotonic() < deadline:
                time.sleep(0.02)
            added = run_aiq("add", "urgent.jsonl", "--model", "m", "--priority", "10", cwd=tmp_path)
            assert added.returncode == 0, added.stderr
            at_add = len(server.requests)
            assert run.wait(timeout=60) == 0
        finally:
            run.kill()
        sent = [r.prompt for r in server.requests]
    assert sorted(sent) == sorted(p for _, p in nightly + urgent)  # each once
    assert at_add < len(nightly) - 60, "the run was nearly over before the add: no test"
    last_urgent = max(sent.index(p) for _, p in urgent)
    # Within what the run had claimed ahead when the file came in (8 a sender) and one cycle.
    assert last_urgent < at_add + 2 * 8 + len(urgent) + 10, (at_add, last_urgent)


def test_identical_lines_of_one_file_give_their_request_the_highest_priority(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path / "p.jsonl",
        {"custom_id": "a", "prompt": "same", "priority": -5},
        {"custom_id": "b", "prompt": "same", "priority": -2},
        {"custom_id": "c", "prompt": "other", "priority": -7},
    )

    async def scenario() -> list[tuple[Any, ...]]:
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            await _add(store, path)
            rows = await store.connection.execute_fetchall("SELECT priority FROM jobs ORDER BY id")
            return [tuple(r) for r in rows]

    assert asyncio.run(scenario()) == [(-2,), (-7,)]


def test_the_claim_reads_untried_jobs_in_order_from_the_index_not_a_sort(tmp_path: Path) -> None:
    # `next_at = 0 AND next_at <= ?` made SQLite take the range and sort every untried job:
    # a claim's cost grew with the store (34 ms at 200,000 jobs; bench/claim_cost.py).
    from aiq.jobqueue import _CLAIM

    async def plan() -> list[str]:
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            rows = await store.connection.execute_fetchall(
                "EXPLAIN QUERY PLAN " + _CLAIM, (1, 700.0, QUEUED, 100.0, 10)
            )
            return [r[3] for r in rows]

    steps = asyncio.run(plan())
    untried = steps.index("SEARCH jobs USING COVERING INDEX jobs_claim (state=? AND next_at=?)")
    assert "TEMP B-TREE" not in " ".join(steps[untried:]), steps


def test_a_store_from_before_priorities_is_upgraded_in_place(tmp_path: Path) -> None:
    import sqlite3

    path = _write(tmp_path / "n.jsonl", *({"prompt": f"n{i}"} for i in range(3)))
    db = tmp_path / "aiq.db"

    async def fill() -> None:
        async with await JobStore.open(db) as store:
            await _add(store, path)

    asyncio.run(fill())
    with sqlite3.connect(db) as conn:  # back to what aiq before 0009 left
        conn.execute("DROP TRIGGER jobs_errors_delete")
        conn.execute("DROP TABLE errors")
        conn.execute("DROP INDEX jobs_claim")
        conn.execute("ALTER TABLE jobs DROP COLUMN priority")
        conn.execute("CREATE INDEX jobs_state_next ON jobs (state, next_at)")
        conn.execute("DELETE FROM migrations WHERE name = '0009_priority'")
    urgent = _write(tmp_path / "u.jsonl", {"prompt": "u0", "priority": 4})

    async def after() -> list[str]:
        async with await JobStore.open(db) as store:
            await _add(store, urgent)
            return [_prompt_of(j.body) for j in await store.claim(10, now=100.0)]

    assert asyncio.run(after()) == ["u0", "n0", "n1", "n2"]
    with sqlite3.connect(db) as conn:
        indexes = {
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
    assert "jobs_claim" in indexes and "jobs_state_next" not in indexes
