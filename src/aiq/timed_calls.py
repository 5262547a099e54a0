"""Calls cut at their model's learned timeout (aiq.timeouts), one sweep for them all.

A hang among replies that take milliseconds is cut in seconds, a four-minute generation
never: each model's timeout is learned from its replies, under the ceiling (``--timeout``,
the transport's read timeout, which applies alone until one is learned). Calls sent before
their model's is known are cut by the first reply that teaches it, if they are past it.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable

from .providers.base import Provider, ProviderError, Reply
from .records import Job
from .timeouts import Timeouts
from .transport import ON_WIRE

# How often calls are checked against their learned timeout: a cut comes up to this late, a
# fifth of the shortest timeout (timeouts.FLOOR_S); a scan of ~1,500 calls, 20 times a second.
_SWEEP_S = 0.05
# The batch's tail: once nothing waits to be sent, a hang holds up the run's end by the whole
# timeout, and where replies take milliseconds that is the floor (timeouts.FLOOR_S: half a
# second against 4x a p99 of ~0.1 s; bench/README.md, the hang row). There the floor goes
# for a call that the calls sent around it have outrun: of those sent from a p99 before it
# on, at least TAIL_AROUND went and at most TAIL_SHARE are still out. The floor is there for
# stalls of aiq's own loop on a loaded machine, and such a stall (or a provider slowing down
# as the batch ends) holds their replies back as much as this one's, so it cuts nothing.
# And the multiple: 4x the p99, or TAIL_SLOWEST x the slowest of the last replies (the
# window's) if that is less. Where replies are alike (the hang row: p99 and slowest both
# ~0.1 s) a hang is cut at 0.2 s, not 0.4, and it was the run's last retry: the hang row
# 0.80-0.89 -> 0.89-0.93, in turn. Where they spread, the slowest is well above the p99:
# at a lognormal's spread (sigma 1, long generations') twice the slowest of 256 is 2.8x the
# p99, and a reply that slow comes one time in 2,500 (4x the p99: in 10,000); a call cut at
# the tail is given longer (timeouts.ESCALATE) and left to it. (The p99 before it: the
# batch's very last call has none after it.)
TAIL_AROUND = 10
TAIL_SHARE = 0.1
TAIL_SLOWEST = 2.0
# Past its learned timeout, a call is a hang if the calls sent around it came back; where
# more than SLOW_SHARE of them are out too (those sent from a p99 before it to a p99 ago),
# the provider has slowed down, and a call cut then is billed twice, its reply on the way.
# Such a call is held once, to ESCALATE times as long as it has been out: the replies that
# come meanwhile teach the slower timeout, or take the learned one back (OUT_SHARE), and a
# provider that hangs every call is still cut, later. (Before, a slowdown with no reply in
# between cut every call out at the old timeout.)
SLOW_SHARE = 0.5


class TimedCalls:
    """The provider's calls under learned per-model timeouts: :meth:`send` one,
    :meth:`replied` with each reply's latency, :meth:`done` once a job is no longer queued,
    :meth:`close` at the run's end."""

    def __init__(
        self, timeouts: Timeouts, max_attempts: int, drained: Callable[[], bool] = lambda: False
    ) -> None:
        self.timeouts = timeouts
        self._max_attempts = max_attempts
        self._drained = drained  # whether nothing waits to be sent: the batch's tail
        self._tail_cut: set[asyncio.Timeout] = set()  # cut as a straggler at the tail
        # Calls of jobs cut before, given longer (timeouts.ESCALATE): the tail's rule leaves
        # them to it, or a long generation at the tail would be cut at every attempt.
        self._longer: set[asyncio.Timeout] = set()
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
        self._connecting: set[asyncio.Timeout] = set()  # calls waiting for a connection
        self._wired: dict[asyncio.Timeout, float] = {}  # ...and when those got one
        self._timed: set[str | None] = set()  # models whose calls were given a learned timeout
        self._held: set[asyncio.Timeout] = set()  # past it in a slowdown, given longer once
        # Models whose timeout was taken back (OUT_SHARE): each sweep looks again, for a reply
        # may never come to. At a batch's tail a few hangs out of a few dozen calls took it
        # back, no reply came after, and they were waited out to the ceiling.
        self._doubted: set[str | None] = set()

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
        cuts = self._cuts.get(job.id, 0)
        limit_s = timeouts.timeout_s(model, cuts=cuts, last=last)
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
                self._mark(bound, start, limit_s, cuts, untimed, loop)
                out = self._out.setdefault(model, {})
                out[bound] = start
                timeouts.sending(model, start)
                wire = ON_WIRE.set(self._wire(bound, model, out, loop))
                try:
                    return await provider.send(job.endpoint, job.body)
                finally:
                    ON_WIRE.reset(wire)
                    self._connecting.discard(bound)
                    del out[bound]
                    start = self._wired.pop(bound, start)  # (its connection's, if it waited)
                    # (Under a learned timeout or waiting for one: either may have become
                    # the other while it was out.)
                    self._deadlines.pop(bound, None)
                    if (waiting := self._untimed.get(model)) is not None:
                        waiting.pop(bound, None)
        except TimeoutError:
            raise self._cut(job, loop.time() - start, tail=bound in self._tail_cut) from None
        finally:
            if self._tail_cut:
                self._tail_cut.discard(bound)
            if self._held:
                self._held.discard(bound)
            if cuts:
                self._longer.discard(bound)

    def _mark(
        self,
        bound: asyncio.Timeout,
        start: float,
        limit_s: float | None,
        cuts: int,
        untimed: dict[asyncio.Timeout, float] | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Put a call that went at ``start`` under its learned limit (swept), or among those
        sent before one was learned (``untimed``; neither: the ceiling's)."""
        if limit_s is not None:
            self._deadlines[bound] = start + limit_s
            if cuts:
                self._longer.add(bound)
            if self._sweeper is None:
                self._sweeper = loop.call_later(_SWEEP_S, self._sweep, loop)
        elif untimed is not None:
            untimed[bound] = start

    def _wire(
        self,
        bound: asyncio.Timeout,
        model: str | None,
        out: dict[asyncio.Timeout, float],
        loop: asyncio.AbstractEventLoop,
    ) -> Callable[[bool], None]:
        """The transport's ON_WIRE for one call: while it waits for a connection it is not
        cut; once it has one, its timeout counts from then. Its time in ``_out`` stays its
        send's: the timeouts weigh the calls still out against those sent (OUT_SHARE), both
        by when they went (a call moved to its connection's time read as not yet sent)."""

        def on_wire(connected: bool) -> None:
            if not connected:
                self._connecting.add(bound)
                return
            self._connecting.discard(bound)
            start = self._wired[bound] = loop.time()
            if (at := self._deadlines.get(bound)) is not None:
                self._deadlines[bound] = at + start - out[bound]
            if (untimed := self._untimed.get(model)) is not None and bound in untimed:
                untimed[bound] = start

        return on_wire

    def _cut(self, job: Job, took_s: float, *, tail: bool) -> ProviderError:
        """The error of a call cut after ``took_s`` (``tail``: as the tail's straggler)."""
        self._cuts[job.id] = self._cuts.get(job.id, 0) + 1
        timeouts = self.timeouts
        if tail:
            why = "the calls sent around it came back, and nothing else waits to be sent"
        else:
            why = "aiq's timeout learned from this model's replies "
            why += f"({timeouts.rule.multiple:g}x their p99)"
        return ProviderError(
            "timeout",
            f"no reply in {took_s:.1f} s, {why}; the next attempt waits longer, "
            f"up to --timeout {timeouts.ceiling_s:g} s",
            retryable=True,
            cut=True,
        )

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cut the calls past their learned timeout (a TimeoutError in each, from asyncio's
        own timeout); look again in _SWEEP_S while any call has one."""
        now = loop.time()
        for model in list(self._doubted):
            out = self._out.get(model, {})
            if self.timeouts.look_again(model, now=now, out=out.values()):
                self._retime(model)
        deadlines = self._deadlines
        connecting = self._connecting
        due = [b for b, at in deadlines.items() if at <= now and b not in connecting]
        if due:
            due = self._hangs(due, now)
        if self._drained():
            due.extend(self._stragglers(now))
        for bound in due:
            if deadlines.pop(bound, None) is not None:
                bound.reschedule(now)
        looking = deadlines or self._doubted
        self._sweeper = loop.call_later(_SWEEP_S, self._sweep, loop) if looking else None

    def _hangs(self, due: list[asyncio.Timeout], now: float) -> list[asyncio.Timeout]:
        """Of the calls past their learned timeout, those to cut: all but the ones that the
        calls sent around them have not outrun (SLOW_SHARE), held once, to ESCALATE times as
        long as they have been out."""
        timeouts, deadlines, held = self.timeouts, self._deadlines, self._held
        pending = set(due)
        for model, out in self._out.items():
            p = timeouts.percentile_s(model)
            if p is None:
                continue
            starts: list[float] = []
            for bound, start in out.items():
                if bound not in pending or bound in held:
                    continue
                starts = starts or list(out.values())  # in the order the calls went
                since, until = start - p, now - p
                went = timeouts.sent_after(model, since) - timeouts.sent_after(model, until) - 1
                left = bisect.bisect_right(starts, until) - bisect.bisect_left(starts, since) - 1
                if went > 0 and left > SLOW_SHARE * went:
                    pending.discard(bound)
                    held.add(bound)
                    took_s = now - self._wired.get(bound, start)
                    deadlines[bound] = now + (timeouts.rule.escalate - 1) * took_s
        return [b for b in due if b in pending]

    def _stragglers(self, now: float) -> list[asyncio.Timeout]:
        """At the batch's tail: the calls out past their learned timeout but its floor that
        the calls sent around them have outrun (TAIL_*). Each is marked as cut so."""
        timeouts, deadlines, found = self.timeouts, self._deadlines, []
        for model, out in self._out.items():
            p, slowest = timeouts.percentile_s(model), timeouts.slowest_s(model)
            if p is None or slowest is None or not out:
                continue
            # (The learned timeout, but its floor, and no longer than TAIL_SLOWEST allows.)
            late = now - min(timeouts.rule.multiple * p, TAIL_SLOWEST * slowest)
            starts = list(out.values())  # in the order the calls went
            for bound, start in out.items():
                if start > late:
                    break  # and every later one
                if bound in self._connecting or bound in self._longer:
                    continue  # (waiting for a connection; given longer after a cut)
                if bound in deadlines and deadlines[bound] > now:
                    # The calls sent from a p99 before this one on, but itself: how many
                    # went, how many are still out.
                    went = timeouts.sent_after(model, start - p) - 1
                    left = len(starts) - bisect.bisect_left(starts, start - p) - 1
                    if went >= TAIL_AROUND and left <= TAIL_SHARE * went:
                        found.append(bound)
        self._tail_cut.update(found)
        return found

    def replied(self, model: str | None, latency_s: float) -> None:
        """Feed a reply's latency to the timeouts; once the model's is known, cut the calls
        sent before it that have run past it."""
        out = self._out.get(model, {})
        now = asyncio.get_running_loop().time()
        self.timeouts.observe(model, latency_s, now=now, out=out.values())
        if self.timeouts.timeout_s(model) is None:
            if model in self._timed:
                self._untime(model, out)
            return
        self._retime(model)

    def _retime(self, model: str | None) -> None:
        """The model's timeout is learned (again): the calls sent before it go under it,
        swept as the calls sent under it are (those already past it at the next sweep), and
        looked at as the tail's are."""
        self._timed.add(model)
        self._doubted.discard(model)
        limit_s = self.timeouts.timeout_s(model)
        untimed = self._untimed.get(model)
        if untimed and limit_s is not None:
            for bound, start in untimed.items():
                self._deadlines[bound] = start + limit_s
            untimed.clear()
            self._sweep_soon()

    def _sweep_soon(self) -> None:
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(_SWEEP_S, self._sweep, loop)

    def _untime(self, model: str | None, out: dict[asyncio.Timeout, float]) -> None:
        """The model's timeout is no longer trusted (aiq.timeouts OUT_SHARE: more calls out
        than a true p99 leaves): the calls given it when it was go back to the ceiling,
        to be given the next one learned. A burst's first replies are its fastest, and
        the opening's one or two calls alone in the window once made them trusted, until
        the burst's own came into it: the calls the burst sent kept 4x the fast p99, and a
        fifth to a third of 300 were cut (bench/concurrency.py spread-burst)."""
        self._timed.discard(model)
        self._doubted.add(model)
        self._sweep_soon()
        untimed = self._untimed.setdefault(model, {})
        deadlines, longer, wired = self._deadlines, self._longer, self._wired
        for bound, start in out.items():
            if bound not in longer and deadlines.pop(bound, None) is not None:
                untimed[bound] = wired.get(bound, start)
