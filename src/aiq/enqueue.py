"""Adding lines to the store (`aiq add`): read and prepared in a thread, written in large
batches, and, for a file read again, resumed after the prefix an earlier add went through.

The path runs one way: the runner hands this module a reader (``requestfile.RequestFile``)
or plain lines, and it writes them through the store's connection. The store knows nothing
of files; the resume-after-prefix policy lives here, beside the ``prefixes`` table it keeps.
"""

from __future__ import annotations

import asyncio
import gc
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, islice
from operator import itemgetter
from typing import Any

import aiosqlite
import orjson

from . import tallies
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

    batches = reader.batches(ENQUEUE_BATCH, after=after)
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
    batches = chunks(iter(lines), ENQUEUE_BATCH)
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
    await db.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_PAGES}")
    with interpreter_for_bulk():
        parser = Parser(batches)
        try:
            await _write_all(db, source, parser, now, counts, forget_prefix)
        finally:
            await parser.close()
            await db.execute("PRAGMA wal_autocheckpoint = 1000")


async def _write_all(
    db: aiosqlite.Connection,
    source: Source,
    parser: Parser,
    now: float,
    counts: EnqueueCounts,
    forget_prefix: Callable[[], bool],
) -> None:
    """Write the parser's batches, committing every LINES_PER_COMMIT lines."""
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
            if since_commit >= LINES_PER_COMMIT:
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
    b: Batch,
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
    added = await _insert_rows(db, jobs_sql, now, b.jobs, JOB_PARAMS)
    if added:  # counted here, once a batch: a trigger a row took twice the inserts' time
        await tallies.add_queued(db, added)
    if added < len(b.jobs) // JOB_PARAMS:  # requests the store had: a line may raise one
        await priorities.raise_known(db, b.jobs)
    elif added:
        priorities.lower(b.jobs)
    counts.jobs_added += added
    # Inserted plus re-pointed items; _finish takes the re-pointed off.
    counts.new += await _insert_rows(db, items_sql, source.id, b.items, ITEM_PARAMS)


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
            self._floor = min(self._floor, min(jobs[4::JOB_PARAMS]))

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
        if max(jobs[4::JOB_PARAMS]) <= self._floor:
            return
        rows = [(jobs[i + 4], jobs[i], DONE) for i in range(0, len(jobs), JOB_PARAMS)]
        await db.executemany(
            "UPDATE jobs SET priority = ?1 WHERE k64 = ?2 AND priority < ?1 AND state != ?3",
            rows,
        )


