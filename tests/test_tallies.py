"""The counts kept as jobs change (aiq.tallies) against a full scan of the jobs: after any
sequence of store operations, after an upgrade of a store from before them, and after
kill -9; and `status` reads them without scanning the jobs table."""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import run_aiq, start_aiq, undo_tallies, write_prompts
from fakeserver import FakeServer
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.contract import DEAD, DONE, QUEUED, RUNNING, STATE_NAMES, TIERS, JobError, JobState
from aiq.enqueue import add_file
from aiq.inputs import Defaults
from aiq.outputs import _stamp
from aiq.records import Job, Outcome, Source
from aiq.requestfile import read_requests
from aiq.retention import prune
from aiq.stops import CONTENT_FILTER, TRUNCATED
from aiq.store import JobStore
from aiq.usage import Usage

NOW = 2_000_000.0
MODELS = ["a", "b", None]
ERRORS: list[JobError | None] = ["server", "timeout", TRUNCATED, None]
FAST_RETRIES = "backoff_base_s: 0.01\nbackoff_cap_s: 0.05\n"

# What a tally holds, by a scan of the jobs: queued and running as one state (aiq.tallies).
_SCAN = (
    "SELECT CASE state WHEN 1 THEN 0 ELSE state END AS s, model, error_type, tier, count(*), "
    "count(tokens_in), count(cost_usd), coalesce(sum(cost_usd), 0), sum(timeouts), "
    "coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0), "
    "coalesce(sum(tokens_cached), 0), coalesce(sum(tokens_cache_write), 0), "
    "coalesce(sum(tokens_cache_read), 0), coalesce(sum(tokens_reasoning), 0) "
    "FROM jobs GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
)
_FIGURES = (
    "jobs, usable, priced, cost_usd, timeouts, tokens_in, tokens_out, tokens_cached, "
    "tokens_cache_write, tokens_cache_read, tokens_reasoning"
)
_KEPT = (
    f"SELECT state, model, error_type, tier, {_FIGURES} FROM tallies WHERE jobs != 0 "
    "ORDER BY 1, 2, 3, 4"
)
_COST = 7  # the column of cost_usd in both: equal to float rounding


def assert_kept_equal_scan(conn: sqlite3.Connection) -> None:
    """The kept tallies are the scan's, row for row (costs to float rounding), and a tally
    that fell to no job holds nothing."""
    kept, scan = conn.execute(_KEPT).fetchall(), conn.execute(_SCAN).fetchall()
    assert [_exact(r) for r in kept] == [_exact(r) for r in scan]
    for k, s in zip(kept, scan, strict=True):
        assert abs(k[_COST] - s[_COST]) < 1e-9
    for empty in conn.execute(f"SELECT {_FIGURES} FROM tallies WHERE jobs = 0"):
        assert all(abs(v) < 1e-9 for v in empty), empty


def _exact(row: Sequence[Any]) -> tuple[Any, ...]:
    return (*row[:_COST], *row[_COST + 1 :])


async def _check(store: JobStore, now: float) -> None:
    """Kept tallies against the scan, and stats' index-read figures against plain queries."""
    rows = await store._db.execute_fetchall(_KEPT)
    scan = await store._db.execute_fetchall(_SCAN)
    assert [_exact(r) for r in rows] == [_exact(r) for r in scan]

    async def one(sql: str, *params: Any) -> Any:
        ((value,),) = await store._db.execute_fetchall(sql, params)
        return value

    stats = await store.stats(now=now)
    for state, name in enumerate(STATE_NAMES):
        assert stats.counts[name] == await one("SELECT count(*) FROM jobs WHERE state = ?", state)
    assert stats.in_flight == await one(
        "SELECT count(*) FROM jobs WHERE state = ? AND sent_at IS NOT NULL", RUNNING
    )
    oldest = await one("SELECT min(created_at) FROM jobs WHERE state = ?", QUEUED)
    assert stats.oldest_queued_s == (None if oldest is None else round(max(0, now - oldest), 1))
    assert stats.done_recent == await one(
        "SELECT count(*) FROM jobs WHERE state = ? AND finished_at > ?", DONE, now - 60
    )
    assert stats.timeouts == await one("SELECT coalesce(sum(timeouts), 0) FROM jobs")
    # Cost per tier: of the done jobs, and of the dead ones whose reply stopped short with a
    # price (billed), as the models' (aiq.tallies._Sums).
    by_tier = await store._db.execute_fetchall(
        "SELECT coalesce(tier, 'unknown'), sum(state = ?), sum(cost_usd), "
        "sum(state = ? AND cost_usd IS NULL) FROM jobs WHERE state = ? "
        "OR (state = ? AND error_type IN (?, ?) AND cost_usd IS NOT NULL) GROUP BY 1",
        (DONE, DONE, DONE, DEAD, TRUNCATED, CONTENT_FILTER),
    )
    scanned = {t: (done, cost, unpriced) for t, done, cost, unpriced in by_tier}
    assert [t.tier for t in stats.tiers] == [t for t in (*TIERS, "unknown") if t in scanned]
    for t in stats.tiers:
        done, cost, unpriced = scanned[t.tier]
        assert (t.done, t.unpriced) == (done, unpriced)
        assert cost == t.cost_usd if cost is None else abs(t.cost_usd - cost) < 1e-9
    assert await store.count_jobs() == sum(stats.counts.values())
    assert await store.job_counts() == (stats.total, stats.total - stats.counts["done"])
    assert await store.dead_error_types() == {
        t: n
        for t, n in await store._db.execute_fetchall(
            "SELECT coalesce(error_type, '?') t, count(*) n FROM jobs WHERE state = ? "
            "GROUP BY t ORDER BY n DESC, t",
            (DEAD,),
        )
    }


