"""JobQueue: the jobs' way through a run, over the store's SQLite file: claimed, sent,
recorded, released, deferred, recovered after a crash, replayed from the dead letters.

Any engine that sends jobs (the online worker today) goes through these calls alone. Each
is one transaction: the worker's every cycle is one commit, outcomes batched into the claim.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from operator import itemgetter
from sqlite3 import Row
from typing import cast

from . import tallies
from .database import Database
from .records import DEAD, DONE, QUEUED, RUNNING, Job, Outcome
from .usage import Usage

# Within a priority, jobs put back to wait (retries, deferred) first, as they come due, then
# jobs never tried, in input order: ordered by next_at alone, a deferred job would wait
# behind every untried one, and its model's limit would go unused meanwhile. The two arms
# merge on (priority, t, id): t is a waiting job's next_at made negative (before any id), an
# untried job's id. The untried arm reads the (state, next_at, priority DESC) index in that
# order and stops at the limit; the waiting arm sorts the jobs due now, a claim's few. Its
# "none due before now" is `?4 >= 0`, not `next_at <= ?4`: beside `next_at = 0`, SQLite took
# that range instead and sorted every untried job, each claim (34 ms at 200,000 jobs).
_CLAIM = (
    "UPDATE jobs SET state = ?1, lease_until = ?2, deferred = 0, sent_at = NULL "
    "WHERE id IN (SELECT id FROM ("
    "  SELECT id, priority AS p, next_at - 1e13 AS t FROM jobs"
    "    WHERE state = ?3 AND next_at > 0 AND next_at <= ?4"
    "  UNION ALL"
    "  SELECT id, priority, id FROM jobs WHERE state = ?3 AND next_at = 0 AND ?4 >= 0"
    "  ORDER BY p DESC, t, id LIMIT ?5)"
    ") RETURNING id, endpoint, body, attempts, first_attempt_at, "
    # The model picks the job's rate limiter and price: read here, in SQLite's C JSON parser
    # (~0.4 µs), not by scanning the body in the event loop.
    "json_extract(CAST(body AS TEXT), '$.model'), next_at, priority"
)
_PRIORITY = itemgetter(7)


class JobQueue(Database):
    """The queue's operations; ``store.JobStore`` adds the sources, stamps and reads."""

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
                    "after --max-attempts' WHERE state = ? AND attempts >= ? AND batch_id IS NULL",
                    (DEAD, now, RUNNING, max_attempts),
                )
                await self._db.execute(  # in the errors' history too (`aiq show`)
                    "INSERT INTO errors (job_id, attempts, at, error_type, message, state) "
                    "SELECT id, attempts, finished_at, error_type, error_message, state FROM jobs "
                    "WHERE state = ? AND finished_at = ? AND error_type = 'crashed'",
                    (DEAD, now),
                )
            # A job in an open batch (batch_id) is the provider's: the batch is adopted instead.
            cur = await self._db.execute(
                "UPDATE jobs SET state = ?, lease_until = NULL "
                "WHERE state = ? AND batch_id IS NULL",
                (QUEUED, RUNNING),
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
        """Atomically move up to ``limit`` due queued jobs to running, highest priority
        first; within one priority, those put back to wait (retries, deferred jobs) first, by
        when they came due, then untried ones in input order. Returned in that order.

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
            cur = await self._db.execute(_CLAIM, (RUNNING, now + lease_s, QUEUED, now, limit))
            rows = cast(list[Row], await cur.fetchall())  # a list, as sqlite3 returns it
        # RETURNING comes in id order; a claim's jobs go to the senders in claim order.
        # Stable, and one priority is already in order: a pass over the list, no allocation.
        rows.sort(key=_PRIORITY, reverse=True)
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
            # A done job's next_at is when it finished: `status` finds the jobs done in the last
            # minute on the (state, next_at) index (migration 0008_tallies).
            (o.state, o.attempts, (o.finished_at or 0.0) if o.state == DONE else o.next_at,
             o.started_at, o.finished_at, o.status_code,
             o.error_type, o.error_message, o.request_id, o.response, *_usage_row(o.usage),
             o.latency_s, o.model, o.cost_usd, o.tier, o.timed_out, o.job_id)
            for o in outcomes
        ]  # fmt: skip
        await self._db.executemany(
            "UPDATE jobs SET state = ?, attempts = ?, next_at = ?, lease_until = NULL, "
            "first_attempt_at = coalesce(first_attempt_at, ?), finished_at = ?, "
            "status_code = ?, error_type = ?, error_message = ?, request_id = ?, "
            "response = ?, tokens_in = ?, tokens_out = ?, tokens_cached = ?, "
            "tokens_cache_write = ?, tokens_cache_read = ?, tokens_reasoning = ?, "
            "latency_s = ?, model = ?, cost_usd = ?, tier = ?, timeouts = timeouts + ? "
            "WHERE id = ?",
            rows,
        )
        # Every failure, for `aiq show` (the row above keeps only the last); a success none.
        failures = [o for o in outcomes if o.error_type is not None and o.state != DONE]
        if failures:
            await self._db.executemany(
                "INSERT INTO errors (job_id, attempts, at, error_type, status_code, message, "
                "request_id, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (o.job_id, o.attempts, o.finished_at or o.started_at + (o.latency_s or 0.0),
                     o.error_type, o.status_code, o.error_message, o.request_id, o.state)
                    for o in failures
                ],
            )  # fmt: skip

    async def count_jobs(self) -> int:
        """Jobs in the store, in every state, from the kept tallies."""
        return (await tallies.job_counts(self._db))[0]

    async def replay_dead(
        self, *, error_type: str | None = None, job_ids: Sequence[int] | None = None
    ) -> int:
        """Move dead jobs (all, or of one error type, or among ``job_ids``) back to queued,
        attempts reset; returns how many."""
        # Not a pruned job (aiq.retention): its request is gone, there is nothing to send.
        where, params = "state = ? AND length(body) > 0", list[object]([DEAD])
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
            # rowcount: the jobs' rows alone (total_changes counts the tallies' triggers too).
            cur = await self._db.executemany(
                sql + " AND id = ?", [(QUEUED, *params, i) for i in dict.fromkeys(job_ids)]
            )
            return cur.rowcount


def _usage_row(u: Usage | None) -> tuple[int | None, ...]:
    """The token columns of an outcome: NULL for no reply, or a reply with unusable usage."""
    if u is None:
        return (None,) * 6
    return u.tokens_in, u.tokens_out, u.cached, u.cache_write, u.cache_read, u.reasoning
