"""BatchQueue: the store's side of a provider's batch engine (aiq.batch_engine).

Each call is one transaction, and each step of a batch's life is written before the call
that follows it: planned with its jobs (they go ``running`` with the batch's id, so no other
run or batch takes them), its input file uploaded, the batch created, its results ingested.
A run killed between two of them finds, on resume, the last step written, and asks the
provider whether the next one happened before doing it again (aiq.batch_engine).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson

from .batch_records import Batch, Step
from .jobqueue import JobQueue
from .records import DEAD, QUEUED, RUNNING, Job, Outcome

_BATCH_COLUMNS = (
    "id, provider, endpoint, model, step, state, requests, created_at, updated_at, "
    "input_file_id, provider_batch_id, output_file_id, error_file_id, counts, requeued"
)
_DUE_MODEL = "json_extract(CAST(body AS TEXT), '$.model')"


def _batch(row: Sequence[Any]) -> Batch:
    *head, counts, requeued = row
    names = _BATCH_COLUMNS.replace(" ", "").split(",")[:-2]
    return Batch(
        **dict(zip(names, head, strict=True)),
        counts=orjson.loads(counts) if counts else {},
        requeued=orjson.loads(requeued) if requeued else {},
    )


class BatchQueue(JobQueue):
    """Batches planned from the queue, their steps, and their results written back."""

    async def store_tag(self) -> str:
        """This store's name in the provider's metadata and file names, made once: two stores
        sending to one account must never adopt each other's batches."""
        tag = await self.meta("store_tag")
        if tag is None:
            import secrets  # here: `aiq status` starts without it (hmac, random: ~3 ms)

            tag = secrets.token_hex(6)
            async with self.transaction(count=False):
                await self._db.execute(
                    "INSERT OR IGNORE INTO meta (name, value) VALUES ('store_tag', ?)", (tag,)
                )
            tag = await self.meta("store_tag")
            assert tag is not None
        return tag

    async def plan_batch(
        self, provider: str, *, now: float, max_requests: int, max_bytes: int, overhead: int
    ) -> Batch | None:
        """Take due queued jobs of one endpoint and model (the first to claim's: highest
        priority, then input order) into a new batch, in that order, of at most
        ``max_requests`` lines and ``max_bytes`` (a line is its body and ``overhead`` bytes
        more); None when nothing is due. One transaction: the batch and
        its jobs are written together, before anything is sent."""
        async with self.transaction():
            first = await self._db.execute_fetchall(
                f"SELECT endpoint, {_DUE_MODEL} FROM jobs WHERE state = ? AND next_at <= ? "
                "AND batch_id IS NULL ORDER BY priority DESC, id LIMIT 1",
                (QUEUED, now),
            )
            if not first:
                return None
            ((endpoint, model),) = first
            cur = await self._db.execute(
                "INSERT INTO batches (provider, endpoint, model, step, requests, created_at, "
                "updated_at) VALUES (?, ?, ?, 'planned', 0, ?, ?)",
                (provider, endpoint, model, now, now),
            )
            batch_id = cur.lastrowid
            assert batch_id is not None
            # The running size in id order, so the file stops under max_bytes (SQLite's
            # window functions: one pass, no body leaves SQLite).
            taken = await self._db.execute(
                "UPDATE jobs SET state = ?, batch_id = ?, lease_until = NULL, sent_at = ? "
                "WHERE id IN (SELECT id FROM (SELECT id, sum(length(body) + ?) OVER "
                "(ORDER BY priority DESC, id) AS size FROM jobs WHERE state = ? AND next_at <= ? "
                f"AND batch_id IS NULL AND endpoint = ? AND {_DUE_MODEL} IS ? "
                "ORDER BY priority DESC, id) "
                "WHERE size <= ? LIMIT ?)",
                (RUNNING, batch_id, now, overhead, QUEUED, now, endpoint, model, max_bytes,
                 max_requests),
            )  # fmt: skip
            if not taken.rowcount:  # one body alone over max_bytes: the caller's check
                raise ValueError(f"a request of {endpoint} is over {max_bytes} bytes")
            await self._db.execute(
                "UPDATE batches SET requests = ? WHERE id = ?", (taken.rowcount, batch_id)
            )
        batch = await self.batch(batch_id)
        assert batch is not None
        return batch

    async def oversized(self, *, max_bytes: int, overhead: int) -> list[int]:
        """Queued jobs whose line alone is over ``max_bytes``: no batch can carry them."""
        rows = await self._db.execute_fetchall(
            "SELECT id FROM jobs WHERE state = ? AND batch_id IS NULL AND length(body) + ? > ?",
            (QUEUED, overhead, max_bytes),
        )
        return [r[0] for r in rows]

    async def batch(self, batch_id: int) -> Batch | None:
        rows = list(
            await self._db.execute_fetchall(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ?", (batch_id,)
            )
        )
        return _batch(rows[0]) if rows else None

    async def batches(self, *, open_only: bool = False, last: int | None = None) -> list[Batch]:
        """The store's batches, oldest first: the open ones, or the ``last`` few and every
        open one."""
        where = "step != 'ingested'" if open_only else "1"
        if last is not None:
            where += f" OR id > (SELECT coalesce(max(id), 0) - {int(last)} FROM batches)"
            where += " OR step != 'ingested'"
        rows = await self._db.execute_fetchall(
            f"SELECT {_BATCH_COLUMNS} FROM batches WHERE {where} ORDER BY id"
        )
        return [_batch(r) for r in rows]

    async def in_batches(self) -> int:
        """Jobs in open batches (on the partial index of batch_id)."""
        ((n,),) = await self._db.execute_fetchall(
            "SELECT count(*) FROM jobs WHERE batch_id IS NOT NULL"
        )
        return int(n)

    async def requeued_total(self) -> dict[str, int]:
        """Lines put back in the queue by every batch, by reason."""
        total: dict[str, int] = {}
        rows = await self._db.execute_fetchall(
            "SELECT requeued FROM batches WHERE requeued IS NOT NULL"
        )
        for (value,) in rows:
            for reason, n in orjson.loads(value).items():
                total[reason] = total.get(reason, 0) + n
        return total

    async def save_step(self, batch_id: int, step: Step | None = None, **fields: Any) -> None:
        """Write a batch's step and what the provider answered (ids, state, counts)."""
        if step is not None:
            fields["step"] = step
        if "counts" in fields:
            fields["counts"] = orjson.dumps(fields["counts"]).decode()
        fields["updated_at"] = time.time()
        names = ", ".join(f"{name} = ?" for name in fields)
        async with self.transaction(count=False):
            await self._db.execute(
                f"UPDATE batches SET {names} WHERE id = ?", (*fields.values(), batch_id)
            )

    async def batch_lines(self, batch_id: int) -> AsyncIterator[list[tuple[int, str, bytes]]]:
        """The batch's (job id, endpoint, body), a thousand at a time, in id order: the
        order of its input file's lines."""
        async with self._db.execute(
            "SELECT id, endpoint, body FROM jobs WHERE batch_id = ? ORDER BY id", (batch_id,)
        ) as cur:
            cur.arraysize = 1000
            while rows := await cur.fetchmany():
                yield [(i, e, bytes(b)) for i, e, b in rows]

    async def batch_jobs(self, batch_id: int) -> dict[int, Job]:
        """The jobs still in the batch, by id in line order, without their bodies (what
        an outcome is built from)."""
        rows = await self._db.execute_fetchall(
            f"SELECT id, endpoint, attempts, first_attempt_at, {_DUE_MODEL} FROM jobs "
            "WHERE batch_id = ? ORDER BY id",
            (batch_id,),
        )
        return {i: Job(i, e, b"", a, f, m) for i, e, a, f, m in rows}

    async def ingest(self, batch_id: int, outcomes: Sequence[Outcome]) -> None:
        """Write some of a batch's results, and take their jobs out of it, in one
        transaction: a run killed mid-ingest finds the rest still in the batch."""
        if not outcomes:
            return
        async with self.transaction():
            await self._write_outcomes(outcomes)
            await self._db.executemany(
                "UPDATE jobs SET batch_id = NULL, sent_at = NULL, missing = 0 "
                "WHERE id = ? AND batch_id = ?",
                [(o.job_id, batch_id) for o in outcomes],
            )

    async def close_batch(
        self,
        batch_id: int,
        state: str | None,
        requeue: Mapping[str, Sequence[int]],
        *,
        retried: int = 0,
        missing_limit: int | None = None,
    ) -> int:
        """The batch ingested: its jobs left in it back to the queue, due now and their
        attempts as they were (why, by reason, kept for status, with the ``retried`` lines
        whose own outcome queued them again). A job ``missing`` from ``missing_limit``
        batches is dead instead; returns how many were."""
        now = time.time()
        dead = 0
        async with self.transaction():
            for ids in requeue.values():
                await self._db.executemany(
                    "UPDATE jobs SET state = ?, batch_id = NULL, sent_at = NULL, next_at = 0, "
                    "lease_until = NULL WHERE id = ? AND batch_id = ?",
                    [(QUEUED, i, batch_id) for i in ids],
                )
            if missing := requeue.get("missing"):
                await self._db.executemany(
                    "UPDATE jobs SET missing = missing + 1 WHERE id = ?", [(i,) for i in missing]
                )
                if missing_limit is not None:
                    cur = await self._db.executemany(
                        "UPDATE jobs SET state = ?, finished_at = ?, error_type = 'bad_response', "
                        "error_message = 'the provider returned no result for this request in ' "
                        "|| missing || ' batches in a row (neither output nor error file named "
                        "it); run aiq replay-dead to try again, or send it --via online' "
                        "WHERE id = ? AND missing >= ?",
                        [(DEAD, now, i, missing_limit) for i in missing],
                    )
                    dead = cur.rowcount
            counted = {reason: len(ids) for reason, ids in requeue.items() if ids}
            if retried:
                counted["retry"] = retried
            await self._db.execute(
                "UPDATE batches SET step = 'ingested', state = coalesce(?, state), "
                "requeued = ?, updated_at = ? WHERE id = ?",
                (state, orjson.dumps(counted).decode(), now, batch_id),
            )
        return dead
