"""The worker pool: claim → limit → send → record, until nothing is due or told to stop.

A :class:`Worker` is three parts along a job's path, and the sender tasks that join them:

- aiq.dispatch: the store's side, the one task that claims jobs and records outcomes;
- aiq.sender: one job through the breaker, the cost cap and the limiter to the provider;
- aiq.outcomes: what becomes of the job, decided purely from the reply or the error.

``concurrency`` sender tasks (or as many as ``--concurrency auto`` asks, aiq.concurrency)
each take a job from the dispatcher and send it, one at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from .breaker import Breakers
from .concurrency import AutoConcurrency
from .costs import CostMeter
from .dispatch import Dispatcher
from .joblog import OnAttempt
from .limiter import RateLimiter
from .limiters import Limiters
from .outcomes import RetryPolicy
from .providers.base import Provider, ProviderError
from .run_records import Progress
from .sender import Sender
from .store import JobStore
from .text import quoted
from .timeouts import Timeouts
from .waits import ModelLimits, limits_text, waiting_text

__all__ = ["Progress", "RetryPolicy", "Worker", "quoted"]

_RETRY = RetryPolicy()  # frozen: one default serves every worker


class Worker:
    """Works off a store with a provider. ``await worker.run()`` returns when done or stopped.

    ``concurrency`` None is ``--concurrency auto`` (aiq.concurrency): as many at once as the
    limits allow at the latency seen, up to ``max_concurrency``; ``held_by`` names what sets
    that bound, for ``Progress.held_by`` (default: "max_concurrency N"). Time comes from
    ``clock`` (monotonic), ``wall`` (the store's timestamps) and ``sleep``, for every part
    the worker makes (the limiters and breakers it is given keep their own).
    ``on_attempt`` hears what each attempt came to (aiq.joblog), for a log; None costs nothing.
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
        retry: RetryPolicy = _RETRY,
        progress: Progress | None = None,
        costs: CostMeter | None = None,
        timeouts: Timeouts | None = None,
        on_truncated: str = "keep",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        self._limiters = _limiters(limiter, clock=clock, wall=wall, sleep=sleep)
        self._limiters.backlog = self._backlog
        self._auto: AutoConcurrency | None = None
        if concurrency is None:
            self._auto = AutoConcurrency(
                self._limiters, max_concurrency, held_by=held_by, clock=clock
            )
            concurrency = self._auto.size  # may send now
        # One circuit breaker per endpoint and model (aiq.breaker.Breakers).
        self._breakers = breakers or Breakers(clock=clock)
        self._wall = wall
        self.progress = progress or Progress()
        self.progress.concurrency = concurrency
        self.progress.held_by = self._auto.held_by if self._auto is not None else None
        self._dispatch = Dispatcher(
            store, self.progress, concurrency=concurrency, breakers=self._breakers,
            clock=clock, wall=wall, sleep=sleep, on_attempt=on_attempt,
        )  # fmt: skip
        self._sender = Sender(
            self._dispatch, provider, progress=self.progress, limiters=self._limiters,
            breakers=self._breakers, costs=costs or CostMeter({}), retry=retry,
            timeouts=timeouts, auto=self._auto, dead_truncated=on_truncated == "dead",
            stop=self.stop, resized=self._resized, clock=clock, wall=wall, sleep=sleep,
        )  # fmt: skip
        self.costs = self._sender.costs  # prices each reply; keeps --max-cost
        self._senders: list[asyncio.Task[None]] = []

    def _backlog(self) -> float:
        """Jobs that wait to go besides the one asking its limiter (every model's: a model
        whose own are done holds its window's last few back until the turn they look for)."""
        p = self.progress
        return max(0, p.total - p.done - p.dead - p.in_flight - 1)

    @property
    def fatal(self) -> ProviderError | None:
        """The error that stopped the run (bad key, quota, an outage over --max-outage)."""
        return self._sender.fatal

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish and are recorded (a drain)."""
        self._dispatch.stop()
        if self._auto is not None:  # senders waiting for a turn must see the stop
            self._auto.open()

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called (by the caller, or by a fatal error)."""
        return self._dispatch.stopping

    async def run(self) -> Progress:
        """Work until nothing is queued, a fatal error, or ``stop()``; then release leftovers."""
        self._add_senders(self._senders_wanted())
        senders = self._senders  # grows while it runs, with auto's size and the jobs left
        try:
            await self._dispatch.run(self._tick)
        finally:
            self._dispatch.end(len(senders))
            # Senders only exit via the sentinel once the store loop has ended, or on cancel.
            # No await separates the store loop's end from these cancels, so no sender can
            # start a request in between: each job is either recorded below or released.
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            self._sender.close()
            await self._dispatch.close()
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
        if self._breakers.all_down or p.outage_s or p.done + p.dead >= p.total:
            p.waiting = None  # the outage note says it, or nothing is left to wait for
        else:
            retry_in_s = self._dispatch.retry_in_s
            p.waiting = waiting_text(
                models, now=self._wall(), in_flight=p.in_flight, retry_in_s=retry_in_s
            )

    def _add_senders(self, wanted: int) -> None:
        """Start sender tasks up to ``wanted``: under --concurrency auto as its size grows, so
        a bound of thousands costs no tasks until the limits need them."""
        for _ in range(wanted - len(self._senders)):
            self._senders.append(asyncio.create_task(self._send_loop()))

    def _senders_wanted(self) -> int:
        """The sender tasks the concurrency wants, but no more than jobs are left: told only
        --tpm, auto's size is the machine's bound until a request's cost is known, and
        20,000 tasks started for 70 jobs held the loop for 0.1 s, the first request's pace
        slot with it (tests/test_limits.py). (A total not counted yet: no cap.)"""
        auto, p = self._auto, self.progress
        wanted = self._dispatch.concurrency if auto is None else auto.senders
        return min(wanted, max(1, p.total - p.done - p.dead)) if p.total else wanted

    def _tick(self) -> None:
        """Before each store cycle: --concurrency auto reconsiders its size, and jobs added
        since the last count (`aiq add`) may want more senders."""
        if self._auto is not None and self._auto.tick():
            self._resized()
        elif len(self._senders) < (wanted := self._senders_wanted()):
            self._add_senders(wanted)

    def _resized(self) -> None:
        """--concurrency auto changed its size: more senders if it needs them."""
        auto = self._auto
        assert auto is not None
        self._dispatch.concurrency = self.progress.concurrency = auto.size
        self.progress.held_by = auto.held_by
        self._add_senders(self._senders_wanted())

    async def _send_loop(self) -> None:
        dispatch, send, auto = self._dispatch, self._sender.send, self._auto
        next_job = dispatch.next_job
        if auto is None:
            while (job := await next_job()) is not None:
                if not dispatch.stopping:  # else claimed, never started: released at the end
                    await send(job)
            return
        while True:
            # The turn first, then the job: a task holding a job while it waits for a turn
            # could wait a long time (a condition's waiters are not served in order), and its
            # job with it, while later jobs went ahead.
            await auto.enter()
            try:
                job = await next_job()
                if job is None:
                    return
                if not dispatch.stopping:
                    await send(job)
            finally:
                await auto.leave()


def _limiters(
    limiter: RateLimiter | Limiters | None,
    *,
    clock: Callable[[], float],
    wall: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
) -> Limiters:
    """The run's limiters: those given, or one per model on the worker's clock."""
    if isinstance(limiter, RateLimiter):
        return Limiters.shared(limiter)
    if limiter is not None:
        return limiter
    return Limiters(
        make=lambda rpm, tpm: RateLimiter(rpm=rpm, tpm=tpm, clock=clock, wall=wall, sleep=sleep)
    )
