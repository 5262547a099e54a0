"""JobStore: the durable store of jobs, one SQLite file in WAL mode.

The store is the single source of truth; output files are views of it. Its layers, each
a module: the file itself (``database``: opening, pragmas, migrations, transactions, error
advice), the queue a run works (``jobqueue``: claim, record, release, recover, replay), the
batches a provider's batch engine works (``batchqueue``), and
here the sources, the meta and export stamps, and the reads. Where the store stands comes
from the counts kept as jobs change (``tallies``). Adding lines is ``enqueue``'s, which
writes through the store: the store knows nothing of input files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from . import tallies
from .batchqueue import BatchQueue
from .records import DEAD, DONE, QUEUED, RUNNING, Carried, Source, Target
from .stats import Stats

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
_BATCHES_SHOWN = 10  # status lists the last few batches, and every open one
PRUNED_META = "pruned"  # set by the first prune (aiq.retention): exports carry lines over
# What `aiq show` reads of a job.
_JOB_COLUMNS = (
    "id", "state", "attempts", "priority", "endpoint", "body", "response", "status_code",
    "request_id", "error_type", "error_message", "created_at", "first_attempt_at",
    "finished_at", "next_at", "latency_s", "tokens_in", "tokens_out", "cost_usd", "model",
    "timeouts", "tier",
)  # fmt: skip
_JOB_SELECT = ", ".join(f"j.{c}" for c in _JOB_COLUMNS)


class JobStore(BatchQueue):
    """The job queue in one SQLite file. Open with ``await JobStore.open(path)``."""

    # -- what the outputs were written from ------------------------------------------------

    async def changes(self) -> int:
        """How many transactions have changed the store: equal numbers, equal stores."""
        value = await self.meta("changes")
        return 0 if value is None else int(value)

    async def export_stamp(self, source: Source) -> dict[str, Any] | None:
        """What the last run's export of ``source`` wrote (see outputs._stamp), if any."""
        value = await self.meta(f"export:{source.id}")
        return None if value is None else orjson.loads(value)

    async def save_export_stamp(self, source: Source, stamp: dict[str, Any]) -> None:
        """Keep ``stamp`` for ``source``; not counted as a change (it describes the files)."""
        async with self.transaction(count=False):
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
        async with self.transaction(count=False):
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
            "AND length(body) > 0 "  # not a pruned one's: its request is gone
            "ORDER BY finished_at DESC LIMIT ?)",
            (DONE, since, limit),
        )
        newest = max((r[4] for r in rows), default=since)
        return [(m, e, bytes(b), t) for m, e, b, t, _ in rows], newest

    # -- where the jobs go ------------------------------------------------------------------

    async def target(self) -> Target | None:
        """Where this store's jobs are sent, as its first run recorded it (None: no run yet,
        or a store from before aiq recorded it)."""
        value = await self.meta("target")
        return None if value is None else Target.from_dict(orjson.loads(value))

    async def save_target(self, target: Target) -> None:
        """Record where the store's jobs go; not a change of its jobs (exports stay current)."""
        async with self.transaction(count=False):
            await self._db.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES ('target', ?)",
                (orjson.dumps(target.as_dict()).decode(),),
            )

    async def job_counts(self) -> tuple[int, int]:
        """(jobs, jobs not done), from the kept tallies."""
        return await tallies.job_counts(self._db)

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

    # -- reading -------------------------------------------------------------------------

    async def stats(self, *, now: float | None = None, since: float | None = None) -> Stats:
        """Counts by state, the recent rate, tokens, oldest waiting age and top errors, from
        the kept tallies and a few index ranges (``tallies.read_stats``): no scan of the jobs.

        The rate is of jobs done over the last minute, or since ``since`` (when the run began
        sending) if that is later: a run six seconds old has had six seconds to do its jobs.
        """
        now = time.time() if now is None else now
        async with self.snapshot():  # the tallies and the index ranges of one moment
            stats = await tallies.read_stats(self._db, now=now, since=since)
            batches = await self.batches(last=_BATCHES_SHOWN)
            if not batches:
                return stats
            return dataclasses.replace(
                stats, batches=batches, requeued=await self.requeued_total(),
                in_batches=await self.in_batches(),
            )  # fmt: skip

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
        return await tallies.dead_error_types(self._db)

    async def jobs_of(self, custom_ids: Sequence[str]) -> dict[str, list[tuple[int, int, str]]]:
        """The jobs (id, state, last error type or ``?``) of the items with these custom_ids,
        in every input file; an id no item has is left out."""
        from .inputs import custom_id_hash  # here: `aiq status` reads without the line reader

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

    async def unfinished_custom_ids(self) -> dict[int, str]:
        """The custom_id of every queued or running job (the first line naming it), by job
        id: one pass over the items, each finding its job by key (CROSS JOIN keeps that
        order: driven from the jobs, each would scan the items, which have no index by job).
        For a run's log (aiq.joblog) only: a dict of every unfinished job."""
        ids: dict[int, str] = {}
        async with self._db.execute(
            "SELECT j.id, i.custom_id FROM items i CROSS JOIN jobs j ON j.k64 = i.job_k64 "
            "WHERE j.state IN (?, ?)",
            (QUEUED, RUNNING),
        ) as cur:
            cur.arraysize = 1000
            while rows := await cur.fetchmany():
                for job_id, custom_id in rows:
                    ids.setdefault(job_id, custom_id)
        return ids

    async def carried_ids(self, source: Source) -> Carried | None:
        """``source``'s lines that only its output files hold since a prune: of a pruned job
        (a done one without its reply, a dead one without its input line) or a forgotten
        one (no job). None if nothing was ever pruned: the usual export reads no more."""
        if await self.meta(PRUNED_META) is None:
            return None
        carried = Carried()
        kinds = {0: carried.forgotten, DONE: carried.done, DEAD: carried.dead}
        rows = await self._db.execute_fetchall(
            f"SELECT i.ck, CASE WHEN j.id IS NULL THEN 0 ELSE j.state END "
            "FROM items i LEFT JOIN jobs j ON j.k64 = i.job_k64 WHERE i.source_id = ? AND ("
            f"j.id IS NULL OR (j.state = {DONE} AND length(j.body) = 0 AND j.response IS NULL) "
            f"OR (j.state = {DEAD} AND length(i.line) = 0))",
            (source.id,),
        )
        for ck, kind in rows:
            kinds[kind].add(ck)
        return carried

    async def dead_by_type(
        self, *, error_type: str | None = None
    ) -> list[tuple[str, int, str | None, float | None]]:
        """Dead jobs by their last error's type (``?``: none), most first: (type, jobs, the
        most recent one's message, when it died). Through the index's dead range."""
        where, params = "state = ?", list[object]([DEAD])
        if error_type is not None:
            where += " AND coalesce(error_type, '?') = ?"
            params.append(error_type)
        rows = await self._db.execute_fetchall(
            # A bare column beside max(): SQLite takes it from the row holding the max.
            "SELECT coalesce(error_type, '?'), count(*), error_message, max(finished_at) "
            f"FROM jobs WHERE {where} GROUP BY 1 ORDER BY 2 DESC, 1",
            params,
        )
        return [(t, n, m, at) for t, n, m, at in rows]

    async def dead_custom_ids(self, *, error_type: str | None = None) -> list[tuple[str, str]]:
        """(error type, custom_id) of every item whose job is dead, the latest to die first."""
        where, params = "", list[object]([DEAD, DEAD])
        if error_type is not None:
            where = " AND coalesce(j.error_type, '?') = ?"
            params.append(error_type)
        # Items have no index on their job (it would slow `add` by a third): one pass over
        # them, each checked against the few dead jobs' keys, then their jobs looked up.
        rows = await self._db.execute_fetchall(
            "SELECT coalesce(j.error_type, '?'), i.custom_id FROM items i CROSS JOIN jobs j "
            "ON j.k64 = i.job_k64 WHERE i.job_k64 IN (SELECT k64 FROM jobs WHERE state = ?) "
            f"AND j.state = ?{where} ORDER BY j.finished_at DESC, i.id",
            params,
        )
        return [(t, c) for t, c in rows]

    async def dead_jobs(
        self, *, error_type: str | None = None, job_ids: Sequence[int] | None = None
    ) -> list[tuple[int, int, int, str, bytes]]:
        """Dead jobs (all, of one last error type, among ``job_ids``) as (id, k64, priority,
        endpoint, body), in id order; not a pruned one (aiq.retention: its request is gone)."""
        where, params = "state = ? AND length(body) > 0", list[object]([DEAD])
        if error_type is not None:
            where += " AND coalesce(error_type, '?') = ?"
            params.append(error_type)
        found = []
        ids = sorted(set(job_ids)) if job_ids is not None else [None]
        for i in range(0, len(ids), 900):
            chunk = ids[i : i + 900]
            only = "" if job_ids is None else f" AND id IN ({', '.join('?' * len(chunk))})"
            rows = await self._db.execute_fetchall(
                f"SELECT id, k64, priority, endpoint, body FROM jobs WHERE {where}{only} "
                "ORDER BY id",
                [*params, *([] if job_ids is None else chunk)],
            )
            found += [(i_, k, p, e, bytes(b)) for i_, k, p, e, b in rows]
        return found

    async def custom_id_of(self, job_id: int) -> str | None:
        """A custom_id whose line asks for this job, if any (a pass over the items)."""
        rows = list(
            await self._db.execute_fetchall(
                "SELECT custom_id FROM items WHERE job_k64 = (SELECT k64 FROM jobs WHERE id = ?) "
                "LIMIT 1",
                (job_id,),
            )
        )
        return rows[0][0] if rows else None

    async def items_named(self, custom_id: str) -> list[dict[str, Any]]:
        """Every input line named ``custom_id`` (one a file) with its job's row, in the order
        the files were added: the request as sent, the reply as stored, the job's record."""
        from .inputs import custom_id_hash  # as in jobs_of

        found = []
        for source in await self.sources():  # through the (source_id, ck) index
            rows = await self._db.execute_fetchall(
                f"SELECT i.custom_id, i.line_no, i.line, {_JOB_SELECT} FROM items i "
                "JOIN jobs j ON j.k64 = i.job_k64 WHERE i.source_id = ? AND i.ck = ?",
                (source.id, custom_id_hash(custom_id)),
            )
            for row in rows:
                if row[0] == custom_id:
                    names = ("custom_id", "line_no", "line", *_JOB_COLUMNS)
                    found.append({"source": source, **dict(zip(names, row, strict=True))})
        return found

    async def errors_kept_since(self) -> float | None:
        """Since when every failure is kept (``errors``): when this store took 0009."""
        rows = list(
            await self._db.execute_fetchall(
                "SELECT applied_at FROM migrations WHERE name = '0009_priority'"
            )
        )
        return rows[0][0] if rows else None

    async def errors_of(self, job_id: int) -> list[tuple[Any, ...]]:
        """A job's recorded failures, oldest first: (attempts, at, error_type, status_code,
        message, request_id, state)."""
        rows = await self._db.execute_fetchall(
            "SELECT attempts, at, error_type, status_code, message, request_id, state "
            "FROM errors WHERE job_id = ? ORDER BY at, rowid",
            (job_id,),
        )
        return [tuple(r) for r in rows]

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


@contextlib.asynccontextmanager
async def open_store(
    path: str | os.PathLike[str], *, readonly: bool = False, blocking: bool = False
) -> AsyncIterator[JobStore]:
    """The store at ``path``, closed on exit (``blocking``: see ``Database.open``)."""
    store = await JobStore.open(path, readonly=readonly, blocking=blocking)
    try:
        with store.errors():  # a full disk mid-run: one `error:` line, not a traceback
            yield store
    finally:
        await store.close()
