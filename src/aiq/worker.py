"""The worker pool: claim → limit → send → record, until nothing is due or told to stop.

One task owns the store (claims and batched records never interleave on the connection);
``concurrency`` tasks send. A result counts as done only once its outcome is committed, so a
crash loses at most the replies of jobs in flight, which are sent again on resume.

The store task works in cycles: each records the outcomes that came in since the last one and
claims more jobs, in one transaction. Senders wake it when a batch of outcomes has piled up or
the queue runs low; otherwise it commits every ``_FLUSH_EVERY_S``. bench/README.md ("Pipeline")
has the figures behind the constants.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import backoff
from .limiter import RateLimiter
from .providers.base import Provider, ProviderError
from .store import DEAD, DONE, QUEUED, Job, JobStore, Outcome

_FLUSH_EVERY_S = 0.05  # batch outcomes for at most this long before committing
_AHEAD = 8  # jobs kept claimed per sender: one in flight, the rest queued
_IDLE_POLL_S = 1.0  # how often to look for retries coming due when all else is idle


@dataclass(slots=True)
class Progress:
    """Live counters of one run; every figure here is already committed to the store."""

    total: int = 0  # jobs in the store
    done: int = 0  # done in the store (including earlier runs)
    dead: int = 0
    done_now: int = 0  # finished by this run
    dead_now: int = 0
    retries: int = 0
    in_flight: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at

    @property
    def rate_per_s(self) -> float:
        """Jobs finished per second by this run."""
        elapsed = self.elapsed_s
        return self.done_now / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        remaining = self.total - self.done - self.dead
        if remaining <= 0:
            return 0.0
        rate = self.rate_per_s
        return remaining / rate if rate > 0 else None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many failures a job may have, and how long to wait between them."""

    max_attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 60.0


