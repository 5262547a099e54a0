"""Calls cut at their model's learned timeout (aiq.timeouts), one sweep for them all.

A hang among replies that take milliseconds is cut in seconds, a four-minute generation
never: each model's timeout is learned from its replies, under the ceiling (``--timeout``,
the transport's read timeout, which applies alone until one is learned). Calls sent before
their model's is known are cut by the first reply that teaches it, if they are past it.
"""

from __future__ import annotations

import asyncio

from .providers.base import Provider, ProviderError, Reply
from .records import Job
from .timeouts import Timeouts

# How often calls are checked against their learned timeout: a cut comes up to this late, a
# fifth of the shortest timeout (timeouts.FLOOR_S); a scan of ~1,500 calls, 20 times a second.
_SWEEP_S = 0.05


class TimedCalls:
    """The provider's calls under learned per-model timeouts: :meth:`send` one,
    :meth:`replied` with each reply's latency, :meth:`done` once a job is no longer queued,
    :meth:`close` at the run's end."""

    def __init__(self, timeouts: Timeouts, max_attempts: int) -> None:
        self.timeouts = timeouts
        self._max_attempts = max_attempts
        self._cuts: dict[int, int] = {}  # job id -> times a learned timeout cut it
        # Calls sent before their model's timeout was learned, with when they went: the
        # first reply that teaches it cuts those already past it (a hang among the first
        # calls would otherwise hold its sender for the whole ceiling).
        self._untimed: dict[str | None, dict[asyncio.Timeout, float]] = {}
        # Every call out, per model, with when it went: a burst's first replies are its
        # fastest, and those still out say so (aiq.timeouts OUT_SHARE).
        self._out: dict[str | None, dict[asyncio.Timeout, float]] = {}
        # Calls under a learned timeout -> when it cuts them; one sweep checks them all
        # (see send).
        self._deadlines: dict[asyncio.Timeout, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None  # the next sweep, while any is due

    def close(self) -> None:
        """The run's calls are over: no sweep is left for a later run."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def done(self, job_id: int) -> None:
        """The job is no longer queued: its cuts are forgotten."""
        self._cuts.pop(job_id, None)

    async def send(self, provider: Provider, job: Job, model: str | None) -> Reply:
        """Send, cut at the model's learned timeout (aiq.timeouts); the ceiling (--timeout)
        is the transport's read timeout, and applies alone when nothing was learned.

        Cut here rather than in the transport: the bound is on the whole call, whichever
        provider and transport, and the transport's timeouts stay the few it caches.
        """
        timeouts = self.timeouts
        last = job.attempts + 1 >= self._max_attempts  # the last gets the whole ceiling
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
                marks = None
                if limit_s is not None:
                    marks = self._deadlines
                    marks[bound] = start + limit_s
                    if self._sweeper is None:
                        self._sweeper = loop.call_later(_SWEEP_S, self._sweep, loop)
                elif untimed is not None:
                    marks = untimed
                    marks[bound] = start
                out = self._out.setdefault(model, {})
                out[bound] = start
                timeouts.sending(model, start)
                try:
                    return await provider.send(job.endpoint, job.body)
                finally:
                    del out[bound]
                    if marks is not None:
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
                cut=True,
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

    def replied(self, model: str | None, latency_s: float) -> None:
        """Feed a reply's latency to the timeouts; once the model's is known, cut the calls
        sent before it that have run past it."""
        out = self._out.get(model, {})
        now = asyncio.get_running_loop().time()
        self.timeouts.observe(model, latency_s, now=now, out=out.values())
        untimed = self._untimed.get(model)
        if untimed and (limit_s := self.timeouts.timeout_s(model)) is not None:
            for bound, start in untimed.items():
                bound.reschedule(start + limit_s)
            untimed.clear()  # each is cut or answered; their finally finds them gone
