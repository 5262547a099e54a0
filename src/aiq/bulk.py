"""The bulk machinery under `aiq add` (aiq.enqueue): lines read and prepared in a thread,
a few batches ahead, and written as multi-row INSERTs, with the interpreter set for it.
Knows SQL's shape for the jobs and items tables, nothing of sources, prefixes or counts.
"""

from __future__ import annotations

import asyncio
import gc
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, islice
from operator import itemgetter
from typing import Any

import aiosqlite

from .inputs import BadLine, Request

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


async def insert_rows(
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
