"""At most so many sends started per turn of the event loop, the rest in the turns after.

A burst wakes thousands of senders at once (a learned bucket's first sample says a minute's
worth is left). asyncio runs every callback that is ready at a turn's start before it looks at
its sockets again, and a send costs ~0.1 ms of CPU to build before it waits for a connection:
6,000 woken together were one turn of 0.56 s, in which no connection opened and nothing
reached the server while the provider's bucket sat full, its refill lost (bench/README.md,
"Session 30"). Let through a turn's share and the loop opens connections and reads replies
between shares; the sends take the same CPU, started in the same order.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["PER_TURN", "LoopTurns"]

# Sends started per turn: 128 cost ~12 ms of the loop's time, a few replies' worth of
# latency at 50 ms; as many as the transport opens connections at once (transport.CONNECTING).
PER_TURN = 128


class LoopTurns:
    """``per_turn`` may go each turn of the running loop; the rest wait, oldest first.

    ``go_now()`` is the fast path, no coroutine: True if a send may start this turn. Else
    ``await wait()``, which returns in a later turn. One event loop, no lock needed."""

    def __init__(self, per_turn: int = PER_TURN) -> None:
        if per_turn < 1:
            raise ValueError(f"per_turn must be at least 1, not {per_turn}")
        self._per_turn = per_turn
        self._left = per_turn  # may still start this turn
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._turn_ends = False  # a call to _next_turn is scheduled

    def go_now(self) -> bool:
        """Whether a send may start now (counted if so); False: ``await wait()`` first."""
        if self._left <= 0 or self._waiters:
            return False
        self._left -= 1
        self._end_turn()
        return True

    async def wait(self) -> None:
        """Return in the first turn with room, after those that waited before."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._end_turn()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._left += 1  # let through, then cancelled: its place is not used
            raise

    def _end_turn(self) -> None:
        if not self._turn_ends:
            self._turn_ends = True
            # call_soon runs in the loop's next turn: after this turn's callbacks, and after
            # the loop has looked at its sockets.
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new turn: its share goes to the oldest waiters (who run next turn); the rest of
        it to sends that start meanwhile."""
        self._turn_ends = False
        self._left = self._per_turn
        waiters = self._waiters
        while self._left > 0 and waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._left -= 1
        if waiters or self._left < self._per_turn:
            self._end_turn()
