"""``--concurrency auto``: how many senders may send at once, sized to the rate limits.

The worker starts ``max_senders`` tasks; this gate lets ``size`` of them send. One request goes
first, to learn the provider's limits from its headers; after that, enough go at once to reach
the limits at the latency seen (Little's law: in flight = rate x latency).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .limiter import Limiters

FALLBACK = 32  # senders when the provider reports no limits
_EVERY_S = 1.0  # how often the size is reconsidered
_ASSUMED_LATENCY_S = 1.0  # with configured limits, until replies come


class AutoConcurrency:
    """A gate for ``max_senders`` sender tasks, ``size`` of which may send at once."""

    def __init__(self, limiters: Limiters, max_senders: int) -> None:
        self._limiters = limiters
        self._max = max_senders
        self.size = self._size_for(_ASSUMED_LATENCY_S)  # may send now
        self._gate = asyncio.Condition()  # senders over the size wait here
        self._active = 0  # senders past the gate
        self._pacing = 0  # of those, how many wait in a rate limiter
        self._open = False  # stopping: every sender goes through
        self._latency_s = 0.0  # moving average of answered requests
        self._sized_at = 0.0

    async def enter(self) -> None:
        """Wait while ``size`` senders are busy (waiting for a limiter counts as busy: a sender
        there has its request as good as in flight, unless it is marked ``pacing``)."""
        async with self._gate:
            await self._gate.wait_for(lambda: self._open or self._active - self._pacing < self.size)
            self._active += 1

    async def leave(self) -> None:
        """A sender is done with its job: let the next one in."""
        self._active -= 1
        async with self._gate:
            self._gate.notify()

    @asynccontextmanager
    async def pacing(self) -> AsyncIterator[None]:
        """Around a wait in a model's rate limiter: a sender there is not in flight, so it lets
        another through the gate, and one model's slow limit does not hold up the others."""
        self._pacing += 1
        try:
            async with self._gate:
                self._gate.notify()
            yield
        finally:
            self._pacing -= 1

    def open(self) -> None:
        """Let every waiting sender through (the run is stopping: they must see it)."""
        self._open = True
        asyncio.get_running_loop().create_task(self._notify_all())

    def observe(self, latency_s: float) -> bool:
        """A reply took ``latency_s``; True if that changed ``size``."""
        self._latency_s = (
            latency_s if not self._latency_s else 0.8 * self._latency_s + 0.2 * latency_s
        )
        now = time.monotonic()
        if self.size > 1 and now - self._sized_at < _EVERY_S:
            return False
        self._sized_at = now
        wanted = self._size_for(self._latency_s) if self._limiters.requests_per_s() else FALLBACK
        if wanted == self.size:
            return False
        self.size = wanted
        asyncio.get_running_loop().create_task(self._notify_all())
        return True

    def _size_for(self, latency_s: float) -> int:
        """Senders enough for the limits at ``latency_s``. With no limit known, 1: the first
        reply's headers may tell them, and until then a burst could break a per-second limit.
        With a limit but no rate yet (tokens/min, before a request's cost is known), or a
        minute's bucket to send at once (``Limiters.bursting``), plenty: the limiter keeps
        the pace."""
        if self._limiters.bursting:  # a bucket's content goes at once: as many as allowed
            return self._max
        rate = self._limiters.requests_per_s()
        if rate is None:
            return min(self._max, FALLBACK) if self._limiters.any_limit else 1
        # A quarter more than the mean needs, for latency's spread; two for the ramp.
        size = math.ceil(rate * latency_s * 1.25) + 2
        if self._limiters.unpaced:  # and as many as without limits for the models without
            size += FALLBACK
        return max(1, min(self._max, size))

    async def _notify_all(self) -> None:
        async with self._gate:
            self._gate.notify_all()