async def _insert_rows(
    db: aiosqlite.Connection, sql: Callable[[int], str], shared: Any, flat: list[Any], width: int
) -> int:
    """Run ``sql(n)`` over ``flat`` (``width`` values a row), ROWS_PER_INSERT rows a
    statement; returns the rows changed. The full-size statements go in one executemany:
    each round trip through the event loop waits for the parsing thread to yield the GIL.
    """
    step = ROWS_PER_INSERT * width
    full = len(flat) // step * step
    changed = 0
    if full:
        params = [[shared, *flat[i : i + step]] for i in range(0, full, step)]
        changed += (await db.executemany(sql(ROWS_PER_INSERT), params)).rowcount
    if full < len(flat):
        rest = [shared, *flat[full:]]
        changed += (await db.execute(sql((len(flat) - full) // width), rest)).rowcount
    return changed


# -- the bulk machinery ------------------------------------------------------------------

_K64 = struct.Struct(">q")

# `add` (bench/README.md has the figures behind these numbers):
# - A thread reads and prepares ENQUEUE_BATCH lines at a time, up to PARSE_AHEAD batches
#   ahead of the writer. Batches bound the memory in flight (~0.6 KB a line).
# - One multi-row INSERT per ROWS_PER_INSERT lines: SQLite runs a whole statement without
#   the GIL, where executemany took it back for every row.
# - A transaction spans LINES_PER_COMMIT lines. The unique indexes take random inserts, so
#   each commit rewrites most of their pages: committing every 20,000 lines cost as much as
#   the inserts themselves.
# - Checkpoints (each copies the WAL back and fsyncs twice) wait for CHECKPOINT_PAGES
#   pages (160 MB) of WAL: 20,000 took 0.6 s more of a 9.5 s add of a million lines.
ENQUEUE_BATCH = 10_000
ROWS_PER_INSERT = 5_000  # 5 parameters a row, 1 shared: SQLite allows 32,766 (>= 3.32)
LINES_PER_COMMIT = 100_000
PARSE_AHEAD = 2
CHECKPOINT_PAGES = 40_000

JOB_PARAMS = 5  # k64, key, endpoint, body, priority (created_at is one shared parameter)
ITEM_PARAMS = 5  # ck, custom_id, job_k64, line_no, line (source_id is shared)


@dataclass(slots=True)
class Batch:
    """Up to ENQUEUE_BATCH lines as flat parameter lists for the multi-row INSERTs."""

    lines: int
    valid: int
    jobs: list[Any]
    items: list[Any]
    bad: list[BadLine]


def chunks(lines: Iterator[Request | BadLine], size: int) -> Iterator[list[Request | BadLine]]:
    while chunk := list(islice(lines, size)):
        yield chunk


def prepare(lines: list[Request | BadLine] | None) -> Batch | None:
    """A batch of lines as parameters for the INSERTs (None stays None); runs in the parser."""
    if lines is None:
        return None
    jobs: list[Any] = []
    items: list[tuple[int, str, int, int, bytearray]] = []
    bad: list[BadLine] = []
    for req in lines:
        if isinstance(req, BadLine):
            bad.append(req)
            continue
        line_no, custom_id, endpoint, body, key, line, _derived, ck, _applied, priority = req
        jk = _K64.unpack_from(key)[0]  # k64(key), inlined: hot path
        # bytearray, not bytes: sqlite3 binds it directly, while a bytes parameter goes
        # through its adapter lookup first (~640 ns against ~95, three times a line, in the
        # thread that holds the GIL to bind). Still stored and read back as a BLOB.
        jobs += (jk, bytearray(key), endpoint, bytearray(body), priority)
        items.append((ck, custom_id, jk, line_no, bytearray(line)))
    # In key order, inserts into the items' unique index land on neighbouring pages: a
    # third less time for them. The sort is stable, so a custom_id given twice keeps its
    # input order and the later line wins. Jobs keep input order: their ids are claim order.
    items.sort(key=itemgetter(0))
    flat = list(chain.from_iterable(items))
    return Batch(len(lines), len(items), jobs, flat, bad)


@contextmanager
def interpreter_for_bulk() -> Iterator[None]:
    """Interpreter settings for the length of a bulk add; process-wide, so restored after.

    - The cyclic GC is paused: an add makes millions of containers but no cycles, and the
      collector kept walking the batches in flight (7-13% of the parsing time).
    - The GIL switch interval goes from 5 ms to 1 ms: the writing thread needs the GIL back
      after each statement and each aiosqlite call, and waited up to a whole interval every
      time while the parser held it (1 s of 11).
    """
    gc_enabled, interval = gc.isenabled(), sys.getswitchinterval()
    gc.disable()
    sys.setswitchinterval(min(interval, 0.001))
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        if gc_enabled:
            gc.enable()


class Parser:
    """Reads and prepares batches in its own thread, up to PARSE_AHEAD batches ahead.

    Parsing and writing each go at their own pace. In lockstep rounds (parse one batch while
    writing the previous) every round lasted as long as the slower of the two: 2 s of 12.
    """

    def __init__(self, batches: Iterator[list[Request | BadLine]]) -> None:
        self._batches = batches
        self._loop = asyncio.get_running_loop()
        self._ready: asyncio.Queue[Batch | BaseException | None] = asyncio.Queue()
        self._room = threading.Semaphore(PARSE_AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aiq-parse", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._room.acquire() and not self._stop.is_set():
                batch = prepare(next(self._batches, None))
                self._loop.call_soon_threadsafe(self._ready.put_nowait, batch)
                if batch is None:
                    return
        except BaseException as exc:  # handed to the writer, which raises it
            self._loop.call_soon_threadsafe(self._ready.put_nowait, exc)

    async def next(self) -> Batch | None:
        """The next batch, or None at the end; raises what parsing raised."""
        item = await self._ready.get()
        if isinstance(item, BaseException):
            raise item
        self._room.release()
        return item

    async def close(self) -> None:
        """Stop parsing (it may be ahead of a writer that failed) and wait for the thread."""
        self._stop.set()
        self._room.release()
        await asyncio.to_thread(self._thread.join)


@lru_cache(maxsize=4)
def jobs_sql(rows: int) -> str:
    values = ", ".join(["(?1, ?, ?, ?, ?, ?)"] * rows)
    return (
        f"INSERT INTO jobs (created_at, k64, key, endpoint, body, priority) VALUES {values} "
        "ON CONFLICT (k64) DO NOTHING"
    )


@lru_cache(maxsize=4)
def items_sql(rows: int) -> str:
    values = ", ".join(["(?1, ?, ?, ?, ?, ?)"] * rows)
    return (
        f"INSERT INTO items (source_id, ck, custom_id, job_k64, line_no, line) VALUES {values} "
        "ON CONFLICT (source_id, ck) DO UPDATE SET job_k64 = excluded.job_k64, "
        "line = excluded.line, line_no = excluded.line_no WHERE job_k64 != excluded.job_k64"
    )