def _outcome(rng: random.Random, job: Job, now: float) -> Outcome:
    kind = rng.choice(["done", "dead", "retry"])
    error = rng.choice(ERRORS)
    usage = rng.choice([None, Usage(rng.randint(0, 99), rng.randint(0, 99), rng.randint(0, 9))])
    cost = None if usage is None else rng.choice([None, rng.uniform(0, 0.01)])
    state: JobState = DONE if kind == "done" else DEAD if kind == "dead" else QUEUED
    return Outcome(
        job.id, state, job.attempts + 1, started_at=now - 1,
        finished_at=None if kind == "retry" else now - rng.uniform(0, 120),
        next_at=now + rng.choice([-5, 5]) if kind == "retry" else 0.0,
        error_type=None if kind == "done" and error != TRUNCATED else error,
        usage=usage, model=rng.choice(MODELS), cost_usd=cost, timed_out=rng.random() < 0.2,
        tier=None if kind == "retry" else rng.choice(TIERS),
        response=b'{"ok": 1}' if kind == "done" else None,  # a done job has its reply
    )  # fmt: skip


async def _replay(store: JobStore, rng: random.Random) -> None:
    """Replay dead jobs of one error type, or some by id; the count is of jobs alone."""
    dead = [
        (i, t)
        for i, t in await store._db.execute_fetchall(
            # A pruned job (aiq.retention, its request gone) is not replayed.
            "SELECT id, coalesce(error_type, '?') FROM jobs WHERE state = ? AND length(body) > 0",
            (DEAD,),
        )
    ]
    if rng.random() < 0.5:
        error_type = rng.choice([None, *ERRORS[:-1], "?"])
        want = sum(error_type in (None, t) for _, t in dead)
        assert await store.replay_dead(error_type=error_type) == want
    else:
        ids = [i for i, _ in dead if rng.random() < 0.5] + [10**6]  # one no job has
        assert await store.replay_dead(job_ids=ids * 2) == len(ids) - 1


# Jobs in each state, some crashed in flight, for the random operations to move about.
_START = ["add", "claim", "sent", "record", "claim", "sent", "recover", "claim", "sent"]
OPS = [
    "add", "claim", "sent", "record", "defer", "release", "recover", "undefer", "replay", "prune",
]  # fmt: skip


async def _prune(store: JobStore, source: Source, rng: random.Random, now: float) -> None:
    """A prune of what a run's export wrote: the rows emptied, or deleted (``forget``), which
    the tallies' delete trigger takes off. The export's stamp is made here, over files of no
    matter (a real export fsyncs both files: most of this test's time)."""
    for path in (source.out_path, source.dead_path):
        Path(path).write_bytes(b"")
    stamp = _stamp(await store.changes(), "done", source.out_path, source.dead_path, 0, 0)
    assert stamp is not None
    await store.save_export_stamp(source, {**stamp, "at": time.time()})
    await prune(
        store,
        done_older_than_s=rng.choice([0.0, 60.0]),
        dead_older_than_s=rng.choice([None, 0.0]),
        keep_results=rng.random() < 0.3,
        forget=rng.random() < 0.5,
        now=now,
    )


