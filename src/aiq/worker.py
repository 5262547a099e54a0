"""The worker pool: claim → limit → send → record, until nothing is due or told to stop.

One task owns the store (claims and batched records never interleave on the connection);
``concurrency`` tasks send. A result counts as done only once its outcome is committed, so a
crash loses at most the replies of jobs in flight, which are sent again on resume.
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
        self._pending: list[Outcome] = []
        self._claimed: dict[int, Job] = {}  # claimed and not yet recorded
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish and are recorded (a drain)."""
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> Progress:
        """Work until nothing is queued, a fatal error, or ``stop()``; then release leftovers."""
        senders = [asyncio.create_task(self._send_loop()) for _ in range(self._concurrency)]
        try:
            await self._store_loop()
        finally:
            for _ in senders:
                self._queue.put_nowait(None)
            # Senders only exit via the sentinel once the store loop has ended, or on cancel.
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            await self._store.record(self._pending)
            self._commit_progress(self._pending)
            self._pending = []
            await self._store.release(list(self._claimed))
        return self.progress

    # -- the store side: one task, so transactions never interleave ----------------------

    async def _store_loop(self) -> None:
        while True:
            await self._flush()
            if self.stopping:
                if not self.progress.in_flight:
                    return
            else:
                await self._top_up()
                if not self._claimed and not self._pending:
                    due = await self._store.next_due_at()
                    if due is None:
                        return  # nothing queued anywhere: the run is complete
                    wait = min(max(0.0, due - time.time()), _IDLE_POLL_S)
                    await self._nap(wait)
                    continue
            await self._nap(_FLUSH_EVERY_S)

    async def _nap(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _top_up(self) -> None:
        """Keep about two jobs per sender claimed, so no sender waits on the store."""
        room = 2 * self._concurrency - self._queue.qsize() - self.progress.in_flight
        if room < max(1, self._concurrency // 2):
            return
        for job in await self._store.claim(room, now=time.time()):
            self._claimed[job.id] = job
            self._queue.put_nowait(job)

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
        while (job := await self._queue.get()) is not None:
            if self.stopping:
                continue  # claimed but never started: released back to queued at the end
            self.progress.in_flight += 1
            try:
                outcome = await self._attempt(job)
            finally:
                self.progress.in_flight -= 1
            # Look up _pending only now: the store loop swaps in a new list while we wait.
            self._pending.append(outcome)
            if len(self._pending) >= self._concurrency:
                self._wake.set()

    async def _attempt(self, job: Job) -> Outcome:
        await self._limiter.acquire(self._estimate(job) if self._estimate else 0)
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
        if err.retry_after_s is not None:
            self._limiter.pause(err.retry_after_s)
        # A rate limit is the client's pace, not the job's fault: it costs no attempt.
        if err.error_type != "rate_limit":
            out.attempts += 1
        if not err.retryable or out.attempts >= self._retry.max_attempts:
            out.state, out.finished_at = DEAD, now
            return out
        out.next_at = now + backoff.delay(
            max(1, out.attempts),
            base_s=self._retry.base_s,
            cap_s=self._retry.cap_s,
            retry_after_s=err.retry_after_s,
        )
        return out
