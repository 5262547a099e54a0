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
from dataclasses import dataclass

from . import backoff, tokens
from .breaker import OUTAGE_ERRORS, Breakers
from .concurrency import AutoConcurrency
from .costs import Charge, CostMeter
from .durations import duration_text
from .limiter import Limiters, RateLimiter, RequestTooLarge, Ticket
from .providers.base import Provider, ProviderError, Reply
from .records import DEAD, DONE, QUEUED, Job, Outcome
from .refusals import RefusalStreak
from .run_records import Progress
from .stops import TRUNCATED, stop_message
from .store import JobStore
from .text import quoted
from .timeouts import Timeouts
from .waits import ModelLimits, limits_text, waiting_text

_FLUSH_EVERY_S = 0.05  # batch outcomes for at most this long before committing
_AHEAD = 8  # jobs kept claimed per sender: one in flight, the rest queued
_IDLE_POLL_S = 1.0  # how often to look for retries coming due when all else is idle
_RECOUNT_EVERY_S = 2.0  # how often the total is counted again (`aiq add` may add jobs meanwhile)
# How often calls are checked against their learned timeout: a cut comes up to this late, a
# tenth of the shortest timeout (timeouts.FLOOR_S); a scan of ~1,500 calls, 10 times a second.
_SWEEP_S = 0.1
# With several models' limiters, a job whose limiter would hold its sender longer than this
# goes back to the store until its slot, and the sender takes the next job, so one model's
# slow limit does not hold up the others (head-of-line blocking).
_DEFER_AFTER_S = 0.1
# A job back from the store waits in its limiter up to this long before it is put off again:
# deferred jobs come back in batches (one per store cycle), a few slots apart, and going to
# the back of the line for a slot half a second away would leave the limit unused.
_REDEFER_AFTER_S = 5.0


