"""Adding lines to the store (`aiq add`): read and prepared in a thread, written in large
batches (aiq.bulk), and, for a file read again, resumed after the prefix an earlier add went
through.

The path runs one way: the runner hands this module a reader (``requestfile.RequestFile``)
or plain lines, and it writes them through the store's connection. The store knows nothing
of files; the resume-after-prefix policy lives here, beside the ``prefixes`` table it keeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import aiosqlite
import orjson

from . import bulk, tallies
from .database import count_change, rollback
from .inputs import KEEP_BAD_LINES, BadLine, Request, count_defaults
from .records import DEAD, DONE, QUEUED, RUNNING, EnqueueCounts, Source
from .requestfile import Prefix, RequestFile
from .store import JobStore


async def add_file(
    store: JobStore, source: Source, reader: RequestFile, *, now: float | None = None
) -> EnqueueCounts:
    """Add a file's valid requests (idempotent) and count its invalid lines, in batched
    transactions.

    The lines an earlier complete add of this source went through are skipped when the file
    still starts with the same bytes and is read with the same defaults: they count as known
    (their invalid lines are reported again), and only the lines after them are read. So
    re-adding a grown file costs only its new lines.
    """
    now = time.time() if now is None else now
    db = store.connection
    repointed_before = await _repointed(db)
    after = await _load_prefix(db, source)
    counts = EnqueueCounts()

    def forget_prefix() -> bool:
        # The stored prefix stays true while only lines after it are written. Any other
        # write must go after it does, or a crash would leave it vouching for old lines.
        return after is not None and reader.skipped is None

    batches = reader.batches(bulk.ENQUEUE_BATCH, after=after)
    await _insert_all(store, source, batches, now, counts, forget_prefix)
    if (skipped := reader.skipped) is not None:
        counts.valid += skipped.valid
        counts.invalid += skipped.invalid
        earlier = [BadLine(reader.name, n, why) for n, why in skipped.bad]
        counts.bad_lines[:] = (earlier + counts.bad_lines)[:KEEP_BAD_LINES]
    read = reader.prefix
    await _finish(
        store, source, counts, repointed_before, None if read is None or read.same(after) else read
    )
    counts.defaults = count_defaults(reader.applied)
    return counts


async def add_lines(
    store: JobStore, source: Source, lines: Iterable[Request | BadLine], *, now: float | None = None
) -> EnqueueCounts:
    """Add requests from anywhere but a file's reader, as ``add_file`` does. No prefix to
    resume after: the stored one is forgotten first, as these lines may re-point its items."""
    now = time.time() if now is None else now
    db = store.connection
    repointed_before = await _repointed(db)
    async with store.transaction():
        await db.execute("DELETE FROM prefixes WHERE source_id = ?", (source.id,))
    counts = EnqueueCounts()
    batches = bulk.chunks(iter(lines), bulk.ENQUEUE_BATCH)
    await _insert_all(store, source, batches, now, counts, lambda: False)
    await _finish(store, source, counts, repointed_before, None)
    return counts


async def _repointed(db: aiosqlite.Connection) -> int:
    """Rows in ``repointed``: a crashed add may have left some, whose jobs are dropped too
    at the end of this one."""
    ((n,),) = await db.execute_fetchall("SELECT count(*) FROM repointed")
    return int(n)


async def _load_prefix(db: aiosqlite.Connection, source: Source) -> Prefix | None:
    """The prefix stored for ``source`` by its last complete add, if any."""
    rows = list(
        await db.execute_fetchall(
            "SELECT size, sha256, lines, valid, bad, ids, rules FROM prefixes WHERE source_id = ?",
            (source.id,),
        )
    )
    if not rows:
        return None
    size, sha256, lines, valid, bad, ids, rules = rows[0]
    stored = orjson.loads(bad)
    if isinstance(stored, list):  # as stores wrote it before KEEP_BAD_LINES: every line
        stored = {"invalid": len(stored), "lines": stored}
    bad_lines = [(n, why) for n, why in stored["lines"]]
    prefix = Prefix(size, sha256, lines, valid, bad_lines, ids, rules, stored["invalid"])
    for bits, n in stored.get("applied", {}).items():
        prefix.applied[int(bits)] = n
    return prefix


async def _finish(
    store: JobStore,
    source: Source,
    counts: EnqueueCounts,
    repointed_before: int,
    prefix: Prefix | None,
) -> None:
    """Drop the jobs re-pointed items left wanted by nobody, keep ``prefix`` (the file's new
    one, if any), and settle the counts, once every line is in."""
    db = store.connection
    async with store.transaction():
        repointed = await _repointed(db)
        if repointed:
            await _drop_orphans(db)
        if prefix is not None:
            await _save_prefix(db, source, prefix)
    counts.changed = repointed - repointed_before
    counts.new -= counts.changed  # the items upsert counted re-pointed rows too
    counts.known = counts.valid - counts.new - counts.changed


async def _save_prefix(db: aiosqlite.Connection, source: Source, p: Prefix) -> None:
    # The defaults its lines took ride in the same JSON (no migration): {bits: lines}.
    applied = {str(bits): n for bits, n in enumerate(p.applied) if n}
    bad = orjson.dumps({"invalid": p.invalid, "lines": p.bad, "applied": applied})
    await db.execute(
        "INSERT OR REPLACE INTO prefixes (source_id, size, sha256, lines, valid, bad, ids, "
        "rules) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (source.id, p.size, p.sha256, p.lines, p.valid, bad, p.ids, p.rules),
    )


async def _drop_orphans(db: aiosqlite.Connection) -> None:
    """Delete jobs that re-pointed items left wanted by nobody, unless they already ran.

    Runs inside the caller's transaction.
    """
    # One scan of items finds which noted jobs are still wanted.
    await db.execute(
        "DELETE FROM jobs WHERE k64 IN (SELECT k64 FROM repointed "
        "  EXCEPT SELECT job_k64 FROM items WHERE job_k64 IN (SELECT k64 FROM repointed)) "
        "AND state IN (?, ?)",
        (QUEUED, DEAD),
    )
    await db.execute("DELETE FROM repointed")


async def _insert_all(
    store: JobStore,
    source: Source,
    batches: Iterator[list[Request | BadLine]],
    now: float,
    counts: EnqueueCounts,
    forget_prefix: Callable[[], bool],
) -> None:
    """Insert every line, read in a thread that keeps a batch or two ahead."""
    db = store.connection
    await db.execute(f"PRAGMA wal_autocheckpoint = {bulk.CHECKPOINT_PAGES}")
    with bulk.interpreter_for_bulk():
        parser = bulk.Parser(batches)
        try:
            await _write_all(db, source, parser, now, counts, forget_prefix)
        finally:
            await parser.close()
            await db.execute("PRAGMA wal_autocheckpoint = 1000")


async def _write_all(
    db: aiosqlite.Connection,
    source: Source,
    parser: bulk.Parser,
    now: float,
    counts: EnqueueCounts,
    forget_prefix: Callable[[], bool],
) -> None:
    """Write the parser's batches, committing every LINES_PER_COMMIT (aiq.bulk) lines."""
    since_commit, before = 0, db.total_changes
    priorities = _Priorities()
    try:
        while (batch := await parser.next()) is not None:
            if not db.in_transaction:
                await db.execute("BEGIN IMMEDIATE")
                before = db.total_changes
                if forget_prefix():
                    await db.execute("DELETE FROM prefixes WHERE source_id = ?", (source.id,))
            await _insert(db, source, batch, now, counts, priorities)
            since_commit += batch.lines
            if since_commit >= bulk.LINES_PER_COMMIT:
                await count_change(db, before)
                await db.execute("COMMIT")
                since_commit = 0
        if db.in_transaction:
            await count_change(db, before)
            await db.execute("COMMIT")
    except BaseException:
        await rollback(db)
        raise


