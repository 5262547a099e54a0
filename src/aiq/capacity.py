"""How many requests a server with no known limits takes at once, found by trying.

With no rate limit known (no headers, none configured), the only sign of a server's capacity is
what more requests in flight do: while it has free slots they bring more replies a second at the
same latency; once it is full they only queue at the server, and latency grows with no more
throughput. A llama.cpp server with one slot is full at one request; a large gateway at hundreds.
Sending 32 at once to the first multiplies its latency by 32 for nothing (and times out requests
waiting in its queue); sending 32 to the second leaves most of it idle.

The probe works in rounds, as BBR does for TCP. A round holds a limit for a round trip's worth
of replies and measures the throughput X (replies a second) and latency R they had. The most
the server takes without a queue is estimated as max X x min R over the last rounds (the
bandwidth-delay product; in a round with free slots, X x R is what was in flight). Startup
doubles the limit each round while throughput grows by a quarter or more; two rounds in a row
that grow less end it (one may be noise), and the limit falls to the estimate. From then on,
one round in each cycle probes a quarter (at least one) above the estimate, so capacity gained
is found (a probe that finds room probes again), and the next drains a little below it, so the
queue the probe built empties and min R stays the latency without a queue. A server losing
capacity shows as rounds of lower X that replace the old ones in the window. A 429 (a
gateway's parallel limit) cuts the limit at once.

Time comes from an injected clock, so the tests drive it with a simulated server, no sleeping.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

_GROWTH = 1.25  # throughput up by this much in a round of double the limit: the server had room
_WINDOW = 8  # rounds the estimate is taken over
_MIN_REPLIES = 6  # replies a round takes at least: fewer are mostly noise at a small limit
# ...in startup: a false "it grew" costs one doubling, undone a round later; six replies a
# round at one in flight were most of a large server's ramp (19 s of 70 at 3 s latency).
_MIN_REPLIES_STARTUP = 3
# Startup ends after this many rounds in a row that did not grow: one noisy round ending it
# at a small limit left a 1,000-slot server at a tenth of that for minutes (bench/README
# "Concurrency").
_FLAT_ROUNDS = 2
_CYCLE = (1.25, 0.9, 1.0, 1.0, 1.0, 1.0)  # after startup, round by round: probe, drain, hold
_BUSY = 0.75  # a round with fewer in flight than this share of the limit says nothing of it
_SETTLE = 2  # round trips after a change before measuring
_FULL = 0.95  # an estimate this near the ceiling: the server took all it was allowed
_REFUSED = 0.2  # 429s over this share of a round's answers: the server is over its limit
_CUT = 0.7  # after a 429, this share of what was in flight
# A probe's round this much over the best so far: the server has more room, so the next round
# probes again rather than drain (growth compounds instead of 25% a six-round cycle).
_ROOM = 1.15


class CapacityProbe:
    """The number of requests to keep in flight to a server whose limits are unknown.

    Call :meth:`observe` with every successful reply; read :attr:`limit`. ``ceiling`` bounds
    it (what the machine or ``max_concurrency`` allows); :attr:`capped` says whether the server
    seemed to take more than that.
    """

    def __init__(self, *, ceiling: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = 1
        self.capped = False  # the limit wanted more than the ceiling
        self._ceiling = max(1, ceiling)
        self._clock = clock
        self._startup = True
        self._flat = 0  # startup: rounds in a row that did not grow
        self._best_x = 0.0  # startup: the highest throughput so far
        self._rounds: deque[tuple[float, float]] = deque(maxlen=_WINDOW)  # (X, R)
        self._phase = 0
        self._cut = False  # the limit was last set by a cut
        self._begin(clock())

    def _begin(self, now: float) -> None:
        """A new round at the current limit."""
        self._round_at = now
        self._measure_at: float | None = None  # once the first request sent this round is back
        self._settled = _SETTLE
        self._replies = 0
        self._latency_sum = 0.0
        self._in_flight_sum = 0
        self._refused = 0  # 429s this round
        self._answered = 0  # replies this round, settling ones too

    def observe(self, latency_s: float, in_flight: int) -> bool:
        """A reply took ``latency_s`` with ``in_flight`` requests out (itself included); True
        if that changed the limit."""
        now = self._clock()
        self._answered += 1
        if self._measure_at is None:
            # Replies to requests sent before the round began show the old limit, not this one;
            # and the first round trip after a change still drains or fills the server's queue.
            if now - latency_s < self._round_at:
                return False
            self._settled -= 1
            if self._settled:
                self._round_at = now
            else:
                self._measure_at = now
            return False
        self._replies += 1
        self._latency_sum += latency_s
        self._in_flight_sum += in_flight
        took_s = now - self._measure_at
        latency = self._latency_sum / self._replies
        # At least a round trip of replies: with a fixed latency they come back in bunches.
        least = _MIN_REPLIES_STARTUP if self._startup else _MIN_REPLIES
        if self._replies < max(least, self.limit) or took_s < latency:
            return False
        if self._in_flight_sum / self._replies < _BUSY * self.limit:
            self._begin(now)  # too few jobs to keep the limit busy: no news of the server
            return False
        return self._decide(self._replies / took_s, latency, now)

    def cut(self, in_flight: int) -> bool:
        """The server refused a request (a 429 with no rate-limit headers). When refusals are a
        fifth or more of this round's answers, it is over its limit: fewer in flight from now
        on, and no more doubling. A lone 429 now and then (a busy upstream) is no such sign.
        True if it changed the limit."""
        self._refused += 1
        if self._refused < 3 or self._refused < _REFUSED * (self._answered + self._refused):
            return False
        if self._cut and self._measure_at is None:
            return False  # the 429s of one burst: one cut for them all
        self._startup = False
        self._rounds.clear()  # rounds at the old limit would lift the estimate back over it
        changed = self._set(max(1, math.floor(_CUT * min(in_flight, self.limit))), self._clock())
        self._cut = True
        return changed

    def _decide(self, x: float, latency: float, now: float) -> bool:
        best_before = max((r[0] for r in self._rounds), default=0.0)
        self._rounds.append((x, latency))
        estimate = max(r[0] for r in self._rounds) * min(r[1] for r in self._rounds)
        if self._startup:
            if x >= _GROWTH * self._best_x:
                self._best_x, self._flat = x, 0
                return self._set(2 * self.limit, now)
            self._flat += 1
            if self._flat < _FLAT_ROUNDS:  # a round's noise, maybe: the same limit again
                self._begin(now)
                return False
            self._startup = False
            return self._set(max(1, round(estimate)), now, estimate)
        gain = _CYCLE[self._phase]
        probed = self._phase == 1  # (the round just measured was the probe's)
        self._phase = (self._phase + 1) % len(_CYCLE)
        if probed and x >= _ROOM * best_before:
            gain, self._phase = _CYCLE[0], 1  # the probe found room: probe again, not drain
        base = max(1, round(estimate))
        if gain > 1:
            return self._set(max(base + 1, math.ceil(estimate * gain)), now, estimate)
        return self._set(max(1, round(estimate * gain)), now, estimate)

    def _set(self, wanted: int, now: float, estimate: float | None = None) -> bool:
        # Capped: the server took all the ceiling allowed (or startup would double past it),
        # so it may well take more.
        if estimate is None:
            self.capped = wanted > self._ceiling
        else:
            self.capped = estimate >= _FULL * self._ceiling
        self._cut = False
        new = min(wanted, self._ceiling)
        self._begin(now)
        if new == self.limit:
            return False
        self.limit = new
        return True