class _JobQueue(asyncio.Queue[Job | None]):
    """First in, first out, except for jobs back from waiting (retries, deferred jobs): those
    go to the front. A job deferred until its model's limiter has a slot would otherwise
    reach a sender only after every job claimed before it, seconds late, with the slot gone."""

    def _put(self, item: Job | None) -> None:  # asyncio.Queue's hook for subclasses
        if item is not None and item.due_at:
            self._queue.appendleft(item)  # type: ignore[attr-defined]
        else:
            self._queue.append(item)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many failures a job may have, how long to wait between them, and how long a run
    waits for a provider that is down before it stops (exit 4, resumable)."""

    max_attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 60.0
    max_outage_s: float = 600.0


class Worker:
    """Works off a store with a provider. ``await worker.run()`` returns when done or stopped.

    ``concurrency`` None is ``--concurrency auto`` (aiq.concurrency): as many at once as the
    limits allow at the latency seen, up to ``max_concurrency``; ``held_by`` names what sets
    that bound, for ``Progress.held_by`` (default: "max_concurrency N").
    """

    def __init__(
        self,
        store: JobStore,
        provider: Provider,
        *,
        concurrency: int | None,
        max_concurrency: int = 256,
        held_by: str | None = None,
        limiter: RateLimiter | Limiters | None = None,
        breakers: Breakers | None = None,
        retry: RetryPolicy = RetryPolicy(),
        progress: Progress | None = None,
        costs: CostMeter | None = None,
        timeouts: Timeouts | None = None,
        on_truncated: str = "keep",
    ) -> None:
        self._store = store
        # --on-truncated: "dead" dead-letters a reply cut off at max_tokens (aiq.stops).
        self._dead_truncated = on_truncated == "dead"
        self._provider = provider
        if isinstance(limiter, RateLimiter):
            limiter = Limiters.shared(limiter)
        self._limiters = limiter or Limiters()
        self._auto: AutoConcurrency | None = None
        if concurrency is None:
            self._auto = AutoConcurrency(self._limiters, max_concurrency, held_by=held_by)
            concurrency = self._auto.size  # may send now
        self._concurrency = concurrency
        self._senders: list[asyncio.Task[None]] = []
        # One circuit breaker per endpoint and model (aiq.breaker.Breakers).
        self._breakers = breakers or Breakers()
        self._refusals = RefusalStreak()
        # Learned per-model timeouts under the ceiling (aiq.timeouts); None: the ceiling alone.
        self._timeouts = timeouts
        self._cuts: dict[int, int] = {}  # job id -> times a learned timeout cut it
        # Calls sent before their model's timeout was learned, with when they went: the
        # first reply that teaches it cuts those already past it (a hang among the first
        # calls would otherwise hold its sender for the whole ceiling).
        self._untimed: dict[str | None, dict[asyncio.Timeout, float]] = {}
        # Calls under a learned timeout -> when it cuts them; one sweep checks them all
        # (see _send_timed).
        self._deadlines: dict[asyncio.Timeout, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None  # the next sweep, while any is due
        self._retry = retry
        self.costs = costs or CostMeter({})  # prices each reply; keeps --max-cost
        self.progress = progress or Progress()
        self.progress.concurrency = self._concurrency
        self.progress.held_by = self._auto.held_by if self._auto is not None else None
        self.fatal: ProviderError | None = None
        self._queue = _JobQueue()
        self._pending: list[Outcome] = []  # outcomes not yet handed to the store
        self._sent: list[int] = []  # jobs whose request went out since the last store cycle
        self._deferred: list[tuple[float, int]] = []  # (next_at, id) of jobs put off, unsent
        self._claimed: dict[int, Job] = {}  # claimed and not yet recorded
        self._wake = asyncio.Event()
        self._stop = False
        # Whether the last claim got all it asked for. If not, nothing more is due yet, and
        # waking the store task early to ask again would only cost a commit.
        self._more_due = True
        self._probe_jobs: set[int] = set()  # jobs sent as the breaker's probe
        self._recount_at = time.monotonic() + _RECOUNT_EVERY_S
        self._next_due_at: float | None = None  # when nothing is claimed: the next job's due

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish and are recorded (a drain)."""
        self._stop = True
        self._wake.set()
        if self._auto is not None:  # senders waiting for a turn must see the stop
            self._auto.open()

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called (by the caller, or by a fatal error)."""
        return self._stop

    async def run(self) -> Progress:
        """Work until nothing is queued, a fatal error, or ``stop()``; then release leftovers."""
        self._add_senders(self._concurrency if self._auto is None else self._auto.senders)
        senders = self._senders  # grows while it runs, under --concurrency auto
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
            if self._sweeper is not None:  # its calls are over; none is left for a later run
                self._sweeper.cancel()
                self._sweeper = None
            await self._flush()
            await self._store.release(list(self._claimed.values()))
        return self.progress

    def note_waits(self) -> None:
        """Put in the progress the limits in force and what the run waits for, if anything.
        For the progress ticker (twice a second): it reads the limiters, nothing per request."""
        limiters = self._limiters
        models = []
        in_use: dict[str | None, RateLimiter | None] = {**limiters.in_use()} or {None: None}
        for model, limiter in in_use.items():
            given_rpm, given_tpm = limiters.configured(model)
            if limiter is None:  # nothing sent yet: what the settings say
                models.append(ModelLimits(model, given_rpm, given_tpm))
                continue
            rpm, tpm = limiter.limits.rpm, limiter.limits.tpm
            models.append(
                ModelLimits(
                    model, rpm, tpm,
                    rpm_learned=rpm is not None and rpm != given_rpm,
                    tpm_learned=tpm is not None and tpm != given_tpm,
                    wait_s=limiter.wait_s(),
                    paused_s=limiter.paused_s(),
                )
            )  # fmt: skip
        p = self.progress
        p.limits = limits_text(models)
        now = time.time()
        retry_in_s = None
        if not self._claimed and self._next_due_at is not None:
            retry_in_s = self._next_due_at - now
        if self._breakers.all_down or p.outage_s or p.done + p.dead >= p.total:
            p.waiting = None  # the outage note says it, or nothing is left to wait for
        else:
            p.waiting = waiting_text(models, now=now, in_flight=p.in_flight, retry_in_s=retry_in_s)

    def _add_senders(self, wanted: int) -> None:
        """Start sender tasks up to ``wanted``: under --concurrency auto as its size grows, so
        a bound of thousands costs no tasks until the limits need them."""
        for _ in range(wanted - len(self._senders)):
            self._senders.append(asyncio.create_task(self._send_loop()))

    def _resized(self) -> None:
        """--concurrency auto changed its size: more senders if it needs them."""
        auto = self._auto
        assert auto is not None
        self._concurrency = self.progress.concurrency = auto.size
        self.progress.held_by = auto.held_by
        self._add_senders(auto.senders)

    # -- the store side: one task, so transactions never interleave ----------------------

    async def _store_loop(self) -> None:
        while True:
            if self._stop:
                await self._flush()
                if not self.progress.in_flight:
                    return  # jobs still queued or held by the limiter are released by run()
                await self._nap(_FLUSH_EVERY_S)
                continue
            if time.monotonic() >= self._recount_at:
                await self._recount()
            if self._auto is not None and self._auto.tick():
                self._resized()
            worked = await self._cycle()
            if not self._claimed:  # nothing queued, waiting, in flight or unrecorded
                due = await self._store.next_due_at()
                if due is None:
                    return  # nothing queued anywhere: the run is complete
                self._next_due_at = due
                await self._nap(min(max(0.0, due - time.time()), _IDLE_POLL_S))
            elif not worked or not self._cycle_due():
                await self._nap(_FLUSH_EVERY_S)

    async def _recount(self) -> None:
        """The total follows the store's, which grows when `aiq add` enqueues during the run."""
        self._recount_at = time.monotonic() + _RECOUNT_EVERY_S
        p = self.progress
        p.total = max(await self._store.count_jobs(), p.done + p.dead)

    def _cycle_due(self) -> bool:
        """Whether the senders need the store now: outcomes piled up, or the queue runs low."""
        return len(self._pending) + len(self._deferred) >= self._concurrency or (
            self._more_due and self._queue.qsize() <= self._concurrency
        )

    async def _nap(self, seconds: float) -> None:
        # Cleared only here, right before waiting: nothing can run between the caller's checks
        # and this, so no wake-up is lost, and one set during a cycle is not acted on twice.
        # asyncio.timeout, not wait_for: on Python 3.11, wait_for swallows a cancel that
        # arrives as the event is set (stop() sets it just before a second signal cancels
        # the run), so the second Ctrl-C would not abandon what is in flight.
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _cycle(self) -> bool:
        """Record what finished and claim more, in one transaction; False if nothing to do.

        About ``_AHEAD`` jobs per sender stay claimed, so a sender that finishes finds the next
        job waiting: the queue still holds one per sender when they wake this task, which
        covers the time the transaction takes.
        """
        batch, self._pending = self._pending, []
        sent = self._unrecorded_sends(batch)
        deferred, self._deferred = self._deferred, []
        room = _AHEAD * self._concurrency - (len(self._claimed) - len(batch) - len(deferred))
        if room < self._concurrency:  # claiming a few at a time would cost a commit each
            room = 0
        if self._breakers.all_down:
            # The provider is down: claim nothing more, but one job for the probe.
            room = 0 if self._claimed else 1
        if not batch and not room and not sent and not deferred:
            return False
        jobs = await self._store.claim(
            room, now=time.time(), record=batch, sent=sent, deferred=deferred
        )
        self._commit_progress(batch, deferred)
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
        p = self.progress
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
                if o.error_type is not None:  # a reply that stopped short (aiq.stops)
                    self._count_stop(o)
            elif o.state == DEAD:
                p.dead += 1
                p.dead_now += 1
                if o.response is not None:  # a reply cut off, dead by --on-truncated: billed
                    p.tokens_in += o.tokens_in or 0
                    p.tokens_out += o.tokens_out or 0
                    p.cost_usd += o.cost_usd or 0.0
                    self._count_stop(o)
            elif o.next_at:  # a retry; a fatal error's job is requeued with no retry time
                p.retries += 1
        # A job added since the last count may be finished before the next: never done > total.
        p.total = max(p.total, p.done + p.dead)

    def _count_stop(self, o: Outcome) -> None:
        if o.error_type == TRUNCATED:
            self.progress.truncated += 1
        else:
            self.progress.filtered += 1

    # -- the sending side ----------------------------------------------------------------

    async def _send_loop(self) -> None:
        queue, auto = self._queue, self._auto
        if auto is None:
            while (job := await queue.get()) is not None:
                if not self._stop:  # else claimed, never started: released to queued by run()
                    await self._send(job)
            return
        while True:
            # The turn first, then the job: a task holding a job while it waits for a turn
            # could wait a long time (a condition's waiters are not served in order), and its
            # job with it, while later jobs went ahead.
            await auto.enter()
            try:
                job = await queue.get()
                if job is None:
                    return
                if not self._stop:
                    await self._send(job)
            finally:
                await auto.leave()

    async def _send(self, job: Job) -> None:
        """Wait for the provider and the budget, then send (released back to queued by run()
        if stopped meanwhile, or if the job would pass --max-cost)."""
        model = job.model if isinstance(job.model, str) else None
        # The breakers are nearly always closed: then no wait, and no coroutine to find that out.
        up = not (self._breakers.any_open or self.progress.outage_s)
        if not up and not await self._provider_up(job, model):
            return
        try:
            charge = self.costs.charge(job.body, model)
            if self.costs.cap_usd is not None and not await self.costs.admit(charge):
                self.stop()  # --max-cost: nothing more fits; what is in flight finishes
                return
            try:
                await self._send_admitted(job, model, charge)
            finally:
                self.costs.release(charge)  # unless settled by a reply
        finally:
            if job.id in self._probe_jobs:  # let out as the probe, but never sent
                self._probe_jobs.discard(job.id)
                self._breakers.get((job.endpoint, model)).cancel_probe()

    async def _send_admitted(self, job: Job, model: str | None, charge: Charge) -> None:
        """Wait for the limiter, send, and hand the outcome to the store."""
        limiter = self._limiters.for_model(model)
        ticket = limiter.ticket_now()
        if ticket is None:
            try:
                ticket = await self._acquire(job, limiter)
            except RequestTooLarge as exc:
                self._finish(self._too_large(job, exc))
                return
            if ticket is None:
                return  # deferred: back to the store until its slot
        if self._stop:
            limiter.refund(ticket)
            return  # stopped while the limiter (or the cost cap) held us: not sent
        progress = self.progress
        progress.in_flight += 1
        if progress.in_flight > progress.max_in_flight:
            progress.max_in_flight = progress.in_flight
        self._sent.append(job.id)  # its attempt is counted at the next store cycle
        started = time.time()
        try:
            if self._timeouts is None:
                reply = await self._provider.send(job.endpoint, job.body)
            else:
                reply = await self._send_timed(job, model, self._timeouts)
        except ProviderError as err:
            outcome = self._failure(job, err, started, ticket)
        else:
            outcome = self._success(job, reply, started, ticket, charge)
        finally:
            progress.in_flight -= 1
        if self._cuts and outcome.state != QUEUED:
            self._cuts.pop(job.id, None)
        self._finish(outcome)

    async def _send_timed(self, job: Job, model: str | None, timeouts: Timeouts) -> Reply:
        """Send, cut at the model's learned timeout (aiq.timeouts); the ceiling (--timeout)
        is the transport's read timeout, and applies alone when nothing was learned.

        Cut here rather than in the transport: the bound is on the whole call, whichever
        provider and transport, and the transport's timeouts stay the few it caches.
        """
        last = job.attempts + 1 >= self._retry.max_attempts  # the last gets the whole ceiling
        limit_s = timeouts.timeout_s(model, cuts=self._cuts.get(job.id, 0), last=last)
        untimed = None
        if limit_s is None and not last and timeouts.learned_s(model) is None:
            untimed = self._untimed.setdefault(model, {})
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            # No deadline of asyncio's own: a timer per call (~1,500 in flight at 500/s) cost
            # ~4% of aiq's CPU in the timer heap. A learned limit is kept in _deadlines, and
            # one sweep every _SWEEP_S cuts the calls past it the way asyncio.timeout would.
            async with asyncio.timeout(None) as bound:
                if limit_s is not None:
                    marks = self._deadlines
                    marks[bound] = start + limit_s
                    if self._sweeper is None:
                        self._sweeper = loop.call_later(_SWEEP_S, self._sweep, loop)
                elif untimed is not None:
                    marks = untimed
                    marks[bound] = start
                else:
                    return await self._provider.send(job.endpoint, job.body)
                try:
                    return await self._provider.send(job.endpoint, job.body)
                finally:
                    marks.pop(bound, None)
        except TimeoutError:
            self._cuts[job.id] = self._cuts.get(job.id, 0) + 1
            took_s = loop.time() - start
            raise ProviderError(
                "timeout",
                f"no reply in {took_s:.1f} s, aiq's timeout learned from this model's replies "
                f"({timeouts.rule.multiple:g}x their p99); the next attempt waits longer, "
                f"up to --timeout {timeouts.ceiling_s:g} s",
                retryable=True,
            ) from None

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cut the calls past their learned timeout (a TimeoutError in each, from asyncio's
        own timeout); look again in _SWEEP_S while any call has one."""
        now = loop.time()
        deadlines = self._deadlines
        for bound in [b for b, at in deadlines.items() if at <= now]:
            del deadlines[bound]
            bound.reschedule(now)
        self._sweeper = loop.call_later(_SWEEP_S, self._sweep, loop) if deadlines else None

    def _learned(self, model: str | None, latency_s: float) -> None:
        """Feed a reply's latency to the timeouts; once the model's is known, cut the calls
        sent before it that have run past it."""
        assert self._timeouts is not None
        self._timeouts.observe(model, latency_s)
        untimed = self._untimed.get(model)
        if untimed and (limit_s := self._timeouts.timeout_s(model)) is not None:
            for bound, start in untimed.items():
                bound.reschedule(start + limit_s)
            untimed.clear()  # each is cut or answered; their finally finds them gone

    def _finish(self, outcome: Outcome) -> None:
        # Look up _pending only now: the store task swaps in a new list while we wait.
        self._pending.append(outcome)
        if self._cycle_due() or (self._stop and not self.progress.in_flight):
            self._wake.set()

    async def _acquire(self, job: Job, limiter: RateLimiter) -> Ticket | None:
        """The job's ticket once its limiter lets it go; None if deferred instead."""
        cost = tokens.estimate(job.body) if limiter.counts_tokens else tokens.NO_COST
        if self._limiters.several and not self._stop:
            after_s = _REDEFER_AFTER_S if job.due_at else _DEFER_AFTER_S
            later_s = limiter.defer(cost.prompt, cost.reserved, after_s=after_s)
            if later_s is not None:
                self._deferred.append((time.time() + later_s, job.id))
                if self._cycle_due():
                    self._wake.set()
                return None
        if self._auto is None:
            return await limiter.acquire(cost.prompt, cost.reserved)
        async with self._auto.pacing():
            return await limiter.acquire(cost.prompt, cost.reserved)

    async def _provider_up(self, job: Job, model: str | None) -> bool:
        """Wait while the provider is down (every model's breaker open) and this job's model's
        breaker holds it; False if the run stops meanwhile. A job let out while it is open is
        its probe: only the probe's failure counts while open. While other models answer, a
        model whose breaker is open is broken, not down: its jobs go, and use up attempts."""
        breakers = self._breakers
        breaker = breakers.get((job.endpoint, model))
        while breakers.all_down and (wait := breaker.admit()) > 0:
            self.progress.outage_s = breakers.outage_s()
            if breakers.never_reached():
                self._give_up_on_endpoint()
            elif self.progress.outage_s > self._retry.max_outage_s:
                self._give_up_on_provider()
            if self._stop:
                return False
            await asyncio.sleep(min(wait, 0.5))
        self.progress.outage_s = breakers.outage_s()
        if breaker.is_open and breakers.all_down:
            self._probe_jobs.add(job.id)
        return not self._stop

    def _give_up_on_provider(self) -> None:
        self.fatal = self.fatal or ProviderError(
            "outage",
            f"the provider has failed every call for over "
            f"{duration_text(self._retry.max_outage_s)} (--max-outage), the last with "
            f"{quoted(self.progress.last_error)}; no job was charged for it. Check the "
            "provider's status page",
            fatal=True,
        )
        self.stop()

    def _give_up_on_refusals(self, err: ProviderError) -> None:
        """Every call refused with a 429 for longer than --max-outage: a limit that does not
        refill (a model that always fails, a quota nobody reports), not a pace to wait for."""
        self.fatal = self.fatal or ProviderError(
            "rate_limit",
            f"the provider has answered every call with 429 for over "
            f"{duration_text(self._retry.max_outage_s)} (--max-outage), the last with "
            f"{quoted(err.message)}; no job was charged for it. Check the account's limits "
            "for this model, then run aiq resume",
            fatal=True,
        )
        self.stop()

    def _give_up_on_endpoint(self) -> None:
        """No call has reached the endpoint: a wrong URL or a server not running, most likely;
        waiting --max-outage for it would only hide that."""
        self.fatal = self.fatal or ProviderError(
            "connection",
            f"{quoted(self.progress.last_error)}; no call has reached the endpoint in this run "
            "(each was refused, found no host or timed out connecting). Check --base-url and "
            "that the server is running",
            fatal=True,
        )
        self.stop()

    def _success(
        self, job: Job, reply: Reply, started: float, ticket: Ticket, charge: Charge
    ) -> Outcome:
        finished = time.time()
        limiter = ticket.limiter
        if reply.limits is not None:
            limiter.observe(reply.limits, ticket)
        limiter.settle(
            ticket, reply.tokens_in, output_tokens=reply.tokens_out, counted_in=reply.limited_in
        )
        if self._probe_jobs:
            self._probe_jobs.discard(job.id)
        self._breakers.record((job.endpoint, charge.model), False)
        self._refusals.succeeded()
        if self._timeouts is not None:
            self._learned(charge.model, finished - started)
        auto = self._auto
        if auto is not None and auto.observe(finished - started, self.progress.in_flight):
            self._resized()
        out = Outcome(
            job.id,
            DONE,
            job.attempts + 1,
            started_at=started,
            finished_at=finished,
            status_code=reply.status_code,
            request_id=reply.request_id,
            response=reply.body,
            usage=reply.usage,
            latency_s=finished - started,
            model=charge.model,
            cost_usd=self.costs.settle(charge, reply.usage),
        )
        if (stop := reply.stop) is not None:
            # Stored as sent either way, its stop named in error_type (status counts it); a
            # cut-off reply is dead with --on-truncated dead, for a replay with more tokens.
            dead = stop.kind == TRUNCATED and self._dead_truncated
            out.error_type = stop.kind
            out.error_message = stop_message(stop, reply.tokens_out, dead=dead)
            if dead:
                out.state = DEAD
        return out

    def _failure(self, job: Job, err: ProviderError, started: float, ticket: Ticket) -> Outcome:
        """Classify a failed attempt: retry later, dead-letter, or stop the run.

        An attempt is counted only when the failure is the job's own: not for a rate limit
        (the client's pace), a fatal error (the account or settings), or a provider that is
        down (the breaker is open).
        """
        now = time.time()
        limiter = ticket.limiter
        limiter.observe(err.limits, ticket)
        rate_limited = err.error_type == "rate_limit"
        retry_after_s = err.retry_after_s
        if rate_limited:
            limiter.refund(ticket)  # a 429 is not counted against the limits
            # ...and says to pace instead of bursting, or shows a limit nobody reported.
            retry_after_s = limiter.rate_limited(
                retry_after_s, upper_bound=err.retry_after_upper, ticket=ticket
            )
        else:
            limiter.answered(ticket, through=err.status_code is not None)
            if self._auto is not None and self._auto.refused(self.progress.in_flight):
                self._resized()
        outage_like = err.error_type in OUTAGE_ERRORS
        if outage_like:
            self.progress.last_error = err.message
        # No reply in time (not a 408, not a connection never made): it may have been billed.
        timed_out = err.error_type == "timeout" and err.status_code is None and not err.unreachable
        if timed_out:
            self.progress.timeouts += 1
        probe = job.id in self._probe_jobs
        self._probe_jobs.discard(job.id)
        breakers = self._breakers
        key = (job.endpoint, job.model if isinstance(job.model, str) else None)
        breakers.record(
            key, outage_like, probe=probe, unreachable=err.unreachable, took_s=now - started
        )
        # Down: every model fails so (not only this one), which is the provider's doing.
        down = outage_like and breakers.all_down
        never_reached = err.unreachable and not breakers.reach.reached
        own_fault = not (err.fatal or rate_limited or down or never_reached)
        out = Outcome(
            job.id,
            QUEUED,
            job.attempts + 1 if own_fault else job.attempts,
            started_at=started,
            status_code=err.status_code,
            error_type=err.error_type,
            error_message=err.message,
            latency_s=now - started,
            timed_out=timed_out,
        )
        if err.fatal:
            # Not the job's fault: leave it as it was and stop the whole run.
            self.fatal = self.fatal or err
            self.stop()
            return out
        if never_reached and breakers.never_reached():
            self._give_up_on_endpoint()
            return out
        # A 429 costs no attempt, so its backoff grows with the run's streak of refusals.
        rounds = self._refusals.refused() if rate_limited else 0
        wait_s = backoff.delay(
            max(1, out.attempts, rounds),
            base_s=self._retry.base_s,
            cap_s=self._retry.cap_s,
            retry_after_s=retry_after_s,
        )
        if retry_after_s is not None or rate_limited:
            # The server's pace holds for every request, not just this one: pause all senders
            # (for as long as it said, or for the streak's backoff if it named no time).
            pause_s = retry_after_s if retry_after_s is not None else wait_s
            limiter.pause(pause_s)
            if rate_limited:
                self._refusals.pausing(pause_s)
        if rate_limited and self._refusals.lasted_s() > self._retry.max_outage_s:
            self._give_up_on_refusals(err)
            return out
        if not err.retryable or out.attempts >= self._retry.max_attempts:
            out.state, out.finished_at = DEAD, now
            if outage_like and breakers.broken(key):
                out.error_message = (
                    f"{err.message}; most calls to {key[1] or 'this model'} failed so while other "
                    "models answered: its deployment may be down. Once it answers, run aiq "
                    f"replay-dead --error {err.error_type}, then aiq resume"
                )
            return out
        out.next_at = now + wait_s
        return out

    def _too_large(self, job: Job, exc: RequestTooLarge) -> Outcome:
        now = time.time()
        return Outcome(
            job.id,
            DEAD,
            job.attempts,
            started_at=now,
            finished_at=now,
            error_type="invalid_request",
            error_message=(
                f"request too large: it {exc} tokens per minute, so it can never be sent; "
                "shorten the prompt or lower max_tokens"
            ),
        )
