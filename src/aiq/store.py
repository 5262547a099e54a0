"""JobStore: the durable queue, one SQLite file in WAL mode over one aiosqlite connection.

The store is the single source of truth; output files are views of it. Writes are batched
(one transaction per batch of lines or outcomes), claims are one atomic ``UPDATE … RETURNING``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite

from .errors import StoreError
from .inputs import BadLine, Request
from .migrations import MIGRATIONS

QUEUED, RUNNING, DONE, DEAD = 0, 1, 2, 3
STATE_NAMES = ("queued", "running", "done", "dead")

_PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    # NORMAL in WAL mode survives a process crash (kill -9); only a power cut can lose the
    # last commits, and those jobs are simply sent again.
    "PRAGMA synchronous = NORMAL",
    "PRAGMA cache_size = -65536",  # 64 MiB: keeps the unique indexes hot during `add`
    "PRAGMA temp_store = MEMORY",
    "PRAGMA busy_timeout = 10000",
)
# Large batches and rare checkpoints during `add`: each checkpoint fsyncs, and with the
# default (1,000 pages) fsync, not SQL, dominated a bulk add.
_ENQUEUE_BATCH = 20_000
_BULK_CHECKPOINT_PAGES = 20_000


def k64(key: bytes) -> int:
    """The job's short unique id: the first 8 bytes of its key as a signed 64-bit integer."""
    return int.from_bytes(key[:8], "big", signed=True)


