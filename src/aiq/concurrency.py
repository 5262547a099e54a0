"""``--concurrency auto``: how many senders may send at once, sized to the rate limits.

The worker starts sender tasks as ``senders`` asks; this gate lets ``size`` of them send. Two
requests go first, to learn the provider's limits from their headers (and, where none show,
whether the server had room for both: aiq.capacity). After that:

- With a request rate known (configured or learned), enough go at once to reach it at the
  latency seen (Little's law: in flight = rate x latency), with room for latency's spread: the
  rate times the mean plus two standard deviations of recent latencies.
- With none, the server's capacity is found by trying (aiq.capacity): more in flight while
  throughput grows, fewer when latency grows without it.

Either way ``max_senders`` bounds it (``max_concurrency``, or what the machine allows), and
``held_by`` says so when it is what holds the run back.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

from .capacity import CapacityProbe
from .limiters import Limiters

FALLBACK = 32  # senders while a token limit is known but no request's cost yet
_EVERY_S = 1.0  # how often the size is reconsidered
_ASSUMED_LATENCY_S = 1.0  # with configured limits, until replies come
# Latency is averaged over about this many replies (fewer at the start): enough that one slow
# reply does not move the size, few enough to follow a change within seconds at high rates.
_REPLIES = 100
_SPREAD = 2.0  # standard deviations of latency over the mean that the size makes room for
_BUNCHED = 1.25  # and at least this much over it, for a latency with no spread known
# With no limit known, this many sends may go at once before the rest are spaced: a small
# server's ramp is not slowed (spaced from the first, the demo took 9.4 s, not 9.0).
AT_ONCE = 8


class Latency:
    """The mean and standard deviation of recent latencies, exponentially weighted."""

    def __init__(self) -> None:
        self.count = 0
        self.mean_s = 0.0
        self._var = 0.0

    def add(self, latency_s: float) -> None:
        self.count += 1
        weight = max(1.0 / self.count, 1.0 / _REPLIES)  # a plain mean until there are enough
        diff = latency_s - self.mean_s
        self.mean_s += weight * diff
        self._var = (1.0 - weight) * (self._var + weight * diff * diff)

    @property
    def stddev_s(self) -> float:
        return math.sqrt(self._var)

    @property
    def high_s(self) -> float:
        """The latency to size for: two standard deviations over the mean, and at least a
        quarter over it (replies of a fixed latency still come back in bunches)."""
        return max(_BUNCHED * self.mean_s, self.mean_s + _SPREAD * self.stddev_s)


def size_for(rate_per_s: float, latency_s: float) -> int:
    """Requests in flight to keep ``rate_per_s`` going when replies take up to ``latency_s``;
    two more for the ramp."""
    return math.ceil(rate_per_s * latency_s) + 2


class _Gate:
    """Where senders wait their turn: woken oldest first, one at a time or all at once.

    Not an ``asyncio.Condition``: its ``notify`` walks past every waiter already woken but
    not yet run, and each wake-up takes its lock again. With a thousand senders waiting at
    500 replies a second that was a few percent of a core (bench/README.md, "CPU"). One
    event loop, no await between a check and its wait: no lock is needed.
    """

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def wait_for(self, ready: Callable[[], bool]) -> None:
        """Return once ``ready()``, checked now and after each wake-up."""
        while not ready():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.wake_one()  # woken, then cancelled: the turn goes to the next
                raise

    def wake_one(self) -> None:
        """Wake the oldest waiter (those cancelled meanwhile are skipped)."""
        self.wake(1)

    def wake(self, n: int) -> None:
        """Wake the ``n`` oldest waiters."""
        waiters = self._waiters
        while n > 0 and waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                n -= 1

    def wake_all(self) -> None:
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class AutoConcurrency:
    """A gate for the sender tasks, ``size`` of which may send at once.

    ``held_by`` names what sets ``max_senders`` ("max_concurrency 256", the open-files limit),
    for the progress to say when that, not the provider, holds the run back.
    """

    def __init__(
        self,
        limiters: Limiters,
        max_senders: int,
        *,
        held_by: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limiters = limiters
        self._max = max_senders
        self._cap = held_by or f"max_concurrency {max_senders}"
        self._clock = clock
        self._latency = Latency()
        self._probe = CapacityProbe(ceiling=max_senders, clock=clock)
        self.held_by: str | None = None  # what holds the size back, when not the provider
        self._burst = 0.0  # the burst the size was last set for
        self.size = self._wanted(_BUNCHED * _ASSUMED_LATENCY_S)  # may send now
        self._gate = _Gate()  # senders over the size wait here
        self._active = 0  # senders past the gate
        self._pacing = 0  # of those, how many wait in a rate limiter
        self._open = False  # stopping: every sender goes through
        self._sized_at = -math.inf
        self._sized_blind = True  # last sized with no request rate known
        self._first_at: float | None = None  # when the first sender went through
        self.cuts = 0  # times 429s cut the size
        self._cut = asyncio.Event()  # set (and replaced) at each cut
        self._next_send = -math.inf  # no limit known: when the next send may go

    @property
    def senders(self) -> int:
        """Sender tasks wanted: ``size`` to send, and as many again (32 at least) to wait in
        the rate limiters meanwhile, so one model's slow limit does not hold up the others."""
        return min(self._max, self.size + max(self.size, FALLBACK))

    async def enter(self) -> None:
        """Wait while ``size`` senders are busy (waiting for a limiter counts as busy: a sender
        there has its request as good as in flight, unless it is marked ``pacing``)."""
        await self._gate.wait_for(lambda: self._open or self._active - self._pacing < self.size)
        self._active += 1
        if self._first_at is None:
            self._first_at = self._clock()

    async def leave(self) -> None:
        """A sender is done with its job: let the next one in."""
        self._active -= 1
        self._gate.wake_one()

    @asynccontextmanager
    async def pacing(self, *, paced: bool = True) -> AsyncIterator[None]:
        """Around a wait in a model's rate limiter: a sender there is not in flight, so it lets
        another through the gate, and one model's slow limit does not hold up the others."""
        if not paced and not self._limiters.several:
            # One model and no limit (``paced`` False): its limiter holds a sender only for a
            # 429's pause, which holds every sender. Let others in meanwhile and they all go as
            # it ends: 41 in flight for a size of 17 at a parallel limit of 8, 33 refused.
            yield
            return
        self._pacing += 1
        try:
            self._gate.wake_one()
            yield
        finally:
            self._pacing -= 1

    def send_delay_s(self) -> float:
        """How long a send waits, with no limit known, to go at most twice as fast as the
        size allows at the latency seen, past ``AT_ONCE`` at once (TCP paces so: Linux at
        twice the window per round trip in slow start). A bunch of replies is then not
        answered with a bunch of sends, of which all that went before the first 429 came
        back were refused: a hundred sends take the loop 5 ms, a gateway's 429 one (31 of a
        bunch of 94 at a limit met mid-bunch, bench f-retry-after-learned; now 2-3)."""
        spacing_s = self.send_spacing_s
        if not spacing_s:
            return 0.0
        now = self._clock()
        due = max(now, self._next_send)  # (a virtual schedule: a few may go at once)
        self._next_send = due + spacing_s
        return max(0.0, due - now - (AT_ONCE - 1) * spacing_s)

    @property
    def send_spacing_s(self) -> float:
        """How far apart sends go, past the first ``AT_ONCE`` (0: no reply yet)."""
        return self._latency.mean_s / (2 * self.size)

    def open(self) -> None:
        """Let every waiting sender through (the run is stopping: they must see it)."""
        self._open = True
        self._gate.wake_all()

    def observe(self, latency_s: float, in_flight: int = 1) -> bool:
        """A reply took ``latency_s``, with ``in_flight`` requests out (itself included); True
        if that changed ``size``."""
        self._latency.add(latency_s)
        probed = False
        if self._unpaced():  # the server's capacity is all there is to go by
            probed = self._probe.observe(latency_s, in_flight)
        now = self._clock()
        # (A presumed bucket's burst opens each round trip: the senders follow at once.)
        opening = self._limiters.bursting and self._limiters.burst_size() > self._burst
        # A limit learned since the last sizing sizes it at once: the probe's two of startup
        # held for a second had 3,000/min at 50 ms paced at 40 a second (tests/test_limits.py).
        learned = self._sized_blind and not self._unpaced()
        if not (probed or learned or opening) and self.size > 1 and now - self._sized_at < _EVERY_S:
            return False
        return self._resize(now, self._latency.high_s)

    def refused(self, in_flight: int) -> bool:
        """A 429: with no limit known, the server says it is full at ``in_flight``. True if
        that changed ``size``."""
        return self._unpaced() and self._probe.cut(in_flight) and self._was_cut()

    def full(self, in_flight: int) -> bool:
        """With no limit known, the server was found full at ``in_flight`` (its 429's pause
        tested: :meth:`CapacityProbe.full`). True if that changed ``size``."""
        return self._unpaced() and self._probe.full(in_flight) and self._was_cut()

    def _was_cut(self) -> bool:
        """The probe's limit was cut: senders held for it (``one_too_many``) may go."""
        self.cuts += 1
        self._cut.set()
        self._cut = asyncio.Event()
        return self._resize(self._clock(), self._latency.high_s)

    @property
    def over(self) -> bool:
        """Whether more senders are past the gate, and not waiting in a limiter's pace, than
        ``size`` allows: it was cut while they waited (in a 429's pause, which holds them)."""
        return not self._open and self._active - self._pacing > self.size

    async def one_too_many(self, cuts: int, seconds: float) -> None:
        """A sender refused by a full server (a 429 while no limit is known, its request
        sent when ``cuts`` was :attr:`cuts`) was one too many: it holds its place for
        ``seconds`` (its job's backoff), or it would send the next job into the same full
        server at once, a 429 a millisecond; but only until the size is cut, which counts
        it. Held past the cut, ten refused in startup held ten of a new size of eight, and
        five went for a second (LiteLLM's parallel limit of 8)."""
        if self.cuts != cuts or seconds <= 0:
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(self._cut.wait(), seconds)

    def tick(self) -> bool:
        """Now and then, from the worker: until the first reply, the latency is at least the
        time since the first request went (a provider answering in 20 s must not be held to
        the size for one second's latency until it does). True if that changed ``size``."""
        if self._latency.count or self._first_at is None:
            return False
        now = self._clock()
        if now - self._sized_at < _EVERY_S:
            return False
        return self._resize(now, _BUNCHED * max(_ASSUMED_LATENCY_S, now - self._first_at))

    def _unpaced(self) -> bool:
        return self._limiters.requests_per_s() is None or self._limiters.unpaced

    def _resize(self, now: float, latency_s: float) -> bool:
        self._sized_at, self._sized_blind = now, self._unpaced()
        wanted = self._wanted(latency_s)
        if wanted == self.size:
            return False
        # Only as many as it grew may pass: waking every waiter (thousands) to find most of
        # them still over the size cost more than the rest of the gate's work.
        self._gate.wake(wanted - self.size)
        self.size = wanted
        return True

    def _wanted(self, latency_s: float) -> int:
        """Senders enough for the limits at ``latency_s``, bounded by ``max_senders`` (and
        ``held_by`` set if that bound is below what they need). With no limit known, what the
        server was found to take. With a limit but no rate yet (tokens/min, before a
        request's cost is known), plenty: the limiter keeps the pace. With a minute's bucket
        to send at once (``Limiters.bursting``: a minute's bucket, or what a short window
        says is left), that many more: its content goes at once, and the limiter stops the
        burst at ``remaining``."""
        rate = self._limiters.requests_per_s()
        # What the server was found to take; one more if it would take more than the bound.
        found = self._probe.limit + self._probe.capped
        if self._limiters.bursting:
            burst = math.ceil(self._limiters.burst_size())
            self._burst = burst
            paced = size_for(rate, latency_s) if rate else self._max
            self.held_by = self._cap if rate and paced > self._max else None
            beside = found if self._limiters.unpaced else 0  # a model without a limit
            return max(1, min(self._max, paced + burst + beside))
        if rate is None:
            size = FALLBACK if self._limiters.any_limit else found
        else:  # and beside, what a model without a limit takes
            size = size_for(rate, latency_s) + (found if self._limiters.unpaced else 0)
        self.held_by = self._cap if size > self._max else None
        return max(1, min(self._max, size))
