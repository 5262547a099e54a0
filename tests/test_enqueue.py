"""aiq.enqueue against a real SQLite file: idempotence, growth, re-pointing, sharing, and
the prefix a later add skips."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiq import bulk
from aiq.contract import JobState
from aiq.enqueue import add_file, add_lines
from aiq.inputs import BadLine, Defaults, Request
from aiq.records import DEAD, DONE, QUEUED, EnqueueCounts, Outcome, k64
from aiq.requestfile import read_requests
from aiq.store import JobStore

M = Defaults(model="m")


def line(custom_id: str | None, prompt: str, **fields: Any) -> str:
    obj = {"prompt": prompt, **fields}
    if custom_id is not None:
        obj = {"custom_id": custom_id, **obj}
    return json.dumps(obj)


def write(path: Path, *lines: str, mode: str = "w") -> Path:
    with path.open(mode) as f:
        f.writelines(x + "\n" for x in lines)
    return path


def add(db: Path, path: Path, defaults: Defaults = M) -> EnqueueCounts:
    return asyncio.run(_add(db, path, defaults))


async def _add(db: Path, path: Path, defaults: Defaults) -> EnqueueCounts:
    async with await JobStore.open(db) as store:
        source = await store.add_source(str(path), out_path="o", dead_path="d")
        return await add_file(store, source, read_requests(path, defaults))


def query(db: Path, sql: str, *params: Any) -> list[tuple]:
    async def run() -> list[tuple]:
        async with await JobStore.open(db) as store:
            return [tuple(r) for r in await store._db.execute_fetchall(sql, params)]

    return asyncio.run(run())


def counts(c: EnqueueCounts) -> tuple[int, int, int, int, int]:
    return c.new, c.known, c.changed, c.invalid, c.jobs_added


def items(db: Path) -> dict[str, str]:
    """custom_id -> the prompt its job sends."""
    rows = query(db, "SELECT i.custom_id, j.body FROM items i JOIN jobs j ON j.k64 = i.job_k64")
    return {cid: json.loads(body)["messages"][-1]["content"] for cid, body in rows}


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several batches, statements and commits even for a few dozen lines."""
    monkeypatch.setattr(bulk, "ENQUEUE_BATCH", 7)
    monkeypatch.setattr(bulk, "ROWS_PER_INSERT", 3)
    monkeypatch.setattr(bulk, "LINES_PER_COMMIT", 10)


