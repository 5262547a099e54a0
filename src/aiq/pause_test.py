"""A 429's pause test decided once a refusal would have come back, not at the test's reply.

With no limit known, a 429 that names a wait pauses every sender, and one request goes
through the pause when an earlier one ends, to see whether the server was only full
(aiq.limiter's pause test; LiteLLM's parallel limiter asks for its minute's turn though a
slot frees as soon as any request ends). Waiting for that request's reply holds every slot
but one idle for a whole latency: 0.2 s at a gateway answering in 0.2 s, five minutes at
one generating for five. A gateway refuses at its door, in a fraction of a model's
latency, so a test not refused by several times the slowest 429 so far was let in.

Only where 429s come back far sooner than replies do; and the loop's own delays do not
count: a check that runs late (the loop was busy with a bunch of replies, a refusal may be
read and not yet seen) looks again a moment later instead of deciding.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

# A test not refused by this many times the slowest 429 so far, and this long at least (a
# 429 over loopback takes a millisecond; timers and a busy loop tens of them), was let in.
MULTIPLE = 4.0
FLOOR_S = 0.02
# ...and only where that is at most this share of the fastest reply: a 429 that comes back
# about as late as a reply says nothing sooner than the test's reply will.
SHARE = 0.25
# A check this late ran behind the loop's other work: it looks again after this long.
LATE_S = 0.005
AGAIN_S = 0.005


class PauseTest:
    """How long a 429 takes against a reply, from every answer; :meth:`watch` decides a
    pause's test early."""

    def __init__(self) -> None:
        self.slowest_refusal_s = 0.0
        self.fastest_reply_s = math.inf

    def refused(self, took_s: float) -> None:
        """A 429 came back ``took_s`` after its request went."""
        if took_s > self.slowest_refusal_s:
            self.slowest_refusal_s = took_s

    def replied(self, took_s: float) -> None:
        """A reply came back ``took_s`` after its request went."""
        if took_s < self.fastest_reply_s:
            self.fastest_reply_s = took_s

    def let_in_after_s(self) -> float | None:
        """How long a test out without a 429 has been let in (None: 429s are too slow to
        tell, or none came yet)."""
        if not self.slowest_refusal_s:
            return None
        wait_s = max(FLOOR_S, MULTIPLE * self.slowest_refusal_s)
        return wait_s if wait_s <= SHARE * self.fastest_reply_s else None

    def watch(self, out: Callable[[], bool], let_in: Callable[[], None]) -> None:
        """Call ``let_in`` if the test sent now is still ``out`` when a refusal would have
        come back (nothing if that cannot be told)."""
        wait_s = self.let_in_after_s()
        if wait_s is None:
            return
        loop = asyncio.get_running_loop()

        def check(due: float) -> None:
            if not out():
                return  # answered: the reply decides
            now = loop.time()
            if now - due > LATE_S:
                loop.call_later(AGAIN_S, check, now + AGAIN_S)  # (behind the loop's work)
                return
            let_in()

        loop.call_later(wait_s, check, loop.time() + wait_s)
