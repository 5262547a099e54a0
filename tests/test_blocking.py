"""The store's coroutines run without an event loop (aiq.blocking), as `aiq status` reads it:
the same Stats as over aiosqlite from a store holding every state and a batch, the same
errors from a store it cannot read, and a coroutine that would suspend refused."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import orjson
import pytest

from aiq import blocking
from aiq.batch_files import LINE_OVERHEAD
from aiq.config import Config
from aiq.database import StoreOutdated
from aiq.errors import StoreError
from aiq.records import DEAD, DONE, QUEUED, Outcome
from aiq.runner import add_file
from aiq.stats import Stats
from aiq.store import JobStore, open_store
from aiq.store_commands import store_status, store_status_now
from aiq.usage import Usage

NOW = 2_000_000.0


def _store(tmp_path: Path) -> Path:
    """A store with done, dead, retried, running and queued jobs, and one planned batch."""
    path = tmp_path / "in.jsonl"
    lines = [{"custom_id": f"q{i}", "prompt": f"p{i}", "model": "m" if i % 2 else "n"}
             for i in range(12)]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    db = tmp_path / "aiq.db"
    asyncio.run(add_file(Config(db=db), path))

    async def work() -> None:
        async with open_store(db) as store:
            jobs = await store.claim(8, now=NOW)
            await store.record([], sent=[j.id for j in jobs[:7]])
            await store.record([
                Outcome(jobs[0].id, DONE, 1, started_at=NOW - 5, finished_at=NOW - 4,
                        usage=Usage(10, 3, cached=2), model="m", cost_usd=0.002,
                        response=b"{}"),
                Outcome(jobs[1].id, DONE, 1, started_at=NOW - 5, finished_at=NOW - 1,
                        usage=None, model="n", response=b"{}"),
                Outcome(jobs[2].id, DEAD, 3, started_at=NOW - 9, finished_at=NOW - 2,
                        error_type="server", error_message="500"),
                Outcome(jobs[3].id, QUEUED, 1, started_at=NOW - 3, next_at=NOW + 30,
                        error_type="timeout", error_message="slow"),
            ])  # fmt: skip
            planned = await store.plan_batch(
                "openai", now=NOW, max_requests=3, max_bytes=10**6, overhead=LINE_OVERHEAD
            )
            assert planned is not None

    asyncio.run(work())
    return db


def test_stats_without_a_loop_are_the_stats_over_aiosqlite(tmp_path: Path) -> None:
    db = _store(tmp_path)

    async def over_aiosqlite() -> Stats:
        async with open_store(db, readonly=True) as store:
            return await store.stats(now=NOW, since=NOW - 20)

    async def in_this_thread() -> Stats:
        async with open_store(db, readonly=True, blocking=True) as store:
            return await store.stats(now=NOW, since=NOW - 20)

    want = asyncio.run(over_aiosqlite())
    got = blocking.run(in_this_thread())
    assert got == want
    assert got.counts == {"queued": 3, "running": 6, "done": 2, "dead": 1}  # 2 in the batch
    assert got.batches and got.in_batches == 2 and got.models  # the batch and model reads ran
    # and the command's whole answer, the lock's run state and the file's size included
    cfg = Config(db=db)
    now, then = store_status_now(cfg), asyncio.run(store_status(cfg))
    assert (now.run, now.size_bytes, now.counts) == (then.run, then.size_bytes, then.counts)


def test_a_store_it_cannot_read_fails_as_over_aiosqlite(tmp_path: Path) -> None:
    bad = tmp_path / "not.db"
    bad.write_bytes(b"this is not an SQLite file" * 100)
    with pytest.raises(StoreError, match="not an aiq store") as over_loop:
        asyncio.run(JobStore.open(bad, readonly=True))
    with pytest.raises(StoreError, match="not an aiq store") as here:
        blocking.run(JobStore.open(bad, readonly=True, blocking=True))
    assert str(here.value) == str(over_loop.value)
    with pytest.raises(StoreError, match="no store here yet"):
        store_status_now(Config(db=tmp_path / "missing.db"))
    # An older store: a reader applies no migration, and says what will.
    db = _store(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM migrations WHERE name = (SELECT max(name) FROM migrations)")
    with pytest.raises(StoreOutdated, match="run any writing aiq command"):
        store_status_now(Config(db=db))


def test_a_coroutine_that_would_suspend_is_refused_and_closed() -> None:
    reached = []

    async def sleeps() -> None:
        try:
            await asyncio.sleep(0)
        finally:
            reached.append("finally")

    with pytest.raises(RuntimeError, match="needs an event loop"):
        blocking.run(sleeps())
    assert reached == ["finally"]  # closed, not left pending

    async def plain() -> int:
        return 7

    assert blocking.run(plain()) == 7
