"""Senders waiting for the slots they booked, woken together when the slots are taken back."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

# With an injected clock, a sender waiting for its slot looks this often whether it was taken
# back (on the real one, it is woken).
_LOOK_EVERY_S = 0.2


class SlotWaits:
    """Each wait ends at its slot, or sooner when :meth:`wake_all` says the slots were taken
    back (a lower limit learned, or the provider's window saying they may go now): then
    :attr:`generation` moves, and a sender that sees it move books again."""

    def __init__(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._sleep = sleep
        self.generation = 0
        self._waiters: set[asyncio.Future[None]] = set()

    async def wait(self, seconds: float, generation: int) -> None:
        """Sleep ``seconds``, less if the slots of ``generation`` are taken back meanwhile."""
        if self._sleep is not asyncio.sleep:  # an injected clock (tests): look in steps
            while seconds > 0 and self.generation == generation:
                step = min(seconds, _LOOK_EVERY_S)
                await self._sleep(step)
                seconds -= step
            return
        # A future of its own (not a shield around a shared one: each shield leaves a
        # callback on it, thousands of them run at every wake-up).
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            async with asyncio.timeout(None if seconds == math.inf else seconds):
                await waiter
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)

    def wake_all(self) -> None:
        """The slots booked are taken back: every sender waiting for one books again."""
        self.generation += 1
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
