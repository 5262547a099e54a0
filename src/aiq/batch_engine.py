"""``--via batch``: the store's queued jobs sent through the provider's batch engine (OpenAI's
Batch API, Anthropic's Message Batches), not one call each.

The engine talks to a :class:`aiq.providers.batches.BatchService`; it names no provider. A
batch's life, each step written before the call that follows it (aiq.batchqueue):

1. **planned**: due queued jobs of one endpoint and model, at most the service's limits
   (OpenAI: 50,000 and 200 MB; Anthropic: 100,000 and 256 MB), taken into a batch (running,
   with its id) in one transaction;
2. **uploaded** (a service that ``uploads``: OpenAI): its input file written from the store
   and sent (``POST /v1/files``);
3. **created**: the batch created (OpenAI: from the file, metadata naming the store and the
   batch; Anthropic: the requests in the create call itself, written from the store);
4. polled with backoff until it ends, then its results read back and **ingested**: every
   job of the batch ends exactly once, done, dead (by the online error table,
   aiq.outcomes), or queued again without costing an attempt (expired, cancelled, failed
   with the rest of a batch, missing from the results): aiq.batch_ingest.

A run killed between two steps finds the last one written. Before doing the next again, it
asks the provider whether that happened: a file of the batch's name is looked for among the
uploads, the batch among the batches (:meth:`BatchService.find_batch`); an open batch is
adopted and polled. So no job is submitted twice and no result is lost. ``detach`` submits
and returns; the next run collects.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from .batch_files import write_requests
from .batch_ingest import BatchIngest
from .batch_records import Batch
from .batch_results import LineRules, oversized
from .batch_wire import BatchKey, Polled
from .errors import FatalProviderError
from .outcomes import RetryPolicy
from .pricing import Price
from .providers.base import ProviderError
from .providers.batches import Answers, BatchService
from .run_records import BatchRun, Progress
from .store import JobStore

_POLL_FIRST_S = 0.2  # the first look at a new batch; doubled each unchanged look...
_POLL_CAP_S = 60.0  # ...up to this

_PACE_FIRST_S = 1.0  # the first wait after a batch failed on the enqueued-token limit
Note = Callable[[str], None]
# Asked at each wake of the run (--via auto with a deadline, aiq.auto_run): the seconds until
# it must be asked again, or 0 or less to stop the run there and switch to online.
Watch = Callable[[], Awaitable[float]]


class BatchEngine:
    """Drives a store's batches through one account's batch API. ``answers`` reads a line's
    reply exactly as an online call's (the provider's online class); ``prices`` price done
    jobs at half their list price (aiq.batch_results)."""

    submits = True  # plans and submits what is due (aiq.batch_cancel's engine does not)

    def __init__(
        self,
        store: JobStore,
        api: BatchService,
        answers: Answers,
        *,
        provider: str,
        files_dir: Path,
        progress: Progress,
        prices: Mapping[str, Price],
        retry: RetryPolicy,
        note: Note = lambda _: None,
        poll_cap_s: float = _POLL_CAP_S,
        wall: Callable[[], float] = time.time,
        watch: Watch | None = None,
    ) -> None:
        self._store = store
        self._api = api
        self._rules = LineRules(answers, prices=prices, retry=retry, wall=wall)
        self._provider = provider
        self._dir = files_dir
        self.progress = progress
        self._note = note
        self._poll_cap_s = poll_cap_s
        self._wall = wall
        self.run_record = BatchRun()
        self._results = BatchIngest(
            store, api, self._rules, progress=progress, record=self.run_record,
            max_attempts=retry.max_attempts, note=note,
        )  # fmt: skip
        self._fresh: set[int] = set()  # batches whose next call this process never tried
        self._not_before: dict[int, float] = {}  # batch -> when its next call may go
        self._poll_s: dict[int, float] = {}  # batch -> the wait before its next look
        self._failures: dict[int, int] = {}  # batch -> calls failed in a row
        self._plan_after = 0.0  # no new batch before this (the enqueued-token limit)
        self.stopping = False
        self._wake = asyncio.Event()
        self._pace_s = 0.0
        self._tag = ""
        self._watch = watch
        self.switching = False  # the watch said to stop and switch to online

    async def run(self, *, detach: bool = False) -> BatchRun:
        """Adopt the open batches, submit what is due, and (unless ``detach``) wait for every
        batch to end and ingest it, submitting what comes back due meanwhile."""
        self._tag = await self._store.store_tag()
        self._dir.mkdir(parents=True, exist_ok=True)
        record = self.run_record
        record.detached = detach
        await self._dead_oversized()
        while not self.stopping:
            look_again_s = self._poll_cap_s
            if self._watch is not None and (look_again_s := await self._watch()) <= 0:
                self.switching = True
                break
            for batch in await self._store.batches(open_only=True):
                if self.stopping:
                    break
                await self._advance(batch)
            while not self.stopping and (planned := await self._plan()) is not None:
                await self._advance(planned)
            open_now = await self._store.batches(open_only=True)
            record.open = len(open_now)
            if detach or self.stopping:
                break
            now = self._wall()
            if not open_now:
                due = await self._store.next_due_at() if self.submits else None
                if due is None:
                    break
                await self._nap(min(max(due, self._plan_after) - now, look_again_s))
                continue
            soonest = min(self._not_before.get(b.id, now) for b in open_now) - now
            await self._nap(min(soonest, look_again_s))
        return record

    def stop(self) -> None:
        """Stop at the next step's end (a signal, --max-runtime): what is with the provider
        stays there, recorded, for resume; no call is cut halfway."""
        self.stopping = True
        self._wake.set()

    async def _nap(self, seconds: float) -> None:
        """Wait ``seconds``, or until :meth:`stop`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self._wake.wait()

    # -- the steps --------------------------------------------------------------------------

    def _pace(self) -> None:
        """A batch failed on the account's enqueued-token limit: plan no new batch for a
        while (doubling, up to the poll cap), until the open ones have made room."""
        self._pace_s = min(self._poll_cap_s, max(_PACE_FIRST_S, self._pace_s * 2))
        self._plan_after = self._wall() + self._pace_s
        self._note(
            f"the provider's enqueued-token limit is reached: next batch in {self._pace_s:.0f} s"
        )

    async def _plan(self) -> Batch | None:
        if self._wall() < self._plan_after:
            return None
        limits = self._api.limits
        batch = await self._store.plan_batch(
            self._provider, now=self._wall(), max_requests=limits.max_requests,
            max_bytes=limits.max_bytes, overhead=limits.overhead,
        )  # fmt: skip
        if batch is not None:
            self._fresh.add(batch.id)
            model = f" ({batch.model})" if batch.model else ""
            self._note(
                f"batch {batch.id}: planned {batch.requests:,} requests of {batch.endpoint}{model}"
            )
        return batch

    async def _advance(self, batch: Batch) -> None:
        """Take ``batch`` as far as it goes now: upload, create, one look, ingest."""
        if self._not_before.get(batch.id, 0.0) > self._wall():
            return
        try:
            if batch.step == "planned" and self._api.uploads:
                batch = await self._upload(batch)
            ready = "uploaded" if self._api.uploads else "planned"
            if batch.step == ready and not self.stopping:
                batch = await self._create(batch)
            if batch.step == "created" and not self.stopping:
                await self._look(batch)
        except ProviderError as err:
            self._failed_call(batch, err)

    def _failed_call(self, batch: Batch, err: ProviderError) -> None:
        """A call about ``batch`` failed: a fatal error stops the run (every job kept); any
        other is tried again later, after asking whether it happened after all."""
        if err.fatal:
            raise FatalProviderError(
                f"the provider refused batch {batch.id}: {err.message}; every job is kept, fix "
                "it and run `aiq resume`"
            )
        self._fresh.discard(batch.id)  # its answer may be lost: look before sending again
        n = self._failures[batch.id] = self._failures.get(batch.id, 0) + 1
        wait_s = err.retry_after_s or min(self._poll_cap_s, 0.5 * 2.0**n)
        self._not_before[batch.id] = self._wall() + wait_s
        self._note(f"batch {batch.id}: {err.message}; trying again in {wait_s:.0f} s")

    def _filename(self, batch: Batch) -> str:
        return f"aiq-{self._tag}-b{batch.id}.jsonl"

    def _key(self, batch: Batch) -> BatchKey:
        return BatchKey(
            tag=self._tag, batch_id=batch.id, endpoint=batch.endpoint, requests=batch.requests,
            planned_at=batch.created_at,
        )  # fmt: skip

    async def _upload(self, batch: Batch) -> Batch:
        name = self._filename(batch)
        found = None
        if batch.id not in self._fresh:
            found = await self._api.find_file(name, since=batch.created_at)
        if found is None:
            path = self._dir / name
            await write_requests(self._store, batch.id, path)
            self._fresh.discard(batch.id)  # from here its answer can be lost
            found = await self._api.upload(path, name)
            path.unlink(missing_ok=True)
        await self._store.save_step(batch.id, "uploaded", input_file_id=found["id"])
        self._fresh.add(batch.id)
        self._note(f"batch {batch.id}: uploaded {found['id']}")
        return await self._reread(batch)

    async def _create(self, batch: Batch) -> Batch:
        found = None
        if batch.id not in self._fresh:
            ours = await self._store.batches()
            known = frozenset(b.provider_batch_id for b in ours if b.provider_batch_id)
            found = await self._api.find_batch(self._key(batch), known=known)
        if found is None:
            path = self._dir / self._filename(batch)
            if not self._api.uploads:
                batch = await self._write_requests(batch, path)
                if batch.requests == 0:
                    path.unlink(missing_ok=True)
                    await self._store.close_batch(batch.id, "refused", {})
                    return await self._reread(batch)
            self._fresh.discard(batch.id)
            try:
                found = await self._api.create(
                    self._key(batch), input_file_id=batch.input_file_id, path=path
                )
            except ProviderError as err:
                if err.retryable or err.fatal or err.error_type == "rate_limit":
                    raise
                # Refused for good (a bad file, an endpoint not offered): each job's own
                # error, by the error table.
                await self._results.refused(batch, err, started=self._wall())
                return await self._reread(batch)
            finally:
                if not self._api.uploads:
                    path.unlink(missing_ok=True)
        self._not_before.pop(batch.id, None)
        self._failures.pop(batch.id, None)
        await self._store.save_step(
            batch.id, "created", provider_batch_id=found.id, state=found.state,
            counts=found.counts,
        )  # fmt: skip
        self.run_record.submitted.append(batch.id)
        self.run_record.submitted_lines += batch.requests
        self._note(f"batch {batch.id}: created {found.id} ({batch.requests:,} requests)")
        return await self._reread(batch)

    async def _write_requests(self, batch: Batch, path: Path) -> Batch:
        """The batch's requests written to ``path`` for a create that carries them; a job
        the provider cannot run (no faithful translation) is dead at once, out of the batch,
        and the batch's count is what remains: written before the create, as its size is
        what a lost creation is found again by."""
        written = await write_requests(
            self._store, batch.id, path, encode=self._api.encode(self._key(batch)),
            frame=self._api.frame,
        )  # fmt: skip
        if written.refused:
            jobs = await self._store.batch_jobs(batch.id)
            now = self._wall()
            block = [self._rules.failed(jobs[i], err, started=now) for i, err in written.refused]
            await self._results.write(batch, block)
            self._note(
                f"batch {batch.id}: {len(block):,} of its requests refused; the first: "
                f"{block[0].error_message}"
            )
        if written.requests != batch.requests:  # also after a crash between the two writes
            await self._store.save_step(batch.id, requests=written.requests)
        return await self._reread(batch)

    async def _reread(self, batch: Batch) -> Batch:
        again = await self._store.batch(batch.id)
        assert again is not None
        return again

    async def _look(self, batch: Batch) -> None:
        """Poll the batch once; ingest it if it has ended, else look again later (backoff)."""
        polled = await self._api.get(str(batch.provider_batch_id))
        state, counts = polled.state, polled.counts
        if state != batch.state or counts != batch.counts:
            await self._store.save_step(
                batch.id, state=state, counts=counts, output_file_id=polled.output_file_id,
                error_file_id=polled.error_file_id,
            )  # fmt: skip
            self._poll_s[batch.id] = _POLL_FIRST_S
            done, failed = counts.get("completed", 0), counts.get("failed", 0)
            self._note(
                f"batch {batch.id} {batch.provider_batch_id}: {state}, "
                f"{done:,}/{counts.get('total', batch.requests):,} done, {failed:,} failed"
            )
        if polled.ended:
            await self._ingest(await self._reread(batch), polled)
            return
        wait_s = self._poll_s.get(batch.id, _POLL_FIRST_S)
        self._poll_s[batch.id] = min(self._poll_cap_s, wait_s * 2)
        self._not_before[batch.id] = self._wall() + wait_s

    async def _ingest(self, batch: Batch, polled: Polled) -> None:
        """An ended batch's results into the store (aiq.batch_ingest); a batch failed on the
        account's enqueued-token limit paces the next ones, a completed one ends that."""
        ingested = await self._results.ingest(batch, polled, self._key(batch))
        if ingested.why == "token_limit":
            self._pace()
        elif batch.state == "completed":
            self._pace_s = 0.0
        self._collected(batch, ingested.not_run, ingested.retried)

    def _collected(self, batch: Batch, not_run: dict[str, list[int]], retried: int) -> None:
        """The batch is ingested: forget its pacing, and say what came back to the queue."""
        self._poll_s.pop(batch.id, None)
        self._not_before.pop(batch.id, None)
        self._results.collected(batch, not_run, retried)

    async def _dead_oversized(self) -> None:
        """A request too big for any input file can never go by batch: dead at once."""
        limits = self._api.limits
        ids = await self._store.oversized(max_bytes=limits.max_bytes, overhead=limits.overhead)
        if not ids:
            return
        block = oversized(ids, limits.max_bytes, now=self._wall())
        await self._store.record(block)
        self.progress.dead += len(block)
        self.progress.dead_now += len(block)
