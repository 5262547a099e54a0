"""Senders waiting for the slots they booked, woken together when the slots are taken back."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Awaitable, Callable

# With an injected clock, a sender waiting for its slot looks this often whether it was taken
# back (on the real one, it is woken).
_LOOK_EVERY_S = 0.2


class SlotWaits:
    """Each wait ends at its slot, or sooner when :meth:`wake_all` says the slots were taken
    back (a lower limit learned, or the provider's window saying they may go now): then
    :attr:`generation` moves, and a sender that sees it move books again.

    The waits are one heap under one timer, not a timer each: a wake-up of every sender (and
    each books again, and waits again) cost two timer operations a sender, ~400 of them a
    time in a second's bucket at 20,000/min (bench/README.md, "Session 36")."""

    def __init__(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._sleep = sleep
        self.generation = 0
        # (deadline on the loop's clock, order of arrival, the sender's future)
        self._waits: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    async def wait(self, seconds: float, generation: int) -> None:
        """Sleep ``seconds``, less if the slots of ``generation`` are taken back meanwhile."""
        if self._sleep is not asyncio.sleep:  # an injected clock (tests): look in steps
            while seconds > 0 and self.generation == generation:
                step = min(seconds, _LOOK_EVERY_S)
                await self._sleep(step)
                seconds -= step
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        deadline = loop.time() + seconds
        heapq.heappush(self._waits, (deadline, next(self._order), waiter))
        if deadline < self._timer_at:
            self._arm(loop, deadline)
        # (A sender cancelled here cancels its future: it is skipped when its turn comes.)
        await waiter

    def wake_all(self) -> None:
        """The slots booked are taken back: every sender waiting for one books again, in the
        order of the slots they held."""
        self.generation += 1
        waits, self._waits = sorted(self._waits), []
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        for _, _, waiter in waits:
            if not waiter.done():
                waiter.set_result(None)

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf
        if at < math.inf:
            self._timer, self._timer_at = loop.call_at(at, self._due, loop), at

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The first slot's time: wake every sender whose slot has come."""
        until = max(self._timer_at, loop.time())
        self._timer, self._timer_at = None, math.inf
        waits = self._waits
        while waits and waits[0][0] <= until:
            waiter = heapq.heappop(waits)[2]
            if not waiter.done():
                waiter.set_result(None)
        while waits and waits[0][2].done():  # (cancelled senders)
            heapq.heappop(waits)
        if waits:
            self._arm(loop, waits[0][0])
