"""JobStore: the durable queue, one SQLite file in WAL mode over one aiosqlite connection.

The store is the single source of truth; output files are views of it. Writes are batched
(one transaction per batch of lines or outcomes), claims are one atomic ``UPDATE … RETURNING``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiosqlite
import orjson

from . import bulk
from .errors import StoreError
from .inputs import KEEP_BAD_LINES, BadLine, Request, count_defaults, custom_id_hash
from .lock import make_store_dir
from .migrations import MIGRATIONS
from .records import (
    DEAD,
    DONE,
    QUEUED,
    RATE_WINDOW_S,
    RUNNING,
    STATE_NAMES,
    EnqueueCounts,
    Job,
    ModelUsage,
    Outcome,
    Source,
    Stats,
    Target,
)
from .requestfile import Prefix, RequestFile
from .stops import CONTENT_FILTER, TRUNCATED
from .usage import TokenKinds, Usage

_STOPS = (TRUNCATED, CONTENT_FILTER)  # error types of a done job: how its reply stopped short

_PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    # NORMAL in WAL mode survives a process crash (kill -9); only a power cut can lose the
    # last commits, and those jobs are simply sent again.
    "PRAGMA synchronous = NORMAL",
    # 64 MiB holds the unique indexes (~40 MB per million lines) and a transaction of new
    # rows during `add`: at 48 MiB a million-line add took 40% longer, at 96 no less time.
    "PRAGMA cache_size = -65536",
    # Sorts that outgrow the cache (an export orders every result, reply and all) spill to a
    # temporary file, not to memory: with MEMORY an export's peak RSS grew with the results
    # (~0.5 KB each: 222 MB for 200,000), and would not fit for millions.
    "PRAGMA temp_store = FILE",
    "PRAGMA busy_timeout = 10000",
)


# What result_rows can select: a column of the item (its input line) or of its job.
_RESULT_SQL = {
    "custom_id": "i.custom_id",
    "line": "i.line",
    **{
        c: f"j.{c}"
        for c in (
            "id", "k64", "status_code", "request_id", "response", "attempts", "error_type",
            "error_message", "first_attempt_at", "finished_at",
        )
    },
}  # fmt: skip
RESULT_COLUMNS = tuple(_RESULT_SQL)


class StoreOutdated(StoreError):
    """A read-only open found migrations to apply: any writing command applies them."""


class JobStore:
    """The job queue in one SQLite file. Open with ``await JobStore.open(path)``."""

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    # -- opening -------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, readonly: bool = False) -> JobStore:
        """Open (creating and migrating unless ``readonly``) the store at ``path``.

        Raises StoreError, naming the path and what to do, when it cannot be used.
        """
        p = Path(path)
        if p.is_dir():
            raise StoreError(f"{p}: is a directory; pass --db a file path, like {p / 'aiq.db'}")
        if readonly:
            require_store(p)
        if not readonly:
            _create(p)
            return await cls._connect(p, str(p), readonly=False)
        if os.access(p, os.W_OK) and os.access(p.parent, os.W_OK):
            # Read-write, but query_only: SQLite removes the -wal and -shm files when the last
            # connection closes, which a mode=ro connection cannot do (`aiq check` or `status`
            # would leave them behind). Nothing is written: query_only refuses it.
            try:
                return await cls._connect(p, f"file:{quote(str(p))}?mode=rw", readonly=True)
            except StoreOutdated:
                raise
            except StoreError:
                pass  # then as a reader that may not write
        uri = f"file:{quote(str(p))}?mode=ro"
        try:
            return await cls._connect(p, uri, readonly=True)
        except StoreError as exc:
            wal = Path(f"{p}-wal")
            if not isinstance(exc.__cause__, sqlite3.OperationalError) or (
                wal.exists() and wal.stat().st_size
            ):
                raise
        # A store in a directory aiq may not write (a read-only mount, another user's store):
        # WAL mode cannot make its -shm file there. With no -wal to read, the database file
        # is the whole store and nobody can be writing it, so it is read as immutable.
        return await cls._connect(p, uri + "&immutable=1", readonly=True)

    @classmethod
    async def _connect(cls, p: Path, uri: str, *, readonly: bool) -> JobStore:
        try:
            db = await aiosqlite.connect(uri, uri=readonly, isolation_level=None)
        except sqlite3.Error as exc:
            raise store_error(p, exc) from exc
        store = cls(db, p)
        try:
            for pragma in _PRAGMAS[1:] if readonly else _PRAGMAS:
                await db.execute(pragma)
            if readonly:
                await db.execute("PRAGMA query_only = 1")
            # For migrations that rename items (0005_line_ids).
            await db.create_function("aiq_custom_id_hash", 1, custom_id_hash, deterministic=True)
            await store._migrate(readonly=readonly)
        except BaseException as exc:
            with suppress(sqlite3.Error):
                await db.close()
            if isinstance(exc, sqlite3.Error):
                raise store_error(p, exc) from exc
            raise
        return store

    @contextmanager
    def errors(self) -> Iterator[None]:
        """``with store.errors():`` an SQLite error in the body becomes a StoreError that
        names this store and says what to do (a full disk, a read-only directory …)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise store_error(self.path, exc) from exc

    async def _migrate(self, *, readonly: bool) -> None:
        await self._db.execute(
            "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL)"
            if not readonly
            else "SELECT 1"
        )
        rows = await self._db.execute_fetchall("SELECT name FROM migrations")
        applied = {r[0] for r in rows}
        known = {name for name, _ in MIGRATIONS}
        if applied - known:
            raise StoreError(
                f"{self.path}: written by a newer aiq (it knows migration "
                f"{sorted(applied - known)[-1]!r}, this one does not); upgrade aiq "
                "(pip install -U aiq) to use this store, nothing in it was changed"
            )
        pending = [(n, sql) for n, sql in MIGRATIONS if n not in applied]
        if pending and readonly:
            raise StoreOutdated(f"{self.path}: store needs upgrading; run any writing aiq command")
        for name, sql in pending:
            async with self.transaction():
                for statement in _statements(sql):
                    await self._db.execute(statement)
                await self._db.execute(
                    "INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (name, time.time())
                )

    async def close(self) -> None:
        with self.errors():
            await self._db.close()

    async def __aenter__(self) -> JobStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def transaction(self) -> _Transaction:
        """``async with store.transaction():`` — BEGIN IMMEDIATE … COMMIT, or ROLLBACK. One
        that changed any row also counts a change of the store (``changes``)."""
        return _Transaction(self._db)

    # -- what the outputs were written from ------------------------------------------------

    async def changes(self) -> int:
        """How many transactions have changed the store: equal numbers, equal stores."""
        value = await self._meta("changes")
        return 0 if value is None else int(value)

    async def export_stamp(self, source: Source) -> dict[str, Any] | None:
        """What the last run's export of ``source`` wrote (see outputs._stamp), if any."""
        value = await self._meta(f"export:{source.id}")
        return None if value is None else orjson.loads(value)

    async def _meta(self, name: str) -> str | None:
        rows = list(
            await self._db.execute_fetchall("SELECT value FROM meta WHERE name = ?", (name,))
        )
        return rows[0][0] if rows else None

    async def save_export_stamp(self, source: Source, stamp: dict[str, Any]) -> None:
        """Keep ``stamp`` for ``source``; not counted as a change (it describes the files)."""
        async with _Transaction(self._db, count=False):
            await self._db.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
                (f"export:{source.id}", orjson.dumps(stamp).decode()),
            )

    async def meta_values(self, prefix: str) -> dict[str, str]:
        """The ``meta`` rows whose name starts with ``prefix`` (as written, not a pattern)."""
        rows = await self._db.execute_fetchall(
            "SELECT name, value FROM meta WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)
        )
        return {name: value for name, value in rows}

    async def save_meta(self, values: dict[str, str]) -> None:
        """Keep these ``meta`` rows; not a change of the jobs (what aiq learned about them)."""
        async with _Transaction(self._db, count=False):
            await self._db.executemany(
                "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", list(values.items())
            )

    async def done_prompts(
        self, *, since: float, limit: int
    ) -> tuple[list[tuple[str | None, str, bytes, int]], float]:
        """The newest ``limit`` done jobs finished after ``since`` whose reply counted its
        prompt: (model, endpoint, body, tokens_in) each, and when the newest finished."""
        # The newest found first by id and time alone, then their bodies: sorting the rows
        # whole (body and all) took 1.7 s at 300,000 jobs.
        rows = await self._db.execute_fetchall(
            "SELECT model, endpoint, body, tokens_in, finished_at FROM jobs WHERE id IN ("
            "SELECT id FROM jobs WHERE state = ? AND tokens_in > 0 AND finished_at > ? "
            "ORDER BY finished_at DESC LIMIT ?)",
            (DONE, since, limit),
        )
        newest = max((r[4] for r in rows), default=since)
        return [(m, e, bytes(b), t) for m, e, b, t, _ in rows], newest

    # -- where the jobs go ------------------------------------------------------------------

    async def target(self) -> Target | None:
        """Where this store's jobs are sent, as its first run recorded it (None: no run yet,
        or a store from before aiq recorded it)."""
        value = await self._meta("target")
        return None if value is None else Target.from_dict(orjson.loads(value))

    async def save_target(self, target: Target) -> None:
        """Record where the store's jobs go; not a change of its jobs (exports stay current)."""
        async with _Transaction(self._db, count=False):
            await self._db.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES ('target', ?)",
                (orjson.dumps(target.as_dict()).decode(),),
            )

    async def job_counts(self) -> tuple[int, int]:
        """(jobs, jobs not done), counted on the (state, next_at) index."""
        ((total, unfinished),) = await self._db.execute_fetchall(
            "SELECT count(*), count(CASE WHEN state != ? THEN 1 END) FROM jobs INDEXED BY "
            "jobs_state_next",
            (DONE,),
        )
        return total, unfinished

    # -- sources -------------------------------------------------------------------------

    async def add_source(self, path: str, *, out_path: str, dead_path: str) -> Source:
        """Register an input file (or update its output paths); returns it."""
        async with self.transaction():
            await self._db.execute(
                "INSERT INTO sources (path, out_path, dead_path, added_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (path) DO UPDATE SET out_path = excluded.out_path, "
                "dead_path = excluded.dead_path "
                # Unchanged paths change no row: a re-run of the same file changes nothing.
                "WHERE out_path != excluded.out_path OR dead_path != excluded.dead_path",
                (path, out_path, dead_path, time.time()),
            )
        rows = list(
            await self._db.execute_fetchall("SELECT id FROM sources WHERE path = ?", (path,))
        )
        return Source(rows[0][0], path, out_path, dead_path)

    async def sources(self) -> list[Source]:
        rows = await self._db.execute_fetchall(
            "SELECT id, path, out_path, dead_path FROM sources ORDER BY id"
        )
        return [Source(*r) for r in rows]

    # -- enqueue -------------------------------------------------------------------------

    async def enqueue(
        self, source: Source, lines: Iterable[Request | BadLine], *, now: float | None = None
    ) -> EnqueueCounts:
        """Add valid requests (idempotent) and count invalid lines, in batched transactions.

        Given what ``read_requests`` returns, the lines an earlier complete ``enqueue`` of this
        source went through are skipped when the file still starts with the same bytes and
        is read with the same defaults: they count as known (their invalid lines are reported
        again), and only the lines after them are read. So re-adding a grown file costs only
        its new lines.
        """
        now = time.time() if now is None else now
        reader = lines if isinstance(lines, RequestFile) else None
        after, repointed_before = await self._start_enqueue(source, reader is not None)
        if reader is not None:
            batches = reader.batches(bulk.ENQUEUE_BATCH, after=after)
        else:
            batches = bulk.chunks(iter(lines), bulk.ENQUEUE_BATCH)
        counts = EnqueueCounts()

        def prefix_stale() -> bool:
            # The stored prefix stays true while only lines after it are written. Any other
            # write must go after it does, or a crash would leave it vouching for old lines.
            return after is not None and (reader is None or reader.skipped is None)

        await self._insert_all(source, batches, now, counts, forget_prefix=prefix_stale)
        if reader is not None and reader.skipped is not None:
            skipped = reader.skipped
            counts.valid += skipped.valid
            counts.invalid += skipped.invalid
            earlier = [BadLine(reader.name, n, why) for n, why in skipped.bad]
            counts.bad_lines[:] = (earlier + counts.bad_lines)[:KEEP_BAD_LINES]
        async with self.transaction():
            ((repointed,),) = await self._db.execute_fetchall("SELECT count(*) FROM repointed")
            if repointed:
                await self._drop_orphans()
            if reader is not None and reader.prefix is not None and not reader.prefix.same(after):
                await self._save_prefix(source, reader.prefix)
        counts.changed = repointed - repointed_before
        counts.new -= counts.changed  # the items upsert counted re-pointed rows too
        counts.known = counts.valid - counts.new - counts.changed
        if reader is not None:
            counts.defaults = count_defaults(reader.applied)
        return counts

    async def _start_enqueue(self, source: Source, wants_prefix: bool) -> tuple[Prefix | None, int]:
        """(the prefix stored for ``source``, rows in ``repointed``); a crashed add may have
        left rows there, whose jobs are dropped too at the end of this one."""
        db = self._db
        ((repointed,),) = await db.execute_fetchall("SELECT count(*) FROM repointed")
        rows = list(
            await db.execute_fetchall(
                "SELECT size, sha256, lines, valid, bad, ids, rules FROM prefixes "
                "WHERE source_id = ?",
                (source.id,),
            )
        )
        if not rows:
            return None, repointed
        if not wants_prefix:
            async with self.transaction():
                await db.execute("DELETE FROM prefixes WHERE source_id = ?", (source.id,))
            return None, repointed
        size, sha256, lines, valid, bad, ids, rules = rows[0]
        stored = orjson.loads(bad)
        if isinstance(stored, list):  # as stores wrote it before KEEP_BAD_LINES: every line
            stored = {"invalid": len(stored), "lines": stored}
        bad_lines = [(n, why) for n, why in stored["lines"]]
        prefix = Prefix(size, sha256, lines, valid, bad_lines, ids, rules, stored["invalid"])
        for bits, n in stored.get("applied", {}).items():
            prefix.applied[int(bits)] = n
        return prefix, repointed

    async def _save_prefix(self, source: Source, p: Prefix) -> None:
        # The defaults its lines took ride in the same JSON (no migration): {bits: lines}.
        applied = {str(bits): n for bits, n in enumerate(p.applied) if n}
        bad = orjson.dumps({"invalid": p.invalid, "lines": p.bad, "applied": applied})
        await self._db.execute(
            "INSERT OR REPLACE INTO prefixes (source_id, size, sha256, lines, valid, bad, ids, "
            "rules) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (source.id, p.size, p.sha256, p.lines, p.valid, bad, p.ids, p.rules),
        )

    async def _insert_all(
        self,
        source: Source,
        batches: Iterator[list[Request | BadLine]],
        now: float,
        counts: EnqueueCounts,
        *,
        forget_prefix: Callable[[], bool],
    ) -> None:
        """Insert every line, read in a thread that keeps a batch or two ahead."""
        db = self._db
        await db.execute(f"PRAGMA wal_autocheckpoint = {bulk.CHECKPOINT_PAGES}")
        with bulk.interpreter_for_bulk():
            parser = bulk.Parser(batches)
            try:
                await self._write_all(source, parser, now, counts, forget_prefix)
            finally:
                await parser.close()
                await db.execute("PRAGMA wal_autocheckpoint = 1000")

    async def _write_all(
        self,
        source: Source,
        parser: bulk.Parser,
        now: float,
        counts: EnqueueCounts,
        forget_prefix: Callable[[], bool],
    ) -> None:
        """Write the parser's batches, committing every bulk.LINES_PER_COMMIT lines."""
        db = self._db
        since_commit, before = 0, db.total_changes
        try:
            while (batch := await parser.next()) is not None:
                if not db.in_transaction:
                    await db.execute("BEGIN IMMEDIATE")
                    before = db.total_changes
                    if forget_prefix():
                        await db.execute("DELETE FROM prefixes WHERE source_id = ?", (source.id,))
                await self._insert(source, batch, now, counts)
                since_commit += batch.lines
                if since_commit >= bulk.LINES_PER_COMMIT:
                    await _count_change(db, before)
                    await db.execute("COMMIT")
                    since_commit = 0
            if db.in_transaction:
                await _count_change(db, before)
                await db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                # A COMMIT cancelled while it ran may still finish first: nothing to undo then.
                with suppress(sqlite3.OperationalError):
                    await db.execute("ROLLBACK")
            raise

    async def _insert(
        self, source: Source, b: bulk.Batch, now: float, counts: EnqueueCounts
    ) -> None:
        """Insert one batch inside the caller's transaction, adding to ``counts``."""
        counts.valid += b.valid
        counts.invalid += len(b.bad)
        if len(counts.bad_lines) < KEEP_BAD_LINES:
            counts.bad_lines.extend(b.bad[: KEEP_BAD_LINES - len(counts.bad_lines)])
        # rowcount excludes rows changed by triggers, unlike total_changes.
        counts.jobs_added += await self._insert_rows(bulk.jobs_sql, now, b.jobs, bulk.JOB_PARAMS)
        # Inserted plus re-pointed items; enqueue() takes the re-pointed off.
        counts.new += await self._insert_rows(bulk.items_sql, source.id, b.items, bulk.ITEM_PARAMS)

    async def _insert_rows(
        self, sql: Callable[[int], str], shared: Any, flat: list[Any], width: int
    ) -> int:
        """Run ``sql(n)`` over ``flat`` (``width`` values a row), bulk.ROWS_PER_INSERT rows a
        statement; returns the rows changed. The full-size statements go in one executemany:
        each round trip through the event loop waits for the parsing thread to yield the GIL.
        """
        step = bulk.ROWS_PER_INSERT * width
        full = len(flat) // step * step
        changed = 0
        if full:
            params = [[shared, *flat[i : i + step]] for i in range(0, full, step)]
            changed += (await self._db.executemany(sql(bulk.ROWS_PER_INSERT), params)).rowcount
        if full < len(flat):
            rest = [shared, *flat[full:]]
            changed += (await self._db.execute(sql((len(flat) - full) // width), rest)).rowcount
        return changed

    async def _drop_orphans(self) -> None:
        """Delete jobs that re-pointed items left wanted by nobody, unless they already ran.

        Runs inside the caller's transaction.
        """
        # One scan of items finds which noted jobs are still wanted.
        await self._db.execute(
            "DELETE FROM jobs WHERE k64 IN (SELECT k64 FROM repointed "
            "  EXCEPT SELECT job_k64 FROM items WHERE job_k64 IN (SELECT k64 FROM repointed)) "
            "AND state IN (?, ?)",
            (QUEUED, DEAD),
        )
        await self._db.execute("DELETE FROM repointed")

    # -- the worker's side ---------------------------------------------------------------

    async def recover_running(
        self, max_attempts: int | None = None, *, now: float | None = None
    ) -> int:
        """Requeue jobs left ``running`` by a process that died; returns how many.

        A request counts an attempt as it goes out (``claim``'s ``sent``), so a job that was
        in flight each time the process died has spent one per death. One that has spent
        ``max_attempts`` is dead-lettered instead of requeued: a request that crashes aiq (or
        is in flight whenever it is killed) must not loop forever.
        """
        now = time.time() if now is None else now
        async with self.transaction():
            if max_attempts is not None:
                await self._db.execute(
                    "UPDATE jobs SET state = ?, lease_until = NULL, finished_at = ?, "
                    "error_type = 'crashed', error_message = 'aiq stopped ' || attempts || "
                    "' times while this request was in flight (killed or crashed); not retried "
                    "after --max-attempts' WHERE state = ? AND attempts >= ?",
                    (DEAD, now, RUNNING, max_attempts),
                )
            cur = await self._db.execute(
                "UPDATE jobs SET state = ?, lease_until = NULL WHERE state = ?", (QUEUED, RUNNING)
            )
        return cur.rowcount

    async def claim(
        self,
        limit: int,
        *,
        now: float,
        lease_s: float = 600.0,
        record: Sequence[Outcome] = (),
        sent: Sequence[int] = (),
        deferred: Sequence[tuple[float, int]] = (),
    ) -> list[Job]:
        """Atomically move up to ``limit`` due queued jobs to running: those put back to
        wait (retries, deferred jobs) first, by when they came due, then untried ones.

        ``sent``: ids of claimed jobs whose request has gone out since the last call. Each
        counts an attempt now, before its outcome, so a process that dies with it in flight
        has spent one (see ``recover_running``); the outcome then writes the final count. It
        is also marked in flight (``sent_at``, which a claim clears), for ``stats``.

        ``record``: outcomes to write first, in the same transaction. The worker's every cycle
        is then one commit and four trips to the SQLite thread, not two commits and six.

        ``deferred``: (next_at, id) of claimed jobs the rate limiter put off, never sent: back
        to queued until then, attempts and last error as they were.
        """
        if limit <= 0:
            await self.record(record, sent=sent, deferred=deferred)
            return []
        async with self.transaction():
            await self._write_sent(sent)
            await self._write_deferred(deferred)
            if record:
                await self._write_outcomes(record)
            # Jobs put back to wait (retries, deferred) first, as they come due, then jobs
            # never tried, in input order: ordered by next_at alone, a deferred job would
            # wait behind every untried one, and its model's limit would go unused meanwhile.
            rows = await self._db.execute_fetchall(
                "UPDATE jobs SET state = ?, lease_until = ?, deferred = 0, sent_at = NULL "
                "WHERE id IN ("
                "  SELECT id FROM (SELECT id FROM jobs WHERE state = ? AND next_at > 0"
                "    AND next_at <= ? ORDER BY next_at, id LIMIT ?)"
                "  UNION ALL"
                "  SELECT id FROM (SELECT id FROM jobs WHERE state = ? AND next_at = 0"
                "    AND next_at <= ? ORDER BY id LIMIT ?)"
                "  LIMIT ?) RETURNING id, endpoint, body, attempts, first_attempt_at, "
                # The model picks the job's rate limiter and price: read here, in SQLite's
                # C JSON parser (~0.4 µs), not by scanning the body in the event loop.
                "json_extract(CAST(body AS TEXT), '$.model'), next_at",
                (RUNNING, now + lease_s, QUEUED, now, limit, QUEUED, now, limit, limit),
            )
        return [Job(*r) for r in rows]

    async def release(self, jobs: Sequence[Job]) -> None:
        """Return claimed jobs that were never sent, or abandoned in flight by a stop, to the
        queue, with the attempts they had when claimed: neither is the job's fault."""
        if not jobs:
            return
        async with self.transaction():
            await self._db.executemany(
                "UPDATE jobs SET state = ?, lease_until = NULL, attempts = ? "
                "WHERE id = ? AND state = ?",
                [(QUEUED, j.attempts, j.id, RUNNING) for j in jobs],
            )

    async def next_due_at(self) -> float | None:
        """When the earliest queued job becomes due, or None when nothing is queued."""
        ((due,),) = await self._db.execute_fetchall(
            "SELECT min(next_at) FROM jobs WHERE state = ?", (QUEUED,)
        )
        return due

    async def record(
        self,
        outcomes: Sequence[Outcome],
        *,
        sent: Sequence[int] = (),
        deferred: Sequence[tuple[float, int]] = (),
    ) -> None:
        """Write a batch of outcomes (and attempts gone out, jobs deferred, as ``claim``) in
        one transaction."""
        if not outcomes and not sent and not deferred:
            return
        async with self.transaction():
            await self._write_sent(sent)
            await self._write_deferred(deferred)
            if outcomes:
                await self._write_outcomes(outcomes)

    async def _write_sent(self, sent: Sequence[int]) -> None:
        if sent:
            now = time.time()
            await self._db.executemany(
                "UPDATE jobs SET attempts = attempts + 1, sent_at = ? WHERE id = ? AND state = ?",
                [(now, i, RUNNING) for i in sent],
            )

    async def _write_deferred(self, deferred: Sequence[tuple[float, int]]) -> None:
        if deferred:
            await self._db.executemany(
                "UPDATE jobs SET state = ?, next_at = ?, lease_until = NULL, deferred = 1 "
                "WHERE id = ? AND state = ?",
                [(QUEUED, at, i, RUNNING) for at, i in deferred],
            )

    async def undefer(self, *, now: float | None = None) -> int:
        """Make jobs a rate limiter deferred due now; returns how many. A run calls it first:
        their slots were paced to the limits of the run that deferred them."""
        now = time.time() if now is None else now
        async with self.transaction():
            # Through the (state, next_at) index: only queued jobs not yet due are looked at.
            cur = await self._db.execute(
                "UPDATE jobs SET next_at = ?, deferred = 0 "
                "WHERE state = ? AND next_at > ? AND deferred = 1",
                (now, QUEUED, now),
            )
        return cur.rowcount

    async def _write_outcomes(self, outcomes: Sequence[Outcome]) -> None:
        """Write outcomes inside the caller's transaction."""
        rows = [
            (o.state, o.attempts, o.next_at, o.started_at, o.finished_at, o.status_code,
             o.error_type, o.error_message, o.request_id, o.response, *_usage_row(o.usage),
             o.latency_s, o.model, o.cost_usd, o.timed_out, o.job_id)
            for o in outcomes
        ]  # fmt: skip
        await self._db.executemany(
            "UPDATE jobs SET state = ?, attempts = ?, next_at = ?, lease_until = NULL, "
            "first_attempt_at = coalesce(first_attempt_at, ?), finished_at = ?, "
            "status_code = ?, error_type = ?, error_message = ?, request_id = ?, "
            "response = ?, tokens_in = ?, tokens_out = ?, tokens_cached = ?, "
            "tokens_cache_write = ?, tokens_cache_read = ?, tokens_reasoning = ?, "
            "latency_s = ?, model = ?, cost_usd = ?, timeouts = timeouts + ? WHERE id = ?",
            rows,
        )

    # -- reading -------------------------------------------------------------------------

    async def stats(self, *, now: float | None = None, since: float | None = None) -> Stats:
        """Counts by state, the recent rate, tokens, oldest waiting age and top errors.

        The rate is of jobs done over the last minute, or since ``since`` (when the run began
        sending) if that is later: a run six seconds old has had six seconds to do its jobs.
        """
        now = time.time() if now is None else now
        window_s = RATE_WINDOW_S if since is None else min(RATE_WINDOW_S, now - since)
        window_s = max(1.0, window_s)  # a run a moment old: no rate from a handful of jobs
        # One scan of the table for all of it: replies make the rows large, and one scan
        # grouped three ways took 0.5 s at 600,000 jobs where a scan for each took 0.75.
        rows = await self._db.execute_fetchall(
            "SELECT state, model, error_type, count(*), coalesce(sum(tokens_in), 0), "
            "coalesce(sum(tokens_out), 0), sum(cost_usd), count(cost_usd), "
            "count(CASE WHEN finished_at > ? THEN 1 END), min(created_at), count(sent_at), "
            "sum(timeouts), count(tokens_in), coalesce(sum(tokens_cached), 0), "
            "coalesce(sum(tokens_cache_write), 0), coalesce(sum(tokens_cache_read), 0), "
            "coalesce(sum(tokens_reasoning), 0) "
            "FROM jobs NOT INDEXED GROUP BY state, model, error_type",
            (now - window_s,),
        )
        ((not_due,),) = await self._db.execute_fetchall(  # a range of the (state, next_at) index
            "SELECT count(*) FROM jobs WHERE state = ? AND next_at > ?", (QUEUED, now)
        )
        counts = dict.fromkeys(STATE_NAMES, 0)
        tokens_in = tokens_out = recent = in_flight = timeouts = 0
        kinds = TokenKinds()
        stops: dict[tuple[int, str], int] = {}  # (state, stop) -> replies that stopped short
        oldest: float | None = None
        errors: dict[str, int] = {}
        models: dict[str | None, _ModelSums] = {}
        for row in rows:
            state, model, error_type, n, t_in, t_out, cost, priced, n_recent, created, sent = row[
                :11
            ]
            timeouts += row[11]
            counts[STATE_NAMES[state]] += n
            if state == RUNNING:
                in_flight += sent
            tokens_in += t_in
            tokens_out += t_out
            row_kinds = TokenKinds(*row[13:17])
            kinds.add(row_kinds)
            if error_type in _STOPS and state in (DONE, DEAD):  # aiq.stops; billed replies
                stops[state, error_type] = stops.get((state, error_type), 0) + n
                if state == DEAD and cost is not None:  # dead by --on-truncated: billed
                    m = models.setdefault(model, _ModelSums())
                    m.tokens_in += t_in
                    m.tokens_out += t_out
                    m.cost_usd = (m.cost_usd or 0.0) + cost
                    m.kinds.add(row_kinds)
            if state == DONE:
                recent += n_recent
                m = models.setdefault(model, _ModelSums())
                m.done += n
                m.tokens_in += t_in
                m.tokens_out += t_out
                if cost is not None:  # None while no done job of the model had a price
                    m.cost_usd = (m.cost_usd or 0.0) + cost
                m.unpriced += n - priced
                m.unusable += n - row[12]  # a reply's tokens are NULL when it had no usage
                m.kinds.add(row_kinds)
            elif error_type is not None:  # the last error of a job not done
                errors[error_type] = errors.get(error_type, 0) + n
            if state == QUEUED:
                oldest = created if oldest is None else min(oldest, created)
        return Stats(
            total=sum(counts.values()),
            counts=counts,
            done_recent=recent,
            rate_window_s=window_s,
            in_flight=in_flight,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            oldest_queued_s=None if oldest is None else round(max(0.0, now - oldest), 1),
            top_errors=sorted(errors.items(), key=lambda e: (-e[1], e[0]))[:5],
            models=[  # in SQLite's order: no model first
                models[m].usage(m) for m in sorted(models, key=lambda m: (m is not None, m))
            ],
            not_due=not_due,
            timeouts=timeouts,
            kinds=kinds,
            truncated=stops.get((DONE, TRUNCATED), 0),
            truncated_dead=stops.get((DEAD, TRUNCATED), 0),
            filtered=stops.get((DONE, CONTENT_FILTER), 0) + stops.get((DEAD, CONTENT_FILTER), 0),
        )

    async def count_jobs(self) -> int:
        """Jobs in the store, in every state: a scan of the smallest index (4 ms at 600,000)."""
        ((n,),) = await self._db.execute_fetchall("SELECT count(*) FROM jobs")
        return int(n)

    async def waiting_models(self) -> set[str | None]:
        """The models the bodies of queued and running jobs name (None: a body naming none)."""
        rows = await self._db.execute_fetchall(
            "SELECT DISTINCT json_extract(CAST(body AS TEXT), '$.model') FROM jobs "
            "WHERE state IN (?, ?)",
            (QUEUED, RUNNING),
        )
        return {r[0] for r in rows}

    async def finished_among(self, k64s: Sequence[int]) -> dict[int, int]:
        """Which of these jobs (by ``k64``) the store has finished: their state, DONE or DEAD.
        A run sends neither: dead jobs wait for ``replay_dead``."""
        finished: dict[int, int] = {}
        for i in range(0, len(k64s), 900):  # under SQLite's 999 parameters of old versions
            chunk = k64s[i : i + 900]
            rows = await self._db.execute_fetchall(
                f"SELECT k64, state FROM jobs WHERE state IN (?, ?) "
                f"AND k64 IN ({', '.join('?' * len(chunk))})",
                (DONE, DEAD, *chunk),
            )
            finished.update((k, state) for k, state in rows)
        return finished

    async def dead_error_types(self) -> dict[str, int]:
        """Dead jobs by the type of their last error, most first (``?``: a job without one)."""
        rows = await self._db.execute_fetchall(  # a range of the (state, next_at) index
            "SELECT coalesce(error_type, '?') AS t, count(*) AS n FROM jobs WHERE state = ? "
            "GROUP BY t ORDER BY n DESC, t",
            (DEAD,),
        )
        return {t: n for t, n in rows}

    async def jobs_of(self, custom_ids: Sequence[str]) -> dict[str, list[tuple[int, int, str]]]:
        """The jobs (id, state, last error type or ``?``) of the items with these custom_ids,
        in every input file; an id no item has is left out."""
        wanted = {custom_id_hash(c): c for c in custom_ids}
        found: dict[str, list[tuple[int, int, str]]] = {}
        hashes = list(wanted)
        for source in await self.sources():
            for i in range(0, len(hashes), 900):  # through the (source_id, ck) index
                chunk = hashes[i : i + 900]
                rows = await self._db.execute_fetchall(
                    "SELECT i.custom_id, j.id, j.state, coalesce(j.error_type, '?') FROM items i "
                    "JOIN jobs j ON j.k64 = i.job_k64 "
                    f"WHERE i.source_id = ? AND i.ck IN ({', '.join('?' * len(chunk))})",
                    (source.id, *chunk),
                )
                for custom_id, job_id, state, error_type in rows:
                    if wanted.get(custom_id_hash(custom_id)) == custom_id:
                        found.setdefault(custom_id, []).append((job_id, state, error_type))
        return found

    async def replay_dead(
        self, *, error_type: str | None = None, job_ids: Sequence[int] | None = None
    ) -> int:
        """Move dead jobs (all, or of one error type, or among ``job_ids``) back to queued,
        attempts reset; returns how many."""
        where, params = "state = ?", list[object]([DEAD])
        if error_type is not None:
            where += " AND coalesce(error_type, '?') = ?"
            params.append(error_type)
        sql = (
            "UPDATE jobs SET state = ?, attempts = 0, next_at = 0, finished_at = NULL "
            f"WHERE {where}"
        )
        async with self.transaction():
            if job_ids is None:
                cur = await self._db.execute(sql, (QUEUED, *params))
                return cur.rowcount
            before = self._db.total_changes
            await self._db.executemany(
                sql + " AND id = ?", [(QUEUED, *params, i) for i in dict.fromkeys(job_ids)]
            )
            return self._db.total_changes - before

    async def result_rows(
        self,
        source: Source,
        *,
        state: int,
        order: str = "done",
        columns: Sequence[str] = RESULT_COLUMNS,
    ) -> AsyncIterator[list[Any]]:
        """Yield, a thousand at a time, the rows of one source's items whose job is in
        ``state``: the ``columns`` named (see RESULT_COLUMNS), in finishing or input order."""
        order_by = "i.line_no, i.id" if order == "input" else "j.finished_at, i.id"
        # Through its index, a source's items come in custom_id-hash order, and each is a
        # random read of the items and jobs tables. When the store holds one source (the usual
        # case), reading items in table order is sequential, and so nearly are their jobs
        # (added in the same batches): 600,000 results read in 2.3 s instead of 4.2.
        ((sources,),) = await self._db.execute_fetchall("SELECT count(*) FROM sources")
        items = "items i NOT INDEXED" if sources == 1 else "items i"
        async with self._db.execute(
            f"SELECT {', '.join(_RESULT_SQL[c] for c in columns)} "
            f"FROM {items} JOIN jobs j ON j.k64 = i.job_k64 "
            f"WHERE i.source_id = ? AND j.state = ? ORDER BY {order_by}",
            (source.id, state),
        ) as cur:
            cur.arraysize = 1000
            while rows := await cur.fetchmany():
                yield list(rows)  # plain tuples: the store sets no row factory


def require_store(path: str | os.PathLike[str]) -> None:
    """StoreError unless a store exists at ``path``. Commands that only carry on with one
    (resume, replay-dead, status) call it first: a mistyped --db must not start a new one."""
    if not os.path.exists(path):
        raise StoreError(f"{path}: no store here yet; run `aiq add FILE` or `aiq run FILE`")


def _create(p: Path) -> None:
    """Create the store's file (and missing directories) owner-only, if it is not there."""
    make_store_dir(p)
    try:
        if not p.exists():
            # Prompts and replies are private: owner-only from the first byte.
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError as exc:
        raise StoreError(
            f"{p}: cannot create the store ({exc.strerror}); make {p.parent} writable "
            "or pass --db PATH"
        ) from exc


# What to do about an SQLite error, by its primary result code.
_ADVICE = {
    sqlite3.SQLITE_FULL: "free some space, then run `aiq resume` (what was recorded is kept)",
    sqlite3.SQLITE_IOERR: "the disk failed a read or write: check it (space, quota, errors), "
    "then run `aiq resume` (what was recorded is kept)",
    sqlite3.SQLITE_READONLY: "aiq needs to write the store, its directory and its -wal and "
    "-shm files: make them writable, or pass --db PATH",
    sqlite3.SQLITE_PERM: "aiq needs to write the store, its directory and its -wal and "
    "-shm files: make them writable, or pass --db PATH",
    sqlite3.SQLITE_CANTOPEN: "check that its directory exists and is writable, or pass --db PATH",
    sqlite3.SQLITE_NOTADB: "this file is not an aiq store: pass --db PATH, or move it aside",
    sqlite3.SQLITE_CORRUPT: "the store is damaged: restore a backup, or move it (and its -wal "
    "and -shm files) aside and start again",
    sqlite3.SQLITE_BUSY: "another program keeps the store locked: stop it and try again",
    sqlite3.SQLITE_LOCKED: "another program keeps the store locked: stop it and try again",
}


def store_error(path: Path, exc: sqlite3.Error) -> StoreError:
    """The StoreError a user sees for ``exc``, an SQLite error on the store at ``path``."""
    code = getattr(exc, "sqlite_errorcode", -1) & 0xFF
    if str(exc).startswith("Could not decode to UTF-8"):  # Python's, on a garbled text cell
        code = sqlite3.SQLITE_CORRUPT
    advice = _ADVICE.get(code, "run the command again with --traceback and report it")
    return StoreError(f"{path}: {exc}; {advice}")


def _usage_row(u: Usage | None) -> tuple[int | None, ...]:
    """The token columns of an outcome: NULL for no reply, or a reply with unusable usage."""
    if u is None:
        return (None,) * 6
    return u.tokens_in, u.tokens_out, u.cached, u.cache_write, u.cache_read, u.reasoning


@dataclass(slots=True)
class _ModelSums:
    """ModelUsage's figures while stats() adds them up."""

    done: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    unpriced: int = 0
    unusable: int = 0
    kinds: TokenKinds = field(default_factory=TokenKinds)

    def usage(self, model: str | None) -> ModelUsage:
        return ModelUsage(
            model, self.done, self.tokens_in, self.tokens_out, self.cost_usd, self.unpriced,
            unusable=self.unusable, kinds=self.kinds,
        )  # fmt: skip


def _statements(script: str) -> list[str]:
    """Split a migration into statements (sqlite3.complete_statement keeps triggers whole)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


async def _count_change(db: aiosqlite.Connection, before: int) -> None:
    """Inside a transaction: add one to the store's ``changes`` if it changed any row since
    ``db.total_changes`` was ``before``. An export stamped with the count is current while the
    count stays (outputs.export_source); nothing else needs to know what changed."""
    if db.total_changes != before:
        await db.execute(
            "INSERT INTO meta (name, value) VALUES ('changes', 1) "
            "ON CONFLICT (name) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
        )


class _Transaction:
    def __init__(self, db: aiosqlite.Connection, *, count: bool = True) -> None:
        self._db = db
        self._count = count
        self._before = 0

    async def __aenter__(self) -> None:
        await self._db.execute("BEGIN IMMEDIATE")
        self._before = self._db.total_changes

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            try:
                if self._count:
                    await _count_change(self._db, self._before)
                await self._db.execute("COMMIT")
            except BaseException:
                await self._rollback()  # else the next BEGIN fails and hides this error
                raise
        else:
            await self._rollback()

    async def _rollback(self) -> None:
        # After SQLITE_FULL or an I/O error SQLite may have rolled back already: a second
        # ROLLBACK would fail and replace the error that says what happened.
        if self._db.in_transaction:
            with suppress(sqlite3.Error):
                await self._db.execute("ROLLBACK")