def test_first_add_counts_and_stores(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", line("a", "1"), "oops", line("b", "2"), line(None, "3"))
    c = add(tmp_path / "db", src)
    assert counts(c) == (3, 0, 0, 1, 3)
    assert [str(b) for b in c.bad_lines] == [f"{src}:2: " + c.bad_lines[0].reason]
    assert query(tmp_path / "db", "SELECT count(*), min(state), max(state) FROM jobs") == [
        (3, QUEUED, QUEUED)
    ]
    rows = query(tmp_path / "db", "SELECT typeof(key), typeof(body), length(key) FROM jobs")
    assert set(rows) == {("blob", "blob", 32)}
    (req,) = [r for r in read_requests(src, M) if isinstance(r, Request) and r.custom_id == "a"]
    assert query(tmp_path / "db", "SELECT line, line_no FROM items WHERE custom_id = 'a'") == [
        (req.line, 1)
    ]
    assert query(tmp_path / "db", "SELECT key, body FROM jobs WHERE k64 = ?", k64(req.key)) == [
        (req.key, req.body)
    ]


def test_readding_adds_nothing(tmp_path: Path, small_batches: None) -> None:
    src = write(tmp_path / "in.jsonl", *(line(f"c{i}", str(i)) for i in range(40)), "bad")
    db = tmp_path / "db"
    assert counts(add(db, src)) == (40, 0, 0, 1, 40)
    before = query(db, "SELECT count(*) FROM jobs UNION ALL SELECT count(*) FROM items")
    again = add(db, src)
    assert counts(again) == (0, 40, 0, 1, 0)
    assert [b.line_no for b in again.bad_lines] == [41]  # still reported
    assert query(db, "SELECT count(*) FROM jobs UNION ALL SELECT count(*) FROM items") == before


def test_readding_reads_nothing_when_unchanged(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", line("a", "1"), line("b", "2"))
    db = tmp_path / "db"
    add(db, src)
    reader = read_requests(src, M)

    async def run() -> EnqueueCounts:
        async with await JobStore.open(db) as store:
            source = await store.add_source(str(src), out_path="o", dead_path="d")
            return await add_file(store, source, reader)

    c = asyncio.run(run())
    assert reader.skipped is not None and reader.skipped.lines == 2
    assert counts(c) == (0, 2, 0, 0, 0)


def test_grown_file_adds_only_new_lines(tmp_path: Path, small_batches: None) -> None:
    src = write(tmp_path / "in.jsonl", *(line(f"c{i}", str(i)) for i in range(30)))
    db = tmp_path / "db"
    add(db, src)
    write(src, *(line(f"c{i}", str(i)) for i in range(30, 45)), line("c3", "dup"), mode="a")
    c = add(db, src)
    assert counts(c) == (15, 30, 0, 1, 15)
    assert "custom_id 'c3' appears twice" in c.bad_lines[0].reason
    assert c.bad_lines[0].line_no == 46
    assert items(db)["c3"] == "3"
    assert query(db, "SELECT count(*) FROM items") == [(45,)]


def test_jobs_keep_input_order(tmp_path: Path, small_batches: None) -> None:
    src = write(tmp_path / "in.jsonl", *(line(f"c{i}", str(i)) for i in range(25)))
    add(tmp_path / "db", src)
    rows = query(tmp_path / "db", "SELECT body FROM jobs ORDER BY id")
    assert [json.loads(b)["messages"][0]["content"] for (b,) in rows] == [str(i) for i in range(25)]


def test_changed_line_repoints_and_drops_the_orphan(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", line("a", "old"), line("b", "same"))
    db = tmp_path / "db"
    add(db, src)
    write(src, line("a", "new"), line("b", "same"))
    c = add(db, src)
    assert counts(c) == (0, 1, 1, 0, 1)
    assert items(db) == {"a": "new", "b": "same"}
    bodies = [
        json.loads(b)["messages"][0]["content"] for (b,) in query(db, "SELECT body FROM jobs")
    ]
    assert sorted(bodies) == ["new", "same"]  # the queued "old" job was wanted by nobody
    assert query(db, "SELECT count(*) FROM repointed") == [(0,)]


def test_repointed_job_still_wanted_elsewhere_is_kept(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", line("a", "x"), line("b", "x"))
    db = tmp_path / "db"
    assert counts(add(db, src)) == (2, 0, 0, 0, 1)  # two custom_ids, one request
    write(src, line("a", "y"), line("b", "x"))
    assert counts(add(db, src)) == (0, 1, 1, 0, 1)
    assert items(db) == {"a": "y", "b": "x"}
    assert query(db, "SELECT count(*) FROM jobs") == [(2,)]


@pytest.mark.parametrize("state", [DONE, DEAD])
def test_an_orphan_that_ran_is_kept_only_if_done(tmp_path: Path, state: JobState) -> None:
    src = write(tmp_path / "in.jsonl", line("a", "old"))
    db = tmp_path / "db"
    add(db, src)

    async def finish() -> None:
        async with await JobStore.open(db) as store:
            (job,) = await store.claim(1, now=1e12)
            await store.record([Outcome(job.id, state, 1, started_at=1.0, finished_at=2.0)])

    asyncio.run(finish())
    write(src, line("a", "new"))
    add(db, src)
    left = [json.loads(b)["messages"][0]["content"] for (b,) in query(db, "SELECT body FROM jobs")]
    # A done job holds a paid-for result; a dead one is dropped like a queued one.
    assert sorted(left) == (["new", "old"] if state == DONE else ["new"])


def test_same_body_under_two_custom_ids_shares_one_job(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", line("a", "x"), line("b", "x"), line(None, "x"))
    db = tmp_path / "db"
    c = add(db, src)
    assert (c.new, c.jobs_added) == (3, 1)
    assert query(db, "SELECT count(DISTINCT job_k64), count(*) FROM items") == [(1, 3)]

    async def export() -> list[str]:
        async with await JobStore.open(db) as store:
            (source,) = await store.sources()
            batches = store.result_rows(source, state=QUEUED, order="input")
            return [r[0] async for rows in batches for r in rows]

    assert sorted(asyncio.run(export()))[:2] == ["a", "b"]


def test_an_edited_middle_reads_the_whole_file(tmp_path: Path, small_batches: None) -> None:
    lines = [line(f"c{i}", str(i)) for i in range(20)]
    src = write(tmp_path / "in.jsonl", *lines)
    db = tmp_path / "db"
    add(db, src)
    lines[5] = line("c5", "five")
    write(src, *lines, line("c20", "20"))
    assert counts(add(db, src)) == (1, 19, 1, 0, 2)
    assert items(db)["c5"] == "five"


def test_other_defaults_read_the_whole_file(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", line("a", "1"), line("b", "2", model="fixed"))
    db = tmp_path / "db"
    add(db, src)
    assert counts(add(db, src, Defaults(model="other"))) == (0, 1, 1, 0, 1)


def test_a_plain_iterable_forgets_the_stored_prefix(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", line("a", "1"))
    db = tmp_path / "db"
    add(db, src)
    (req,) = read_requests(src, Defaults(model="m2"))

    async def enqueue_list() -> EnqueueCounts:
        async with await JobStore.open(db) as store:
            (source,) = await store.sources()
            return await add_lines(store, source, [req])

    assert counts(asyncio.run(enqueue_list())) == (0, 0, 1, 0, 1)  # "a" now asks model m2
    assert query(db, "SELECT count(*) FROM prefixes") == [(0,)]
    assert counts(add(db, src)) == (0, 0, 1, 0, 1)  # read in full: "a" is re-pointed back


def test_a_failed_add_leaves_no_prefix_and_can_be_redone(
    tmp_path: Path, small_batches: None
) -> None:
    src = write(tmp_path / "in.jsonl", *(line(f"c{i}", str(i)) for i in range(30)))
    db = tmp_path / "db"

    def failing() -> Iterator[Request | BadLine]:
        for i, req in enumerate(read_requests(src, M)):
            if i == 25:
                raise RuntimeError("disk on fire")
            yield req

    async def run() -> None:
        async with await JobStore.open(db) as store:
            source = await store.add_source(str(src), out_path="o", dead_path="d")
            await add_lines(store, source, failing())

    with pytest.raises(RuntimeError, match="disk on fire"):
        asyncio.run(run())
    committed = query(db, "SELECT count(*) FROM items")[0][0]
    assert committed < 25 and query(db, "SELECT count(*) FROM prefixes") == [(0,)]
    c = add(db, src)
    assert (c.new, c.known, c.jobs_added) == (30 - committed, committed, 30 - committed)
    assert query(db, "SELECT count(*) FROM jobs") == [(30,)]


def test_interpreter_settings_come_back_after_an_add(tmp_path: Path, small_batches: None) -> None:
    # A bulk add pauses the GC and shortens the GIL switch interval, process-wide.
    src = write(tmp_path / "in.jsonl", *(line(f"c{i}", str(i)) for i in range(30)))
    before = (gc.isenabled(), sys.getswitchinterval())

    def failing() -> Iterator[Request | BadLine]:
        yield from list(read_requests(src, M))[:12]
        raise RuntimeError("stop")

    async def run() -> None:
        async with await JobStore.open(tmp_path / "db") as store:
            source = await store.add_source(str(src), out_path="o", dead_path="d")
            with pytest.raises(RuntimeError):
                await add_lines(store, source, failing())
            assert (gc.isenabled(), sys.getswitchinterval()) == before
            await add_file(store, source, read_requests(src, M))

    asyncio.run(run())
    assert (gc.isenabled(), sys.getswitchinterval()) == before


def test_bad_lines_of_a_skipped_prefix_are_reported_again(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", "not json", line("a", "1"))
    db = tmp_path / "db"
    add(db, src)
    write(src, "[]", mode="a")
    c = add(db, src)
    assert [(b.line_no, b.path) for b in c.bad_lines] == [(1, str(src)), (3, str(src))]
    assert counts(c) == (0, 1, 0, 2, 0)


def test_an_unterminated_last_line_is_read_again(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(line("a", "1") + "\n" + line("b", "2"))
    db = tmp_path / "db"
    assert counts(add(db, src)) == (2, 0, 0, 0, 2)
    with src.open("a") as f:
        f.write("\n" + line("c", "3") + "\n")
    assert counts(add(db, src)) == (1, 2, 0, 0, 1)


def test_two_sources_keep_their_own_custom_ids(tmp_path: Path) -> None:
    one = write(tmp_path / "one.jsonl", line("a", "1"))
    two = write(tmp_path / "two.jsonl", line("a", "2"))
    db = tmp_path / "db"
    add(db, one)
    assert counts(add(db, two)) == (1, 0, 0, 0, 1)
    assert query(db, "SELECT count(*) FROM items") == [(2,)]


def test_the_change_count_moves_with_every_change_and_only_then(tmp_path: Path) -> None:
    """What lets a run skip rewriting outputs that are current (outputs.export_source)."""
    path = write(tmp_path / "p.jsonl", line("a", "x"), line("b", "y"))

    async def scenario() -> list[int]:
        seen = []
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            seen.append(await store.changes())
            source = await store.add_source(str(path), out_path="o", dead_path="d")
            await add_file(store, source, read_requests(path, M))
            seen.append(await store.changes())
            # The same again: the same paths, no new line, nothing due: no change at all.
            source = await store.add_source(str(path), out_path="o", dead_path="d")
            await add_file(store, source, read_requests(path, M))
            await store.recover_running(5)
            await store.undefer()
            assert await store.claim(10, now=-1.0) == []  # none due yet: claims nothing
            await store.save_export_stamp(source, {"any": "thing"})
            seen.append(await store.changes())
            assert await store.export_stamp(source) == {"any": "thing"}
            (job, _) = await store.claim(10, now=1e12)
            await store.record([Outcome(job.id, DONE, 1, started_at=1.0, response=b"{}")])
            seen.append(await store.changes())
        return seen

    first, added, unchanged, recorded = asyncio.run(scenario())
    assert added > first  # (creating the store counted its migrations)
    assert unchanged == added
    assert recorded > unchanged
