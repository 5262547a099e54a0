"""The store's side of a run: the only code that touches the store while jobs are sent.

One task owns the store (claims and batched records never interleave on the connection).
It works in cycles: each records the outcomes that came in since the last one and claims
more jobs, in one transaction. Senders wake it when a batch of outcomes has piled up or the
queue runs low; otherwise it commits every ``_FLUSH_EVERY_S``. A result counts as done only
once its outcome is committed, so a crash loses at most the replies of jobs in flight, which
are sent again on resume. bench/README.md ("Pipeline") has the figures behind the constants.

An engine that sends drives a :class:`Dispatcher` through a small interface, the same for
the online worker (aiq.worker) and for an engine that sends jobs some other way (a provider's
batch API, issue 15): it takes claimed jobs with :meth:`~Dispatcher.next_job`, says which
went out with :meth:`~Dispatcher.sent`, hands back what became of each with
:meth:`~Dispatcher.finished` (an :class:`~aiq.records.Outcome`) or puts it off with
:meth:`~Dispatcher.defer`, and ends with :meth:`~Dispatcher.stop` (no more claims; what is
in flight finishes) and :meth:`~Dispatcher.close` (record the rest, release what was never
sent). :meth:`~Dispatcher.run` is the store task itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from .breaker import Breakers
from .joblog import JobNames, OnAttempt, attempt_event
from .records import DEAD, DONE, Job, Outcome
from .run_records import Progress
from .stops import TRUNCATED
from .store import JobStore

_FLUSH_EVERY_S = 0.05  # batch outcomes for at most this long before committing
_AHEAD = 8  # jobs kept claimed per sender: one in flight, the rest queued
_IDLE_POLL_S = 1.0  # how often to look for retries coming due when all else is idle
_RECOUNT_EVERY_S = 2.0  # how often the total is counted again (`aiq add` may add jobs meanwhile)


class _JobQueue(asyncio.Queue[Job | None]):
    """First in, first out, except for jobs back from waiting (retries, deferred jobs): those
    go to the front. A job deferred until its model's limiter has a slot would otherwise
    reach a sender only after every job claimed before it, seconds late, with the slot gone."""

    def _put(self, item: Job | None) -> None:  # asyncio.Queue's hook for subclasses
        if item is not None and item.due_at:
            self._queue.appendleft(item)  # type: ignore[attr-defined]
        else:
            self._queue.append(item)  # type: ignore[attr-defined]


class Dispatcher:
    """Claims jobs for the senders and records their outcomes, in batches, until nothing is
    due or :meth:`stop`. ``concurrency`` is how many send at once (the caller updates it as
    ``--concurrency auto`` resizes); ``breakers`` say when the provider is down, and then one
    job is claimed at a time, for the probe. Times: ``wall`` for what the store keeps,
    ``clock`` (monotonic) for its own pacing, and an injected ``sleep`` (not asyncio's) to
    wait on that clock for retries to come due."""

    def __init__(
        self,
        store: JobStore,
        progress: Progress,
        *,
        concurrency: int,
        breakers: Breakers,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        self._store = store
        # Only with a log that wants each attempt: the custom_ids it names them by.
        self._on_attempt = on_attempt
        self._names = JobNames(store) if on_attempt is not None else None
        self._progress = progress
        self.concurrency = concurrency
        self._breakers = breakers
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._queue = _JobQueue()
        # A sender's next job, or None once the run ends: the queue's own get, so taking a
        # job costs no coroutine of its own.
        self.next_job = self._queue.get
        self._pending: list[Outcome] = []  # outcomes not yet handed to the store
        self._sent: list[int] = []  # jobs whose request went out since the last store cycle
        self._deferred: list[tuple[float, int]] = []  # (next_at, id) of jobs put off, unsent
        self._claimed: dict[int, Job] = {}  # claimed and not yet recorded
        self._wake = asyncio.Event()
        self.stopping = False  # stop() was called: claim nothing more
        # Whether the last claim got all it asked for. If not, nothing more is due yet, and
        # waking the store task early to ask again would only cost a commit.
        self._more_due = True
        self._recount_at = clock() + _RECOUNT_EVERY_S
        self._next_due_at: float | None = None  # when nothing is claimed: the next job's due

    # -- the interface an engine uses ----------------------------------------------------

    def sent(self, job_id: int) -> None:
        """The job's request went out: its attempt is counted at the next store cycle."""
        self._sent.append(job_id)

    def finished(self, outcome: Outcome) -> None:
        """What became of a job; recorded at the next store cycle."""
        # Look up _pending only now: the store task swaps in a new list while senders wait.
        self._pending.append(outcome)
        if self._on_attempt is not None:  # a log wants it: nothing built otherwise
            self._log_attempt(outcome)
        if self._cycle_due() or (self.stopping and not self._progress.in_flight):
            self._wake.set()

    def _log_attempt(self, outcome: Outcome) -> None:
        assert self._on_attempt is not None and self._names is not None
        job = self._claimed.get(outcome.job_id)
        name = self._names.get(outcome.job_id)
        self._on_attempt(attempt_event(job, outcome, name, self._wall()))

    def defer(self, job_id: int, next_at: float) -> None:
        """Put an unsent job back in the store until ``next_at`` (wall clock), attempts kept."""
        self._deferred.append((next_at, job_id))
        if self._cycle_due():
            self._wake.set()

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish and are recorded (a drain)."""
        self.stopping = True
        self._wake.set()

    def end(self, takers: int) -> None:
        """Tell ``takers`` waiting in :meth:`next_job` that no job is coming (None each)."""
        for _ in range(takers):
            self._queue.put_nowait(None)

    async def close(self) -> None:
        """Record what is left, and release the jobs claimed and never sent to queued."""
        await self._flush()
        await self._store.release(list(self._claimed.values()))

    @property
    def drained(self) -> bool:
        """Whether nothing waits to be sent: every job claimed went to a sender, and the last
        claim found no more due (the batch's tail; senders may still wait for slots)."""
        return not self._more_due and not self._queue.qsize()

    @property
    def retry_in_s(self) -> float | None:
        """When nothing is claimed: how long until the next job comes due (None: jobs are
        claimed, or nothing is queued)."""
        if self._claimed or self._next_due_at is None:
            return None
        return self._next_due_at - self._wall()

    # -- the store task: one, so transactions never interleave ---------------------------

    async def run(self, on_cycle: Callable[[], None] | None = None) -> None:
        """Claim and record until nothing is queued anywhere, or stopped and drained.
        ``on_cycle`` runs before each cycle (--concurrency auto's tick)."""
        while True:
            if self.stopping:
                await self._flush()
                if not self._progress.in_flight:
                    return  # jobs still queued or held by the limiter are released by close()
                await self._nap(_FLUSH_EVERY_S)
                continue
            if self._clock() >= self._recount_at:
                await self._recount()
            if on_cycle is not None:
                on_cycle()
            worked = await self._cycle()
            if not self._claimed:  # nothing queued, waiting, in flight or unrecorded
                due = await self._store.next_due_at()
                if due is None:
                    return  # nothing queued anywhere: the run is complete
                self._next_due_at = due
                await self._nap(min(max(0.0, due - self._wall()), _IDLE_POLL_S))
            elif not worked or not self._cycle_due():
                await self._nap(_FLUSH_EVERY_S)

    async def _recount(self) -> None:
        """The total follows the store's, which grows when `aiq add` enqueues during the run."""
        self._recount_at = self._clock() + _RECOUNT_EVERY_S
        p = self._progress
        p.total = max(await self._store.count_jobs(), p.done + p.dead)

    def _cycle_due(self) -> bool:
        """Whether the senders need the store now: outcomes piled up, or the queue runs low."""
        return len(self._pending) + len(self._deferred) >= self.concurrency or (
            self._more_due and self._queue.qsize() <= self.concurrency
        )

    async def _nap(self, seconds: float) -> None:
        # Cleared only here, right before waiting: nothing can run between the caller's checks
        # and this, so no wake-up is lost, and one set during a cycle is not acted on twice.
        # asyncio.timeout, not wait_for: on Python 3.11, wait_for swallows a cancel that
        # arrives as the event is set (stop() sets it just before a second signal cancels
        # the run), so the second Ctrl-C would not abandon what is in flight.
        self._wake.clear()
        if self._sleep is not asyncio.sleep:  # an injected clock (tests): its sleep or a wake
            await self._nap_on_clock(seconds)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _nap_on_clock(self, seconds: float) -> None:
        """The nap on an injected sleep, so a retry not due yet comes due on its clock."""
        waits = (
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(self._sleep(seconds)),
        )
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _cycle(self) -> bool:
        """Record what finished and claim more, in one transaction; False if nothing to do.

        About ``_AHEAD`` jobs per sender stay claimed, so a sender that finishes finds the next
        job waiting: the queue still holds one per sender when they wake this task, which
        covers the time the transaction takes.
        """
        batch, self._pending = self._pending, []
        sent = self._unrecorded_sends(batch)
        deferred, self._deferred = self._deferred, []
        room = _AHEAD * self.concurrency - (len(self._claimed) - len(batch) - len(deferred))
        if room < self.concurrency:  # claiming a few at a time would cost a commit each
            room = 0
        if self._breakers.all_down:
            # The provider is down: claim nothing more, but one job for the probe.
            room = 0 if self._claimed else 1
        if not batch and not room and not sent and not deferred:
            return False
        jobs = await self._store.claim(
            room, now=self._wall(), record=batch, sent=sent, deferred=deferred
        )
        self._commit_progress(batch, deferred)
        if self._names is not None and jobs:
            await self._names.cover(jobs)
        if room:
            self._more_due = len(jobs) == room
        for job in jobs:
            self._claimed[job.id] = job
            self._queue.put_nowait(job)
        return True

    def _unrecorded_sends(self, batch: list[Outcome]) -> list[int]:
        """Jobs sent since the last cycle whose outcome is not in ``batch``: their attempt is
        written now. An outcome writes the attempts itself, so a fast reply needs no mark."""
        sent, self._sent = self._sent, []
        if sent and batch:
            recorded = {o.job_id for o in batch}
            sent = [i for i in sent if i not in recorded]
        return sent

    async def _flush(self) -> None:
        if not self._pending and not self._sent and not self._deferred:
            return
        batch, self._pending = self._pending, []
        deferred, self._deferred = self._deferred, []
        await self._store.record(batch, sent=self._unrecorded_sends(batch), deferred=deferred)
        self._commit_progress(batch, deferred)

    def _commit_progress(self, batch: list[Outcome], deferred: list[tuple[float, int]]) -> None:
        for _, job_id in deferred:
            self._claimed.pop(job_id, None)
        p = self._progress
        for o in batch:
            self._claimed.pop(o.job_id, None)
            if o.state == DONE:
                p.done += 1
                p.done_now += 1
                if o.usage is None:
                    p.unusable += 1  # never counted as 0 tokens, nor as less than that
                else:
                    p.tokens_in += o.usage.tokens_in
                    p.tokens_out += o.usage.tokens_out
                    p.kinds.add(o.usage)
                if o.cost_usd is None:
                    p.unpriced += 1
                else:
                    p.cost_usd += o.cost_usd
                p.billed(o.tier, o.cost_usd)
                if o.error_type is not None:  # a reply that stopped short (aiq.stops)
                    self._count_stop(o)
            elif o.state == DEAD:
                p.dead += 1
                p.dead_now += 1
                if o.response is not None:  # a reply cut off, dead by --on-truncated: billed
                    p.tokens_in += o.tokens_in or 0
                    p.tokens_out += o.tokens_out or 0
                    p.cost_usd += o.cost_usd or 0.0
                    p.billed(o.tier, o.cost_usd, done=False)
                    self._count_stop(o)
            elif o.next_at:  # a retry; a fatal error's job is requeued with no retry time
                p.retries += 1
        # A job added since the last count may be finished before the next: never done > total.
        p.total = max(p.total, p.done + p.dead)

    def _count_stop(self, o: Outcome) -> None:
        if o.error_type == TRUNCATED:
            self._progress.truncated += 1
        else:
            self._progress.filtered += 1