async def _insert(
    db: aiosqlite.Connection,
    source: Source,
    b: bulk.Batch,
    now: float,
    counts: EnqueueCounts,
    priorities: _Priorities,
) -> None:
    """Insert one batch inside the caller's transaction, adding to ``counts``."""
    counts.valid += b.valid
    counts.invalid += len(b.bad)
    if len(counts.bad_lines) < KEEP_BAD_LINES:
        counts.bad_lines.extend(b.bad[: KEEP_BAD_LINES - len(counts.bad_lines)])
    # rowcount excludes rows changed by triggers, unlike total_changes.
    added = await bulk.insert_rows(db, bulk.jobs_sql, now, b.jobs, bulk.JOB_PARAMS)
    if added:  # counted here, once a batch: a trigger a row took twice the inserts' time
        await tallies.add_queued(db, added)
    if added < len(b.jobs) // bulk.JOB_PARAMS:  # requests the store had: a line may raise one
        await priorities.raise_known(db, b.jobs)
    elif added:
        priorities.lower(b.jobs)
    counts.jobs_added += added
    # Inserted plus re-pointed items; _finish takes the re-pointed off.
    counts.new += await bulk.insert_rows(db, bulk.items_sql, source.id, b.items, bulk.ITEM_PARAMS)


class _Priorities:
    """Gives each unfinished request the highest priority a line asks of it: one request
    answers every line that has it, so the most urgent decides. Not the latest: a nightly
    cron re-adding its file at 0 must not demote a request an urgent file shares.

    Only batches holding a known request can raise one (a fresh add pays nothing), and only
    a line above the lowest unfinished priority can: a file read again at the priority it
    had (the usual re-read, at 0) is one look at the index, not a lookup per line.
    """

    def __init__(self) -> None:
        self._floor: int | None = None  # the lowest unfinished priority; raises only lift it

    def lower(self, jobs: list[Any]) -> None:
        """Take in the priorities of a batch's new requests, once the floor is known."""
        if self._floor is not None and jobs:
            self._floor = min(self._floor, min(jobs[4 :: bulk.JOB_PARAMS]))

    async def raise_known(self, db: aiosqlite.Connection, jobs: list[Any]) -> None:
        """Raise the requests of ``jobs`` (a batch's flat rows) that a line asks more of."""
        if self._floor is None:
            ((floor,),) = await db.execute_fetchall(
                # Covered by the (state, next_at, priority) index: no row is read.
                "SELECT min(priority) FROM jobs WHERE state IN (?, ?, ?)",
                (QUEUED, RUNNING, DEAD),
            )
            self._floor = 0 if floor is None else int(floor)
        self.lower(jobs)  # the batch's own new requests, inserted first
        if max(jobs[4 :: bulk.JOB_PARAMS]) <= self._floor:
            return
        rows = [(jobs[i + 4], jobs[i], DONE) for i in range(0, len(jobs), bulk.JOB_PARAMS)]
        await db.executemany(
            "UPDATE jobs SET priority = ?1 WHERE k64 = ?2 AND priority < ?1 AND state != ?3",
            rows,
        )
