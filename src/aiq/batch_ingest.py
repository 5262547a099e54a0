"""An ended batch's results into the store (the last step of aiq.batch_engine): every job of
the batch done, dead (by the online error table) or queued again without costing an attempt,
exactly once, as its result lines say, a block of outcomes a transaction; and what came back
to the queue, by reason, in the run's record."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .batch_records import Batch, Requeue
from .batch_results import LineRules, count, over_token_limit
from .batch_wire import BatchKey, Polled
from .providers.base import ProviderError
from .providers.batches import BatchService
from .records import QUEUED, Job, Outcome
from .run_records import BatchRun, Progress
from .store import JobStore

_INGEST_BLOCK = 1000  # outcomes written per transaction while ingesting


class Ingested(NamedTuple):
    """What an ingest put back in the queue: why the jobs no line named came back (its
    ``token_limit`` paces the engine), those by reason, and the lines their own outcome
    queued again."""

    why: Requeue
    not_run: dict[str, list[int]]
    retried: int


class BatchIngest:
    """Writes batches' results through ``store``, reading the lines from ``api`` and each
    line's outcome from ``rules``; counts them in ``progress`` and ``record``."""

    def __init__(
        self,
        store: JobStore,
        api: BatchService,
        rules: LineRules,
        *,
        progress: Progress,
        record: BatchRun,
        max_attempts: int,
        note: Callable[[str], None],
    ) -> None:
        self._store = store
        self._api = api
        self._rules = rules
        self._progress = progress
        self._record = record
        self._max_attempts = max_attempts
        self._note = note

    async def ingest(self, batch: Batch, polled: Polled, key: BatchKey) -> Ingested:
        """Every job of an ended batch to done, dead or the queue, as its lines say; a job
        no line names is queued again: missing (an expired batch lists its unfinished lines
        in the error file, so one in neither file is missing, and counted towards dead), or
        cancelled or failed with its batch, or not ours (every line another batch's)."""
        jobs = await self._store.batch_jobs(batch.id)
        order = list(jobs)  # line N of the input file is the Nth job by id
        not_run: dict[str, list[int]] = {}
        retried, ours = await self._read_lines(batch, key, jobs, not_run)
        why: Requeue = "cancelled" if batch.state == "cancelled" else "missing"
        if not ours:
            # Every line is another batch's: a lost creation was found again wrongly (a
            # provider with no metadata, aiq.providers.anthropic_batches): no job's fault.
            why = "not_ours"
            self._note(f"batch {batch.id} {batch.provider_batch_id}: not this batch's lines")
        elif batch.state == "failed" and over_token_limit(polled.raw):
            why = "token_limit"  # the account's enqueued tokens: a pace, not the jobs' fault
        elif batch.state == "failed":
            why = "failed"
            block = self._rules.invalid_lines(polled.raw, jobs, order, started=batch.created_at)
            await self.write(batch, block)
            retried += sum(o.state == QUEUED for o in block)
        not_run.setdefault(why, []).extend(jobs)
        dead = await self._store.close_batch(
            batch.id, batch.state, not_run, retried=retried, missing_limit=self._max_attempts
        )
        self._progress.dead += dead
        self._progress.dead_now += dead
        return Ingested(why, not_run, retried)

    async def _read_lines(
        self, batch: Batch, key: BatchKey, jobs: dict[int, Job], not_run: dict[str, list[int]]
    ) -> tuple[int, bool]:
        """Ingest the batch's result lines, a block at a time, taking each line's job out
        of ``jobs`` (a line whose job is not there was ingested before a crash, or is not
        this batch's). Lines that never ran are put in ``not_run``; returns how many lines
        their own outcome queued again, and whether the lines could be this batch's (any
        names a job, or none came)."""
        retried = foreign = named = 0
        block: list[Outcome] = []
        async for line in self._api.lines(batch, key):
            if line is None:  # one file read: its lines in before the next is asked for
                await self.write(batch, block)
                block = []
                continue
            named += line.job_id is not None
            foreign += line.job_id is None
            job = None if line.job_id is None else jobs.pop(line.job_id, None)
            if job is None:
                continue
            result = self._rules.outcome(job, line, started=batch.created_at)
            if isinstance(result, str):
                not_run.setdefault(result, []).append(job.id)
                continue
            retried += result.state == QUEUED
            block.append(result)
            if len(block) >= _INGEST_BLOCK:
                await self.write(batch, block)
                block = []
        await self.write(batch, block)
        return retried, bool(named or not foreign)

    def collected(self, batch: Batch, not_run: dict[str, list[int]], retried: int) -> None:
        """The batch is ingested: say what came back to the queue, and record it."""
        self._record.collected.append(batch.id)
        counted = {r: len(ids) for r, ids in not_run.items() if ids}
        if retried:
            counted["retry"] = retried
        for reason, n in counted.items():
            self._record.requeued[reason] = self._record.requeued.get(reason, 0) + n
        again = ", ".join(f"{n:,} {r}" for r, n in counted.items()) or "none"
        self._note(f"batch {batch.id} {batch.provider_batch_id}: ingested; re-queued: {again}")

    async def refused(self, batch: Batch, err: ProviderError, *, started: float) -> None:
        """A batch whose creation was refused for good: every job gets the error."""
        jobs = await self._store.batch_jobs(batch.id)
        block = [self._rules.failed(job, err, started=started) for job in jobs.values()]
        await self.write(batch, block)
        retried = sum(o.state == QUEUED for o in block)
        await self._store.close_batch(batch.id, "refused", {}, retried=retried)
        self._note(f"batch {batch.id}: refused: {err.message}")

    async def write(self, batch: Batch, block: list[Outcome]) -> None:
        """Outcomes of ``batch``'s jobs, in one transaction, and counted."""
        await self._store.ingest(batch.id, block)
        count(self._progress, block)