@pytest.mark.slow  # 30 stores, each through up to 25 operations: 4-5 s
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ops=st.lists(st.sampled_from(OPS), max_size=25))
def test_kept_counts_equal_a_scan_after_any_sequence_of_operations(
    tmp_path_factory: Any, seed: int, ops: list[str]
) -> None:
    rng = random.Random(seed)
    tmp = tmp_path_factory.mktemp("tallies")
    path = tmp / "p.jsonl"

    async def scenario() -> None:
        async with await JobStore.open(tmp / "aiq.db") as store:
            source = await store.add_source(
                str(path), out_path=str(tmp / "o"), dead_path=str(tmp / "d")
            )
            claimed: dict[int, Job] = {}
            now = NOW
            for op in [*_START, *ops]:
                now += rng.uniform(0, 30)
                picked = [j for j in claimed.values() if rng.random() < 0.5]
                if op == "add":  # custom_ids re-pointed to new prompts leave orphans dropped
                    lines = [
                        orjson.dumps({"custom_id": f"c{rng.randint(0, 12)}",
                                      "prompt": f"p{rng.randint(0, 20)}"}) + b"\n"
                        for _ in range(rng.randint(0, 15))
                    ]  # fmt: skip
                    path.write_bytes(b"".join(lines))
                    await add_file(store, source, read_requests(path, Defaults(model="m")))
                elif op == "claim":
                    for job in await store.claim(rng.randint(0, 10), now=now):
                        claimed[job.id] = job
                elif op == "sent":
                    await store.record([], sent=[j.id for j in picked])
                elif op == "record":
                    await store.record([_outcome(rng, j, now) for j in picked])
                elif op == "defer":
                    await store.record([], deferred=[(now + 10, j.id) for j in picked])
                elif op == "release":
                    await store.release(picked)
                elif op == "recover":
                    await store.recover_running(rng.choice([None, 1, 2]), now=now)
                    claimed.clear()
                elif op == "undefer":
                    await store.undefer(now=now)
                elif op == "replay":
                    await _replay(store, rng)
                elif op == "prune":
                    await _prune(store, source, rng, now)
                if op in ("record", "defer", "release"):
                    for j in picked:
                        claimed.pop(j.id)
                await _check(store, now)

    asyncio.run(scenario())


def test_a_store_from_before_the_tallies_is_counted_when_upgraded(tmp_path: Path) -> None:
    prompts = [(f"c{i}", f"prompt {i}" + " CUT_OFF" * (i % 5 == 0)) for i in range(30)]
    write_prompts(tmp_path / "p.jsonl", prompts)
    (tmp_path / "aiq.yaml").write_text(FAST_RETRIES)
    with FakeServer(reject_rate=0.3, seed=7) as server:
        args = ("--base-url", server.base_url, "--model", "m")
        assert run_aiq("run", "p.jsonl", *args, cwd=tmp_path).returncode == 1  # some dead
    db = tmp_path / ".aiq" / "aiq.db"
    before = orjson.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    assert before["counts"]["dead"] and before["truncated"]
    with sqlite3.connect(db) as conn:
        undo_tallies(conn)
        # As an older aiq wrote them: next_at 0 when done; and half done an hour ago.
        conn.execute("UPDATE jobs SET next_at = 0 WHERE state = ?", (DONE,))
        conn.execute("UPDATE jobs SET finished_at = finished_at - 3600 WHERE id % 2 = 0")
    conn.close()
    assert run_aiq("add", "p.jsonl", "--model", "m", cwd=tmp_path).returncode == 0  # upgrades
    after = orjson.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    # Their tiers went with the undo (0011 came after): the same figures, as unknown.
    assert after.pop("tiers") == {"unknown": before.pop("tiers")["online"]}
    assert after.pop("size_bytes") > 0 and before.pop("size_bytes") > 0  # (pages rewritten)
    assert after == before
    with sqlite3.connect(db) as conn:
        assert_kept_equal_scan(conn)
    conn.close()

    async def recent() -> tuple[int, int]:
        async with await JobStore.open(db, readonly=True) as store:
            now = time.time()
            ((plain,),) = await store._db.execute_fetchall(
                "SELECT count(*) FROM jobs WHERE state = ? AND finished_at > ?", (DONE, now - 60)
            )
            return (await store.stats(now=now)).done_recent, plain

    kept, plain = asyncio.run(recent())
    assert kept == plain and 0 < plain < before["counts"]["done"]