class Worker:
    """Works off a store with a provider. ``await worker.run()`` returns when done or stopped."""

    def __init__(
        self,
        store: JobStore,
        provider: Provider,
        *,
        concurrency: int,
        limiter: RateLimiter | None = None,
        retry: RetryPolicy = RetryPolicy(),
        progress: Progress | None = None,
        estimate_tokens: Callable[[Job], int] | None = None,
    ) -> None:
        self._store = store
        self._provider = provider
        self._concurrency = concurrency
        self._limiter = limiter or RateLimiter()
        self._retry = retry
        self._estimate = estimate_tokens
        self.progress = progress or Progress()
        self.fatal: ProviderError | None = None
        self._queue: asyncio.Queue[Job | None] = asyncio.Queue()
        self._pending: list[Outcome] = []  # outcomes not yet handed to the store
        self._claimed: dict[int, Job] = {}  # claimed and not yet recorded
        self._wake = asyncio.Event()
        self._stop = False
        # Whether the last claim got all it asked for. If not, nothing more is due yet, and
        # waking the store task early to ask again would only cost a commit.
        self._more_due = True

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish and are recorded (a drain)."""
        self._stop = True
        self._wake.set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called (by the caller, or by a fatal error)."""
        return self._stop

    async def run(self) -> Progress:
        """Work until nothing is queued, a fatal error, or ``stop()``; then release leftovers."""
        senders = [asyncio.create_task(self._send_loop()) for _ in range(self._concurrency)]
        try:
            await self._store_loop()
        finally:
            for _ in senders:
                self._queue.put_nowait(None)
            # Senders only exit via the sentinel once the store loop has ended, or on cancel.
            # No await separates the store loop's end from these cancels, so no sender can
            # start a request in between: each job is either recorded below or released.
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            await self._flush()
            await self._store.release(list(self._claimed))
        return self.progress

    # -- the store side: one task, so transactions never interleave ----------------------

    async def _store_loop(self) -> None:
        while True:
            if self._stop:
                await self._flush()
                if not self.progress.in_flight:
                    return  # jobs still queued or held by the limiter are released by run()
                await self._nap(_FLUSH_EVERY_S)
                continue
            worked = await self._cycle()
            if not self._claimed:  # nothing queued, waiting, in flight or unrecorded
                due = await self._store.next_due_at()
                if due is None:
                    return  # nothing queued anywhere: the run is complete
                await self._nap(min(max(0.0, due - time.time()), _IDLE_POLL_S))
            elif not worked or not self._cycle_due():
                await self._nap(_FLUSH_EVERY_S)

    def _cycle_due(self) -> bool:
        """Whether the senders need the store now: outcomes piled up, or the queue runs low."""
        return len(self._pending) >= self._concurrency or (
            self._more_due and self._queue.qsize() <= self._concurrency
        )

    async def _nap(self, seconds: float) -> None:
        # Cleared only here, right before waiting: nothing can run between the caller's checks
        # and this, so no wake-up is lost, and one set during a cycle is not acted on twice.
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _cycle(self) -> bool:
        """Record what finished and claim more, in one transaction; False if nothing to do.

        About ``_AHEAD`` jobs per sender stay claimed, so a sender that finishes finds the next
        job waiting: the queue still holds one per sender when they wake this task, which
        covers the time the transaction takes.
        """
        batch, self._pending = self._pending, []
        room = _AHEAD * self._concurrency - (len(self._claimed) - len(batch))
        if room < self._concurrency:  # claiming a few at a time would cost a commit each
            room = 0
        if not batch and not room:
            return False
        jobs = await self._store.claim(room, now=time.time(), record=batch)
        self._commit_progress(batch)
        if room:
            self._more_due = len(jobs) == room
        for job in jobs:
            self._claimed[job.id] = job
            self._queue.put_nowait(job)
        return True

    async def _flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        await self._store.record(batch)
        self._commit_progress(batch)

    def _commit_progress(self, batch: list[Outcome]) -> None:
        p = self.progress
        for o in batch:
            self._claimed.pop(o.job_id, None)
            if o.state == DONE:
                p.done += 1
                p.done_now += 1
                p.tokens_in += o.tokens_in or 0
                p.tokens_out += o.tokens_out or 0
            elif o.state == DEAD:
                p.dead += 1
                p.dead_now += 1
            elif o.next_at:  # a retry; a fatal error's job is requeued with no retry time
                p.retries += 1

    # -- the sending side ----------------------------------------------------------------

    async def _send_loop(self) -> None:
        queue, limiter, estimate, progress = (
            self._queue,
            self._limiter,
            self._estimate,
            self.progress,
        )
        while (job := await queue.get()) is not None:
            if self._stop:
                continue  # claimed but never started: released back to queued by run()
            await limiter.acquire(estimate(job) if estimate else 0)
            if self._stop:
                continue  # stopped while the limiter held us (a 429 pause): not sent
            progress.in_flight += 1
            try:
                outcome = await self._attempt(job)
            finally:
                progress.in_flight -= 1
            # Look up _pending only now: the store task swaps in a new list while we wait.
            self._pending.append(outcome)
            if self._cycle_due() or (self._stop and not progress.in_flight):
                self._wake.set()

    async def _attempt(self, job: Job) -> Outcome:
        started = time.time()
        try:
            reply = await self._provider.send(job.endpoint, job.body)
        except ProviderError as err:
            return self._failure(job, err, started)
        finished = time.time()
        return Outcome(
            job.id,
            DONE,
            job.attempts + 1,
            started_at=started,
            finished_at=finished,
            status_code=reply.status_code,
            request_id=reply.request_id,
            response=reply.body,
            tokens_in=reply.tokens_in,
            tokens_out=reply.tokens_out,
            latency_s=finished - started,
        )

    def _failure(self, job: Job, err: ProviderError, started: float) -> Outcome:
        now = time.time()
        out = Outcome(
            job.id,
            QUEUED,
            job.attempts,
            started_at=started,
            status_code=err.status_code,
            error_type=err.error_type,
            error_message=err.message,
            latency_s=now - started,
        )
        if err.fatal:
            # Not the job's fault: leave it as it was and stop the whole run.
            self.fatal = self.fatal or err
            self.stop()
            return out
        # A rate limit is the client's pace, not the job's fault: it costs no attempt.
        rate_limited = err.error_type == "rate_limit"
        if not rate_limited:
            out.attempts += 1
        wait_s = backoff.delay(
            max(1, out.attempts),
            base_s=self._retry.base_s,
            cap_s=self._retry.cap_s,
            retry_after_s=err.retry_after_s,
        )
        if err.retry_after_s is not None or rate_limited:
            # The server's pace holds for every request, not just this one: pause all senders
            # (for as long as it said, or for this job's backoff if it named no time).
            self._limiter.pause(err.retry_after_s if err.retry_after_s is not None else wait_s)
        if not err.retryable or out.attempts >= self._retry.max_attempts:
            out.state, out.finished_at = DEAD, now
            return out
        out.next_at = now + wait_s
        return out