def item_key(source_id: int, custom_id: str) -> int:
    """Short unique id of a (source, custom_id) pair."""
    digest = hashlib.blake2b(f"{source_id}\0{custom_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True, slots=True)
class Source:
    """An input file known to the store, with the output paths it exports to."""

    id: int
    path: str
    out_path: str
    dead_path: str


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed job: what the worker sends."""

    id: int
    endpoint: str
    body: bytes
    attempts: int
    first_attempt_at: float | None


@dataclass(slots=True)
class Outcome:
    """What became of one attempt; the worker builds it, the store records it in a batch."""

    job_id: int
    state: int  # DONE, QUEUED (retry later) or DEAD
    attempts: int
    started_at: float
    finished_at: float | None = None
    next_at: float = 0.0
    status_code: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    request_id: str | None = None
    response: bytes | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    latency_s: float | None = None


@dataclass(slots=True)
class EnqueueCounts:
    """What ``add`` did: lines new to the store, already known, re-pointed, invalid."""

    new: int = 0
    known: int = 0
    changed: int = 0
    invalid: int = 0
    jobs_added: int = 0  # distinct new requests that will be sent
    valid: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Stats:
    """Where the store stands, for ``status`` and the final summary."""

    total: int
    counts: dict[str, int]
    done_last_minute: int
    tokens_in: int
    tokens_out: int
    oldest_queued_s: float | None
    top_errors: list[tuple[str, int]]

    @property
    def remaining(self) -> int:
        return self.counts["queued"] + self.counts["running"]

    @property
    def percent_done(self) -> float:
        finished = self.counts["done"] + self.counts["dead"]
        return 100.0 * finished / self.total if self.total else 100.0

    @property
    def rate_per_s(self) -> float:
        return self.done_last_minute / 60.0

    @property
    def eta_s(self) -> float | None:
        if not self.remaining:
            return 0.0
        return self.remaining / self.rate_per_s if self.rate_per_s else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "counts": self.counts,
            "percent_done": round(self.percent_done, 2),
            "rate_per_s": round(self.rate_per_s, 3),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "oldest_queued_s": self.oldest_queued_s,
            "top_errors": [{"type": t, "count": n} for t, n in self.top_errors],
        }


def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class JobStore:
    """The job queue in one SQLite file. Open with ``await JobStore.open(path)``."""

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    # -- opening -------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, readonly: bool = False) -> JobStore:
        """Open (creating and migrating unless ``readonly``) the store at ``path``."""
        p = Path(path)
        if readonly and not p.exists():
            raise StoreError(f"{p}: no store here yet; run `aiq add FILE` or `aiq run FILE`")
        if not readonly:
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                if not p.exists():
                    # Prompts and replies are private: owner-only from the first byte.
                    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError as exc:
                raise StoreError(f"{p}: cannot create the store ({exc.strerror})") from None
        uri = f"file:{p}?mode=ro" if readonly else str(p)
        try:
            db = await aiosqlite.connect(uri, uri=readonly, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"{p}: cannot open the store ({exc})") from None
        store = cls(db, p)
        try:
            for pragma in _PRAGMAS[1:] if readonly else _PRAGMAS:
                await db.execute(pragma)
            await store._migrate(readonly=readonly)
        except sqlite3.DatabaseError as exc:
            await db.close()
            raise StoreError(f"{p}: not a usable aiq store ({exc}); move it aside") from None
        except BaseException:
            await db.close()
            raise
        return store

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
                f"{self.path}: written by a newer aiq (migration {sorted(applied - known)[-1]}); "
                "upgrade aiq to use this store"
            )
        pending = [(n, sql) for n, sql in MIGRATIONS if n not in applied]
        if pending and readonly:
            raise StoreError(f"{self.path}: store needs upgrading; run any writing aiq command")
        for name, sql in pending:
            async with self.transaction():
                for statement in _statements(sql):
                    await self._db.execute(statement)
                await self._db.execute(
                    "INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (name, time.time())
                )

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> JobStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def transaction(self) -> _Transaction:
        """``async with store.transaction():`` — BEGIN IMMEDIATE … COMMIT, or ROLLBACK."""
        return _Transaction(self._db)

    # -- sources -------------------------------------------------------------------------

    async def add_source(self, path: str, *, out_path: str, dead_path: str) -> Source:
        """Register an input file (or update its output paths); returns it."""
        async with self.transaction():
            await self._db.execute(
                "INSERT INTO sources (path, out_path, dead_path, added_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (path) DO UPDATE SET out_path = excluded.out_path, "
                "dead_path = excluded.dead_path",
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

        Lines are parsed in a helper thread while SQLite writes the previous batch in its own:
        both release the GIL often enough to use two cores.
        """
        now = time.time() if now is None else now
        counts = EnqueueCounts()
        batches = _chunks(lines, _ENQUEUE_BATCH)

        def prepare() -> tuple[list[tuple], list[tuple]] | None:
            batch = next(batches, None)
            if batch is None:
                return None
            jobs, items = [], []
            for req in batch:
                if isinstance(req, BadLine):
                    counts.invalid += 1
                    counts.bad_lines.append(req)
                    continue
                jk = k64(req.key)
                jobs.append((jk, req.key, req.endpoint, req.body, now))
                items.append(
                    (item_key(source.id, req.custom_id), source.id, req.custom_id, jk,
                     req.line_no, req.line)
                )  # fmt: skip
            return jobs, items

        await self._db.execute(f"PRAGMA wal_autocheckpoint = {_BULK_CHECKPOINT_PAGES}")
        try:
            rows = await asyncio.to_thread(prepare)
            while rows is not None:
                result, rows = await asyncio.gather(self._insert(*rows), asyncio.to_thread(prepare))
                _add(counts, result)
        finally:
            await self._db.execute("PRAGMA wal_autocheckpoint = 1000")
        counts.known = counts.valid - counts.new - counts.changed
        if counts.changed:
            await self._drop_orphans()
        return counts

    async def _max_item_id(self) -> int:
        rows = list(await self._db.execute_fetchall("SELECT coalesce(max(id), 0) FROM items"))
        return int(rows[0][0])

    async def _drop_orphans(self) -> None:
        """Delete jobs that re-pointed items left wanted by nobody, unless they already ran."""
        async with self.transaction():
            # One scan of items finds which noted jobs are still wanted.
            await self._db.execute(
                "DELETE FROM jobs WHERE k64 IN (SELECT k64 FROM repointed "
                "  EXCEPT SELECT job_k64 FROM items WHERE job_k64 IN (SELECT k64 FROM repointed)) "
                "AND state IN (?, ?)",
                (QUEUED, DEAD),
            )
            await self._db.execute("DELETE FROM repointed")

    async def _insert(self, jobs: list[tuple], items: list[tuple]) -> tuple[int, int, int, int]:
        """Insert one batch; returns (lines, jobs added, items added, items re-pointed)."""
        db = self._db
        async with self.transaction():
            # rowcount excludes rows changed by triggers, unlike total_changes.
            cur = await db.executemany(
                "INSERT INTO jobs (k64, key, endpoint, body, created_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (k64) DO NOTHING",
                jobs,
            )
            jobs_added = cur.rowcount
            max_before = await self._max_item_id()
            cur = await db.executemany(
                "INSERT INTO items (ck, source_id, custom_id, job_k64, line_no, line) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (ck) DO UPDATE SET "
                "job_k64 = excluded.job_k64, line = excluded.line, line_no = excluded.line_no "
                "WHERE job_k64 != excluded.job_k64",
                items,
            )
            touched = cur.rowcount
            max_after = await self._max_item_id()
        # Items are never deleted, so new rows are exactly the growth of the rowid.
        added = max_after - max_before
        return len(items), jobs_added, added, touched - added

    # -- the worker's side ---------------------------------------------------------------

    async def recover_running(self) -> int:
        """Requeue jobs left ``running`` by a process that died; returns how many."""
        async with self.transaction():
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
    ) -> list[Job]:
        """Atomically move up to ``limit`` due queued jobs to running, oldest first.

        ``record``: outcomes to write first, in the same transaction. The worker's every cycle
        is then one commit and four trips to the SQLite thread, not two commits and six.
        """
        if limit <= 0:
            await self.record(record)
            return []
        async with self.transaction():
            if record:
                await self._write_outcomes(record)
            rows = await self._db.execute_fetchall(
                "UPDATE jobs SET state = ?, lease_until = ? WHERE id IN ("
                "  SELECT id FROM jobs WHERE state = ? AND next_at <= ? ORDER BY next_at, id"
                "  LIMIT ?) RETURNING id, endpoint, body, attempts, first_attempt_at",
                (RUNNING, now + lease_s, QUEUED, now, limit),
            )
        return [Job(*r) for r in rows]

    async def release(self, job_ids: Sequence[int]) -> None:
        """Return claimed jobs that were never attempted (a stop, a cancel) to the queue."""
        if not job_ids:
            return
        async with self.transaction():
            await self._db.executemany(
                "UPDATE jobs SET state = ?, lease_until = NULL WHERE id = ? AND state = ?",
                [(QUEUED, i, RUNNING) for i in job_ids],
            )

    async def next_due_at(self) -> float | None:
        """When the earliest queued job becomes due, or None when nothing is queued."""
        ((due,),) = await self._db.execute_fetchall(
            "SELECT min(next_at) FROM jobs WHERE state = ?", (QUEUED,)
        )
        return due

    async def record(self, outcomes: Sequence[Outcome]) -> None:
        """Write a batch of outcomes in one transaction."""
        if not outcomes:
            return
        async with self.transaction():
            await self._write_outcomes(outcomes)

    async def _write_outcomes(self, outcomes: Sequence[Outcome]) -> None:
        """Write outcomes inside the caller's transaction."""
        rows = [
            (o.state, o.attempts, o.next_at, o.started_at, o.finished_at, o.status_code,
             o.error_type, o.error_message, o.request_id, o.response, o.tokens_in,
             o.tokens_out, o.latency_s, o.job_id)
            for o in outcomes
        ]  # fmt: skip
        await self._db.executemany(
            "UPDATE jobs SET state = ?, attempts = ?, next_at = ?, lease_until = NULL, "
            "first_attempt_at = coalesce(first_attempt_at, ?), finished_at = ?, "
            "status_code = ?, error_type = ?, error_message = ?, request_id = ?, "
            "response = ?, tokens_in = ?, tokens_out = ?, latency_s = ? WHERE id = ?",
            rows,
        )

    # -- reading -------------------------------------------------------------------------

    async def stats(self, *, now: float | None = None) -> Stats:
        """Counts by state, recent rate, tokens, oldest waiting age and top errors."""
        now = time.time() if now is None else now
        db = self._db
        counts = dict.fromkeys(STATE_NAMES, 0)
        for state, n in await db.execute_fetchall(
            "SELECT state, count(*) FROM jobs GROUP BY state"
        ):
            counts[STATE_NAMES[state]] = n
        ((recent, tin, tout),) = await db.execute_fetchall(
            "SELECT count(CASE WHEN finished_at > ? AND state = ? THEN 1 END), "
            "coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0) FROM jobs",
            (now - 60.0, DONE),
        )
        ((oldest,),) = await db.execute_fetchall(
            "SELECT min(created_at) FROM jobs WHERE state = ?", (QUEUED,)
        )
        errors = await db.execute_fetchall(
            "SELECT error_type, count(*) AS n FROM jobs WHERE error_type IS NOT NULL "
            "AND state != ? GROUP BY error_type ORDER BY n DESC, error_type LIMIT 5",
            (DONE,),
        )
        return Stats(
            total=sum(counts.values()),
            counts=counts,
            done_last_minute=recent,
            tokens_in=tin,
            tokens_out=tout,
            oldest_queued_s=None if oldest is None else round(max(0.0, now - oldest), 1),
            top_errors=[(t, n) for t, n in errors],
        )

    async def replay_dead(
        self, *, error_type: str | None = None, custom_ids: Sequence[str] = ()
    ) -> int:
        """Move dead jobs (all, or of one error type, or of these custom_ids) back to queued."""
        where: list[str] = ["state = ?"]
        params: list[object] = [DEAD]
        if error_type:
            where.append("error_type = ?")
            params.append(error_type)
        if custom_ids:
            marks = ", ".join("?" * len(custom_ids))
            where.append(f"k64 IN (SELECT job_k64 FROM items WHERE custom_id IN ({marks}))")
            params.extend(custom_ids)
        async with self.transaction():
            cur = await self._db.execute(
                "UPDATE jobs SET state = ?, attempts = 0, next_at = 0, finished_at = NULL "
                f"WHERE {' AND '.join(where)}",
                (QUEUED, *params),
            )
        return cur.rowcount

    async def result_rows(
        self, source: Source, *, state: int, order: str = "done"
    ) -> AsyncIterator[tuple[Any, ...]]:
        """Yield the export rows of one source's items whose job is in ``state``."""
        order_by = "i.line_no, i.id" if order == "input" else "j.finished_at, i.id"
        async with self._db.execute(
            "SELECT i.custom_id, i.line, j.id, j.k64, j.status_code, j.request_id, j.response, "
            "j.attempts, j.error_type, j.error_message, j.first_attempt_at, j.finished_at "
            "FROM items i JOIN jobs j ON j.k64 = i.job_k64 "
            f"WHERE i.source_id = ? AND j.state = ? ORDER BY {order_by}",
            (source.id, state),
        ) as cur:
            cur.arraysize = 1000
            while rows := await cur.fetchmany():
                for row in rows:
                    yield tuple(row)


def _add(counts: EnqueueCounts, result: tuple[int, int, int, int]) -> None:
    valid, jobs_added, added, changed = result
    counts.valid += valid
    counts.jobs_added += jobs_added
    counts.new += added
    counts.changed += changed


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


class _Transaction:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def __aenter__(self) -> None:
        await self._db.execute("BEGIN IMMEDIATE")

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        await self._db.execute("ROLLBACK" if exc_type else "COMMIT")