@pytest.mark.slow  # real aiq runs, killed
def test_kept_counts_equal_a_scan_after_kill_9_and_resume(tmp_path: Path) -> None:
    prompts = [(f"c{i}", f"crash prompt {i}" + " CUT_OFF" * (i % 7 == 0)) for i in range(300)]
    write_prompts(tmp_path / "k.jsonl", prompts)
    (tmp_path / "aiq.yaml").write_text(FAST_RETRIES)
    db = tmp_path / ".aiq" / "aiq.db"
    rng = random.Random(99)
    kills = 0
    with FakeServer(latency_s=0.02, transient_rate=0.2, reject_rate=0.1, seed=3) as server:
        args = ["--base-url", server.base_url, "--concurrency", "8", "--max-attempts", "3"]
        for i in range(3):
            command = ("run", "k.jsonl", "--model", "m") if i == 0 else ("resume",)
            proc = start_aiq(*command, *args, cwd=tmp_path)
            # Killed mid-run: once some more requests have gone out, at a random count.
            until = len(server.requests) + rng.randint(5, 40)
            deadline = time.monotonic() + 20
            while len(server.requests) < until and proc.poll() is None:
                assert time.monotonic() < deadline, "the run sent nothing"
                time.sleep(0.005)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait(timeout=30)
            with sqlite3.connect(db) as conn:  # as the kill left it, running jobs and all
                assert_kept_equal_scan(conn)
            conn.close()
        final = run_aiq("resume", *args, cwd=tmp_path)
        assert final.returncode in (0, 1), final.stderr  # 1: some jobs dead
    assert kills >= 2
    with sqlite3.connect(db) as conn:
        assert_kept_equal_scan(conn)
        (running,) = conn.execute("SELECT count(*) FROM jobs WHERE state = 1").fetchone()
        assert running == 0
    conn.close()


def test_status_reads_no_scan_of_the_jobs_table(tmp_path: Path) -> None:
    """Every statement stats() runs is planned as a search of an index or the tallies."""
    write_prompts(tmp_path / "p.jsonl", [(f"c{i}", f"p{i}") for i in range(50)])

    async def scenario() -> list[str]:
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            source = await store.add_source(str(tmp_path / "p.jsonl"), out_path="o", dead_path="d")
            await add_file(store, source, read_requests(tmp_path / "p.jsonl", Defaults(model="m")))
            (job, *_) = await store.claim(5, now=NOW)
            await store.record([Outcome(job.id, DONE, 1, started_at=NOW, finished_at=NOW)])
            statements: list[str] = []
            await store._db.set_trace_callback(statements.append)
            await store.stats(now=NOW)
            await store._db.set_trace_callback(None)  # type: ignore[arg-type]  # (typeshed: None clears it)
            plans = []
            for sql in statements:
                rows = await store._db.execute_fetchall(f"EXPLAIN QUERY PLAN {sql}")
                plans += [r[3] for r in rows]
            return plans

    plans = asyncio.run(scenario())
    on_jobs = [p for p in plans if " jobs " in f"{p} "]
    assert len(on_jobs) == 4, plans  # running, recent, not due, oldest queued
    assert all(p.startswith("SEARCH jobs USING ") for p in on_jobs), on_jobs


def test_stats_read_one_moment_of_the_store_while_a_run_commits(tmp_path: Path) -> None:
    """The tallies and the index ranges are read in one snapshot: a commit between two of
    the reads cannot make queued = tally - running go wrong."""
    path = tmp_path / "p.jsonl"
    write_prompts(path, [(f"c{i}", f"p{i}") for i in range(10)])

    async def scenario() -> None:
        async with await JobStore.open(tmp_path / "aiq.db") as writer:
            source = await writer.add_source(str(path), out_path="o", dead_path="d")
            await add_file(writer, source, read_requests(path, Defaults(model="m")))
            async with await JobStore.open(tmp_path / "aiq.db", readonly=True) as reader:
                async with reader.snapshot():
                    first = await reader.stats(now=NOW)
                    (job, *_) = await writer.claim(3, now=NOW)
                    await writer.record([Outcome(job.id, DONE, 1, started_at=NOW)])
                    assert await reader.stats(now=NOW) == first
                after = await reader.stats(now=NOW)
                assert after.counts == {"queued": 7, "running": 2, "done": 1, "dead": 0}
                assert first.counts["queued"] == 10

    asyncio.run(scenario())
