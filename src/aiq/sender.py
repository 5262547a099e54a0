"""One job's way out and back: breaker, cost cap, rate limiter, provider, then the dispatcher.

:meth:`Sender.send` waits while the provider is down (its circuit breaker open), admits the
job under ``--max-cost``, waits for its model's rate limiter (or puts the job off until its
slot, when other models' jobs could go meanwhile), sends it, cut at the model's learned
timeout, and hands what became of it to the dispatcher (aiq.dispatch). What becomes of it is
decided by aiq.outcomes, purely; this module feeds the limiter, the breakers and the
concurrency the reply or the error, and stops the run when the decision says so.

The token estimate of a job is made at most once a send, and only when the cost cap or a
tokens-per-minute limit needs it. Time: ``wall`` for the store's timestamps, ``sleep`` to
wait out an outage, the event loop's own clock for the cut-offs (asyncio's timeouts run on
it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from . import outcomes, tokens
from .breaker import Breakers
from .concurrency import AutoConcurrency
from .costs import Charge, CostMeter
from .dispatch import Dispatcher
from .limiter import RateLimiter, RequestTooLarge, Ticket
from .limiters import Limiters
from .loop_turns import LoopTurns
from .outcomes import NO_REFUSALS, Health, Refusals, RetryPolicy
from .pause_test import PauseTest
from .providers.base import Provider, ProviderError, Reply
from .records import QUEUED, Job, Outcome
from .refusals import RefusalStreak
from .run_records import Progress
from .timed_calls import TimedCalls
from .timeouts import Timeouts

# With several models' limiters, a job whose limiter would hold its sender longer than this
# goes back to the store until its slot, and the sender takes the next job, so one model's
# slow limit does not hold up the others (head-of-line blocking).
_DEFER_AFTER_S = 0.1
# A job back from the store waits in its limiter up to this long before it is put off again:
# deferred jobs come back in batches (one per store cycle), a few slots apart, and going to
# the back of the line for a slot half a second away would leave the limit unused.
_REDEFER_AFTER_S = 5.0


# A 429's wait at least this long, or this many replies' latency, cut short by its pause
# test, says the server was full. (LiteLLM's parallel limit asks for its minute's turn: a
# second or two, near a minute's end.)
_FULL_WAIT_S = 5.0
_FULL_REPLIES = 4


class Sender:
    """Sends jobs for the worker's sender tasks, any number at once; ``fatal`` is the error
    that stopped the run, if one did. ``stop`` stops the run (the worker's, which also lets
    every sender waiting for a turn see it); ``resized`` is called when ``auto`` changed its
    size."""

    def __init__(
        self,
        dispatch: Dispatcher,
        provider: Provider,
        *,
        progress: Progress,
        limiters: Limiters,
        breakers: Breakers,
        costs: CostMeter,
        retry: RetryPolicy,
        timeouts: Timeouts | None,
        auto: AutoConcurrency | None,
        dead_truncated: bool,
        stop: Callable[[], None],
        resized: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._dispatch = dispatch
        self._provider = provider
        self._progress = progress
        self._limiters = limiters
        self._breakers = breakers
        self.costs = costs
        self._retry = retry
        self._auto = auto
        self._dead_truncated = dead_truncated  # --on-truncated dead (aiq.stops)
        self._stop = stop
        self._resized = resized
        self._wall = wall
        self._sleep = sleep
        self._refusals = RefusalStreak(clock)
        self._probe_jobs: set[int] = set()  # jobs sent as the breaker's probe
        # In flight at the 429 whose pause is being tested, if it asked for a long wait (a
        # full server's tell: LiteLLM's parallel limit asks for its minute's turn); 0: not.
        self._tested_in_flight = 0
        self._pause_test = PauseTest()  # how soon 429s come back, to decide a test early
        self._testing: Ticket | None = None  # the pause's test, while it is out
        self._turns = LoopTurns()
        self.fatal: ProviderError | None = None
        # Calls cut at their model's learned timeout (aiq.timed_calls); None: the ceiling alone.
        self._timed = None
        if timeouts is not None:
            self._timed = TimedCalls(timeouts, retry.max_attempts, lambda: dispatch.drained)

    def close(self) -> None:
        """The run's calls are over: no sweep is left for a later run."""
        if self._timed is not None:
            self._timed.close()

    async def send(self, job: Job) -> None:
        """Wait for the provider and the budget, then send (released back to queued by the
        dispatcher if stopped meanwhile, or if the job would pass --max-cost)."""
        if not self._turns.go_now():  # a burst's senders start a turn's share at a time
            await self._turns.wait()
        model = job.model if isinstance(job.model, str) else None
        # The breakers are nearly always closed: then no wait, and no coroutine to find that out.
        up = not (self._breakers.any_open or self._progress.outage_s)
        if not up and not await self._provider_up(job, model):
            return
        try:
            costs = self.costs
            capped = costs.cap_usd is not None
            cost = tokens.estimate(job.body) if capped else None  # the cap needs it now
            charge = costs.charge(job.body, model, cost)
            if capped and not await costs.admit(charge):
                self._stop()  # --max-cost: nothing more fits; what is in flight finishes
                return
            try:
                await self._send_admitted(job, model, charge, cost)
            finally:
                costs.release(charge)  # unless settled by a reply
        finally:
            if job.id in self._probe_jobs:  # let out as the probe, but never sent
                self._probe_jobs.discard(job.id)
                self._breakers.get((job.endpoint, model)).cancel_probe()

    async def _send_admitted(
        self, job: Job, model: str | None, charge: Charge, cost: tokens.TokenCost | None
    ) -> None:
        """Wait for the limiter, send, and hand the outcome to the dispatcher."""
        limiter = self._limiters.for_model(model)
        auto = self._auto
        if auto is not None and limiter.blind and (delay_s := auto.send_delay_s()) > 0:
            await self._sleep(delay_s)
        ticket = limiter.ticket_now()
        if ticket is None:
            try:
                ticket = await self._acquire(job, limiter, cost)
            except RequestTooLarge as exc:
                self._dispatch.finished(outcomes.too_large(job, str(exc), now=self._wall()))
                return
            if ticket is None:
                return  # deferred: back to the store until its slot
        if self._dispatch.stopping:
            limiter.refund(ticket)
            return  # stopped while the limiter (or the cost cap) held us: not sent
        progress = self._progress
        cuts = 0 if self._auto is None else self._auto.cuts
        progress.in_flight += 1
        if progress.in_flight > progress.max_in_flight:
            progress.max_in_flight = progress.in_flight
        self._dispatch.sent(job.id)  # its attempt is counted at the next store cycle
        started = self._wall()
        self._watch(ticket)
        try:
            if self._timed is None:
                reply = await self._provider.send(job.endpoint, job.body)
            else:
                reply = await self._timed.send(self._provider, job, model)
        except ProviderError as err:
            outcome = self._failed(job, err, started, ticket)
            full = err.error_type == "rate_limit" and ticket.limiter.server_full
        else:
            outcome = self._replied(job, reply, started, ticket, charge)
            full = False
        finally:
            progress.in_flight -= 1
            if self._testing is ticket:
                self._testing = None
        if self._timed is not None and outcome.state != QUEUED:
            self._timed.done(job.id)
        self._dispatch.finished(outcome)
        if full:
            await self._one_too_many(outcome, cuts)

    async def _one_too_many(self, outcome: Outcome, cuts: int) -> None:
        """A full server's 429: this sender was one too many. It waits out the job's backoff
        before taking another (the others go on), or it would send the next job into the
        same full server at once, a 429 a millisecond."""
        wait_s = max(0.0, outcome.next_at - self._wall())
        if self._auto is None:
            await asyncio.sleep(wait_s)
        else:
            await self._auto.one_too_many(cuts, wait_s)

    async def _acquire(
        self, job: Job, limiter: RateLimiter, cost: tokens.TokenCost | None
    ) -> Ticket | None:
        """The job's ticket once its limiter lets it go; None if deferred instead."""
        if not limiter.counts_tokens:
            cost = tokens.NO_COST
        elif cost is None:
            cost = tokens.estimate(job.body)
        if self._limiters.several and not self._dispatch.stopping:
            after_s = _REDEFER_AFTER_S if job.due_at else _DEFER_AFTER_S
            later_s = limiter.defer(cost.prompt, cost.reserved, after_s=after_s)
            if later_s is not None:
                self._dispatch.defer(job.id, self._wall() + later_s)
                return None
        auto = self._auto
        if auto is None:
            return await limiter.acquire(cost.prompt, cost.reserved)
        paced = limiter.paces
        async with auto.pacing(paced=paced):
            ticket = await limiter.acquire(cost.prompt, cost.reserved)
        if paced or not auto.over or self._dispatch.stopping:
            return ticket
        # The size was cut while a 429's pause held this sender (the server found full as
        # the pause ended): not one more into it. The job goes back to the store for a
        # sender within the size: waiting at the gate with it, this one deadlocked behind
        # the senders that held the gate waiting for a job (it was the last).
        limiter.refund(ticket)
        self._dispatch.defer(job.id, self._wall())
        return None

    def _watch(self, ticket: Ticket) -> None:
        """A request whose answer the others wait for goes out: let in once a 429 would be
        back (aiq.pause_test). A 429's pause's test, or a calendar minute's first past its
        turn (:meth:`RateLimiter.let_in_turn`)."""
        if ticket.full_probe:
            self._testing = ticket
            self._pause_test.watch(lambda: self._testing is ticket, lambda: self._let_in(ticket))
        elif ticket.turn_look:
            limiter = ticket.limiter
            self._pause_test.watch(lambda: ticket.turn_look, lambda: limiter.let_in_turn(ticket))

    def _let_in(self, ticket: Ticket) -> None:
        """The pause's test is out past the time a 429 takes (aiq.pause_test): the server let
        it in, as if its reply had come, and a full server is cut now, not a latency later."""
        limiter = ticket.limiter
        limiter.let_in(ticket)
        tested, self._tested_in_flight = self._tested_in_flight, 0
        if self._auto is not None and tested and limiter.server_full and self._auto.full(tested):
            self._resized()

    async def _provider_up(self, job: Job, model: str | None) -> bool:
        """Wait while the provider is down (every model's breaker open) and this job's model's
        breaker holds it; False if the run stops meanwhile. A job let out while it is open is
        its probe: only the probe's failure counts while open. While other models answer, a
        model whose breaker is open is broken, not down: its jobs go, and use up attempts."""
        breakers, progress = self._breakers, self._progress
        breaker = breakers.get((job.endpoint, model))
        while breakers.all_down and (wait := breaker.admit()) > 0:
            progress.outage_s = breakers.outage_s()
            if breakers.never_reached():
                self._give_up(outcomes.endpoint_lost(progress.last_error))
            elif progress.outage_s > self._retry.max_outage_s:
                self._give_up(outcomes.provider_down(self._retry.max_outage_s, progress.last_error))
            if self._dispatch.stopping:
                return False
            await self._sleep(min(wait, 0.5))
        progress.outage_s = breakers.outage_s()
        if breaker.is_open and breakers.all_down:
            self._probe_jobs.add(job.id)
        return not self._dispatch.stopping

    def _give_up(self, fatal: ProviderError) -> None:
        self.fatal = self.fatal or fatal  # the first reason stands
        self._stop()

    def _replied(
        self, job: Job, reply: Reply, started: float, ticket: Ticket, charge: Charge
    ) -> Outcome:
        """Feed a reply to the limiter, the breakers, the timeouts and the concurrency."""
        finished = self._wall()
        self._pause_test.replied(finished - started)
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
        if self._timed is not None:
            self._timed.replied(charge.model, finished - started)
        auto = self._auto
        if auto is not None:
            tested = self._tested_in_flight
            if ticket.full_probe and tested and limiter.server_full and auto.full(tested):
                self._resized()  # (the pause it went through was a full server's)
            if auto.observe(finished - started, self._progress.in_flight):
                self._resized()
        return outcomes.replied(
            job,
            reply,
            started=started,
            finished=finished,
            model=charge.model,
            cost_usd=self.costs.settle(charge, reply.usage, reply.tier),
            dead_truncated=self._dead_truncated,
        )

    def _failed(self, job: Job, err: ProviderError, started: float, ticket: Ticket) -> Outcome:
        """Feed a failure to the limiter, the concurrency and the breakers, then act on what
        aiq.outcomes decides: pause every sender, stop the run."""
        now = self._wall()
        limiter = ticket.limiter
        rate_limited = err.error_type == "rate_limit"
        if rate_limited:
            self._pause_test.refused(now - started)
        tested = limiter.pause_tested
        retry_after_s = self._limiter_failed(err, ticket, rate_limited)
        full = rate_limited and limiter.server_full
        held = rate_limited and limiter.pause_tested
        if held and not tested:
            # The 429 whose pause is tested. A wait asked far longer than the test takes is a
            # full server's, not a busy one's: random 429s asking a few hundred ms (the
            # simulated provider's) passed the test too, and the cut held a demo at 4.
            enough_s = min(_FULL_WAIT_S, _FULL_REPLIES * self._pause_test.fastest_reply_s)
            long = (err.retry_after_s or 0.0) >= enough_s
            self._tested_in_flight = self._progress.in_flight if long else 0
        if full:
            retry_after_s = err.retry_after_s  # (the job's, if sooner than its backoff)
        health = self._breakers_failed(job, err, took_s=now - started)
        refusals = NO_REFUSALS
        # (A fatal one ends the run: no round. A full server's is no streak: it takes others.)
        if outcomes.refused(err) and not err.fatal and not full:
            refusals = Refusals(self._refusals.refused(), self._refusals.lasted_s())
        fate = outcomes.failed(
            job, err, policy=self._retry, health=health, started=started, now=now,
            retry_after_s=retry_after_s, refusals=refusals, full=full, held=held,
        )  # fmt: skip
        if fate.outcome.timed_out:
            self._progress.timeouts += 1
        if fate.pause_s is not None:
            limiter.pause(fate.pause_s)
            if outcomes.refused(err):
                self._refusals.pausing(fate.pause_s)
        if fate.give_up is not None:
            last = self._progress.last_error
            self._give_up(outcomes.given_up(fate.give_up, err, policy=self._retry, last_error=last))
        return fate.outcome

    def _breakers_failed(self, job: Job, err: ProviderError, took_s: float) -> Health:
        """Feed a failure to the job's model's breaker; the provider's health after it."""
        outage = outcomes.outage_like(err)
        if outage:
            self._progress.last_error = err.message
        probe = job.id in self._probe_jobs
        self._probe_jobs.discard(job.id)
        breakers = self._breakers
        key = (job.endpoint, job.model if isinstance(job.model, str) else None)
        breakers.record(key, outage, probe=probe, unreachable=err.unreachable, took_s=took_s)
        return Health(
            down=breakers.all_down,
            reached=breakers.reach.reached,
            unreachable=breakers.never_reached(),
            broken=breakers.broken(key),
        )

    def _limiter_failed(
        self, err: ProviderError, ticket: Ticket, rate_limited: bool
    ) -> float | None:
        """Feed a failure to its limiter (and a 429 to auto's size); the delay to honour."""
        limiter = ticket.limiter
        limiter.observe(err.limits, ticket, refused=outcomes.refused(err))
        if err.error_type == "capacity":
            # Out of capacity (a flex tier's): backed off, not paced to. The limiter learns
            # nothing from it, and the provider counted nothing against the limits.
            limiter.refund(ticket)
            return err.retry_after_s
        if not rate_limited:
            limiter.answered(ticket, through=err.status_code is not None)
            return err.retry_after_s
        limiter.refund(ticket)  # a 429 is not counted against the limits
        # With no limit known, 429s are the server saying it is full (a gateway's parallel
        # limit): auto's size is cut. (Other errors say nothing of its capacity.)
        if self._auto is not None and self._auto.refused(self._progress.in_flight):
            self._resized()
        # ...and says to pace instead of bursting, or shows a limit nobody reported.
        return limiter.rate_limited(
            err.retry_after_s, upper_bound=err.retry_after_upper, ticket=ticket, stated=err.stated
        )
