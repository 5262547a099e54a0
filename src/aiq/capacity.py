"""How many requests a server with no known limits takes at once, found by trying.

With no rate limit known (no headers, none configured), the only sign of a server's capacity is
what more requests in flight do: while it has free slots they bring more replies a second at the
same latency; once it is full they only queue at the server, and latency grows with no more
throughput. A llama.cpp server with one slot is full at one request; a large gateway at hundreds.
Sending 32 at once to the first multiplies its latency by 32 for nothing (and times out requests
waiting in its queue); sending 32 to the second leaves most of it idle.

The probe works in rounds, as BBR does for TCP. A round holds a limit for a round trip's worth
of replies and measures the throughput X and latency R they had, X by Little's law (the limit
over the mean latency: replies counted over a window come back in bunches). The most the
server takes without a queue is estimated as max X x min R over the last rounds (the
bandwidth-delay product; in a round with free slots, X x R is what was in flight).

Startup raises the limit each round trip while throughput grows with it, and ends when it does
not: then the limit falls to the estimate. A startup round is the replies to requests sent
since the limit changed, as many as the limit, so no settling and no clock window. It opens
with two at once: the first back queued behind nothing at any server and is the bar's first
reply; if the second came back with it (a one-slot server answers it a service time later),
or the round's replies clearly show room, two grew, a round trip or two sooner than three
replies at one in flight; else the bar is three replies at one, and the opening round is
judged against it as a start at one would have judged its round at two. A round's mean
latency is set against the bar's (every reply in rounds that grew: no queue then) as two
answers: the same if the server had room for the step, higher by the step if it had none
(twice from 1 to 2, 1.25 from 3 to 5 at four slots; above, where one slot fewer no longer
shows, the line is throughput up by three quarters of the step). The round waits for more
replies until it is two standard errors (the spread of latency times root(1/replies + 1/replies
in the bar)) from the answer it is farther from. So a steady server decides at once and a noisy
one later; a "yes" takes no more than three times the replies a "no" needs, a "no" up to six
times, since a false no at a small limit costs a large server minutes and a false yes one step.
The steps are 1, 2, 3, 5, 9, 17 ... (the step starts at one and doubles): a server of up to four
slots is offered one request more than it serves (two at three), never twice as many (a
four-slot server was sent eight, a one-slot llama.cpp server 32 under an older auto), and a
large gateway is reached in one round trip more than doubling from one takes. A no takes six
replies (at the limit), a bar of twelve when latency varies (else startup goes back to the last
limit that grew for more) and two such rounds in a row: one noisy round ending it at a small
limit left a 1,000-slot server at a tenth of that for minutes (bench/README "Concurrency").

From then on, one round in each cycle probes a quarter (at least one) above the estimate, so
capacity gained is found (a probe that finds room probes again; two in a row start startup
again from there), and the next drains a little below it (one below, at least, the first
unless latency is steady and every eighth), so the queue the probe built empties and min R
stays the latency without a queue. A server losing capacity shows as rounds of
lower X that replace the old ones in the window. A 429 (a gateway's parallel limit) cuts the
limit at once.

Time comes from an injected clock, so the tests drive it with a simulated server, no sleeping.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from .latency_bar import LatencyBar
from .step_verdict import verdict

_FIRST_REPLIES = 3  # startup: replies in the first bar (one alone was often lucky)
_BUNCH = 0.1  # replies within this share of a latency of each other came back together
# The first two sent at once, back within this share of a latency of each other: a server with
# room for both (a one-slot one answers the second a service time later; at an exponential
# service time, that is this soon one time in twenty).
_TOGETHER = 0.05
_SAME = 1e-6  # s: sent as the round began (a float's rounding off the round's start)
_BASE_REPLIES = 12  # startup: replies in the bar before a round may be called flat, unless steady
_WINDOW = 8  # rounds the estimate is taken over
_MIN_REPLIES = 6  # replies a round takes at least: fewer are mostly noise at a small limit
# Startup ends after this many rounds in a row that did not grow: one noisy round ending it
# at a small limit left a 1,000-slot server at a tenth of that for minutes (bench/README
# "Concurrency").
_FLAT_ROUNDS = 2
_CYCLE = (1.25, 0.9, 1.0, 1.0, 1.0, 1.0)  # after startup, round by round: probe, drain, hold
_DEEP = 8  # the first drain and every eighth after it goes one below the estimate at least
_BUSY = 0.75  # a round with fewer in flight than this share of the limit says nothing of it
_SETTLE = 2  # round trips after a change before measuring
_FULL = 0.95  # an estimate this near the ceiling: the server took all it was allowed
_REFUSED = 0.2  # 429s over this share of a round's answers: the server is over its limit
_CUT = 0.7  # after a 429, this share of what was in flight
_REPROBE_S = 30.0  # a limit 429s cut is not probed again for this long
# A probe's round this much over the best so far: the server has more room, so the next round
# probes again rather than drain (growth compounds instead of 25% a six-round cycle).
_ROOM = 1.15
# Probes in a row that found room: startup ended too soon (noise made a round look flat), and
# steps of a quarter would take minutes to reach a large server: startup again from here.
_RESTART = 2


class CapacityProbe:
    """The number of requests to keep in flight to a server whose limits are unknown.

    Call :meth:`observe` with every successful reply; read :attr:`limit`. ``ceiling`` bounds
    it (what the machine or ``max_concurrency`` allows); :attr:`capped` says whether the server
    seemed to take more than that.
    """

    def __init__(self, *, ceiling: int, clock: Callable[[], float] = time.monotonic) -> None:
        # Two at once: the first back queued behind nothing at any server, so it is the
        # bar's first reply; the rest of the round says whether there was room for both.
        self.limit = min(2, max(1, ceiling))
        self._opening = self.limit == 2  # the first round, at two
        self._opened: tuple[int, float, float] | None = None  # its round, judged at one
        self._first_at = math.inf  # when its first reply came
        self.capped = False  # the limit wanted more than the ceiling
        self._ceiling = max(1, ceiling)
        self._clock = clock
        self._startup = True
        self._flat = 0  # startup: rounds in a row that did not grow
        self._best_limit = 0  # startup: the limit of the last round that grew
        self._bar = LatencyBar()  # startup: latencies of the rounds that grew, pooled
        self._rounds: deque[tuple[float, float]] = deque(maxlen=_WINDOW)  # (X, R)
        self._phase = 0
        self._pool_before = False  # startup: replies sent before the round are at a limit that grew
        self._flat_x = 0.0  # startup: the throughput of the last round that did not grow
        self._bunch_at = self._last_reply_at = -math.inf  # startup
        self._rebase = 0  # startup: replies wanted back at the last limit that grew
        self._retry = 1  # ...and the limit to try again after them
        self._cut = False  # the limit was last set by a cut
        self._drains = 0  # drain rounds so far
        self._roomy = 0  # probes in a row that found room
        self._clean = 0  # the most in a round with no 429
        self._over_until = -math.inf  # cut by 429s to _held: not probed over it till then
        self._held = 0
        self._begin(clock())

    def _begin(self, now: float) -> None:
        """A new round at the current limit."""
        self._round_at = now
        self._measure_at: float | None = None  # once the first request sent this round is back
        self._settled = _SETTLE
        self._replies = 0
        self._latency_sum = 0.0
        self._latency_sq = 0.0  # (startup: for the spread of latencies)
        self._in_flight_sum = 0
        self._most_in_flight = 0  # (startup)
        self._refused = 0  # 429s this round
        self._answered = 0  # replies this round, settling ones too

    def observe(self, latency_s: float, in_flight: int) -> bool:
        """A reply took ``latency_s`` with ``in_flight`` requests out (itself included); True
        if that changed the limit."""
        now = self._clock()
        self._answered += 1
        if self._startup:
            return self._startup_observe(latency_s, in_flight, now)
        if self._measure_at is None:
            # Replies to requests sent before the round began show the old limit, not this one;
            # and the first round trip after a change still drains or fills the server's queue.
            if now - latency_s < self._round_at - _SAME:
                return False
            self._settled -= 1
            if self._settled:
                self._round_at = now
            else:
                self._measure_at = now
            return False
        self._replies += 1
        self._latency_sum += latency_s
        self._latency_sq += latency_s * latency_s
        self._in_flight_sum += in_flight
        took_s = now - self._measure_at
        latency = self._latency_sum / self._replies
        # At least a round trip of replies: with a fixed latency they come back in bunches.
        if self._replies < max(_MIN_REPLIES, self.limit) or took_s < latency:
            return False
        if self._in_flight_sum / self._replies < _BUSY * self.limit:
            self._begin(now)  # too few jobs to keep the limit busy: no news of the server
            return False
        # Throughput by Little's law, the limit over the mean latency: replies counted over a
        # window come back in bunches, and a window that ends on one overstated it by half.
        return self._decide(self.limit / latency, latency, now)

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
        self._startup = self._opening = False
        self._rounds.clear()  # rounds at the old limit would lift the estimate back over it
        now = self._clock()
        if self._clean >= self.limit:
            self._clean = 0  # the server took less than it did
        cut = math.floor(_CUT * min(in_flight, self.limit))
        # Refused with this many of ours out: a parallel limit is no more than that.
        most = min(in_flight - 1, self.limit)
        # A round a little lower had no 429: a parallel limit between the two. Up to the most
        # the 429 allows (from startup's 9 at a limit of 8, a cut to 6 and a hold there cost
        # a batch of 1,000 a second), or the round with none if that is more; and no probe
        # over it for a while (a limit of 8 probed at 10 every few seconds drew 7% of the
        # calls in 429s, at 0.75 of its throughput). Random 429s leave no such round near (a
        # few in a large round of a large server).
        held = max(self._clean, most if 2 * self._clean >= most else 0)
        if held > cut:
            cut, self._held, self._over_until = held, held, now + _REPROBE_S
        changed = self._set(max(1, cut), now)
        self._cut = True
        return changed

    def full(self, in_flight: int) -> bool:
        """The server is full at ``in_flight``: a 429's pause was tested, and a request sent
        through it got through as soon as another ended (a parallel limit: LiteLLM's). One
        fewer from now, startup over, and none over that for a while: startup's step past it
        (9 to 17 at a limit of 8) sent eleven into it as the pause ended. True if changed."""
        now = self._clock()
        self._startup = self._opening = False
        self._rounds.clear()
        most = max(1, min(in_flight - 1, self.limit))
        self._held, self._over_until = most, now + _REPROBE_S
        changed = self._set(most, now)
        self._cut = True
        return changed

    def _startup_observe(self, latency_s: float, in_flight: int, now: float) -> bool:
        """Startup: a round trip at the limit, and more while the replies leave it in doubt;
        then the next step, or (two rounds that did not grow) the end."""
        if now - self._last_reply_at >= _BUNCH * latency_s:
            self._bunch_at = now  # the first of replies that come back together
        self._last_reply_at = now
        if now - latency_s < self._round_at - _SAME:
            # Sent at the old limit: no news of this one. If that one grew, the server took it
            # without a queue, and (first come, first served) the requests sent since do not
            # delay this one: its latency is one more sample of the latency without a queue.
            if self._pool_before:
                self._bar.pool(latency_s, latency_s * latency_s, 1)
            return False
        if self._opening and not self._bar.count:
            # The first back of the two sent at once queued behind nothing, at any server.
            self._bar.pool(latency_s, latency_s * latency_s, 1)
            self._best_limit, self._first_at = 1, now
            return False
        self._replies += 1
        self._latency_sum += latency_s
        self._latency_sq += latency_s * latency_s
        self._most_in_flight = max(self._most_in_flight, in_flight)
        if self._opening and self._replies == 1 and now - self._first_at <= _TOGETHER * latency_s:
            # Back together with the first: a one-slot server answers the second a whole
            # service time later.
            return self._open(now, together=True)
        if self._replies < max(self.limit, self._rebase, self._best_limit or _FIRST_REPLIES):
            return False
        # (The most, not the mean: of replies that come back together, each sees fewer out,
        # the next requests not yet sent.)
        if self._most_in_flight < _BUSY * self.limit:
            self._begin(now)  # too few jobs to keep the limit busy: no news of the server
            self._pool_before = False
            return False
        if self._opening:
            return self._open(now)
        if self._rebase:  # back at the last limit that grew, for the latency without a queue
            self._bar.pool(self._latency_sum, self._latency_sq, self._replies)
            self._rebase, self._pool_before = 0, True
            changed = self._set(self._retry, now)
            if self._opened is None:
                return changed
            opened, self._opened = self._opened, None
            return self._reopen(opened, now) or changed
        return self._startup_round(now)

    def _open(self, now: float, *, together: bool = False) -> bool:
        """The first round's replies in (two at once, the first in the bar): room for two
        if they say so clearly (a steady server); else the bar's other replies at one, and
        then the round judged against it, as a start at one would have."""
        self._opening = False
        if (together or self._judged()) and self.limit < self._ceiling:
            latency = self._latency_sum / self._replies
            return self._grow(self.limit / max(latency, 1e-9), latency, now)
        # The first reply was the faster of two at a server with room for both: a bar from
        # it is short, and the rounds set against it look full (a server with no limit held at
        # four or five for a minute).
        self._opened = (self._replies, self._latency_sum, self._latency_sq)
        self._bar = LatencyBar()
        self._retry, self._rebase = self.limit, _FIRST_REPLIES
        self._pool_before = False  # (sent at two: they may have queued)
        return self._set(1, now)

    def _reopen(self, opened: tuple[int, float, float], now: float) -> bool:
        """The bar complete at one: the first round at two, judged against it."""
        bar = self._bar
        self._rounds.append((1 / bar.mean, bar.mean))  # (as a start at one's first round)
        self._clean = max(self._clean, 1)
        self._replies, self._latency_sum, self._latency_sq = opened
        self._most_in_flight = self.limit
        return self._startup_round(now)

    def _startup_round(self, now: float) -> bool:
        """A round's replies in, at a busy limit: grow, wait for more replies, try the same
        limit again, or (flat for long enough) end startup."""
        latency = self._latency_sum / self._replies
        x = self.limit / max(latency, 1e-9)  # Little's law: in flight over latency
        if not self._best_limit:  # the first round: nothing to compare with
            return self._grow(x, latency, now)
        room = self._judged()
        if room is None:
            return False
        if room and self.limit < self._ceiling:
            return self._grow(x, latency, now)
        bar = self._bar
        if bar.count < _BASE_REPLIES and not bar.steady():
            # Too few replies in the bar to call it flat, at a server whose latency varies
            # (two short ones by chance made a 64-slot server look full at three): back to
            # the last limit that grew for more, then this one afresh.
            self._retry, self._rebase = self.limit, _BASE_REPLIES - bar.count
            self._pool_before = False  # (those sent at this limit may have queued)
            return self._set(self._best_limit, now)
        self._flat_x = x  # (the last: by then, the queue a rise built shows in the latency)
        self._flat += 1
        if self._flat < _FLAT_ROUNDS:  # a round's noise, maybe: the same limit again
            self._begin(now)
            self._pool_before = False  # (those sent at this limit may have queued)
            return False
        return self._end_startup(now)

    def _judged(self) -> bool | None:
        """This startup round against the bar (aiq.step_verdict): room, none, or in doubt."""
        return verdict(
            self._bar,
            self._replies,
            self._latency_sum,
            self._latency_sq,
            best=self._best_limit,
            limit=self.limit,
        )

    def _end_startup(self, now: float) -> bool:
        """Two rounds that did not grow: the limit is what the server took without a queue."""
        self._startup = False
        # What the server took without a queue: the most throughput seen, at the latency of
        # the rounds that grew (pooled: the least of their means is a lucky short one), and
        # less than the limit that gained nothing. Of the rounds that did not grow, only the
        # last: Little's law overstates throughput in the round trip after a rise, before
        # the queue it built shows in the latency.
        base = self._bar.mean
        most_x = max(self._flat_x, *(r[0] for r in self._rounds))
        estimate = min(most_x * base, self.limit - 1.0)
        # The cycle measures throughput over time; startup's short rounds would stand over
        # its own as the best for eight rounds (no probe would find room). What it keeps is
        # the latency without a queue, which its rounds, draining the queue a rise left,
        # may not see for a while.
        self._rounds.clear()
        self._rounds.append((0.0, base))
        return self._set(max(1, round(estimate)), now, estimate)

    def _grow(self, x: float, latency: float, now: float) -> bool:
        """Startup: the limit grew; the next step."""
        self._rounds.append((x, latency))
        self._bar.pool(self._latency_sum, self._latency_sq, self._replies)
        if not self._refused:
            self._clean = max(self._clean, self.limit)
        self._best_limit, self._flat, self._pool_before = self.limit, 0, True
        # The step starts at one and doubles (1, 2, 3, 5, 9, 17 ...): a server of up to four
        # slots is offered one more than it serves, not twice as many; a large one is
        # reached in one round trip more.
        changed = self._set(max(2, 2 * self.limit - 1), now)
        if self._bunch_at < now:
            # The replies before this one came back with it, and the requests sent for them
            # went out as the limit changed: they count for the new one (else, at three, a
            # round trip more; from the bunch's second reply only, at five another).
            self._round_at = max(self._bunch_at, now - _BUNCH * latency)
        return changed

    def _decide(self, x: float, latency: float, now: float) -> bool:
        if not self._refused:
            self._clean = max(self._clean, self.limit)
        best_before = max((r[0] for r in self._rounds), default=0.0)
        self._rounds.append((x, latency))
        estimate = max(r[0] for r in self._rounds) * min(r[1] for r in self._rounds)
        gain = _CYCLE[self._phase]
        probed = self._phase == 1  # (the round just measured was the probe's)
        self._phase = (self._phase + 1) % len(_CYCLE)
        roomy = probed and x >= _ROOM * best_before
        if probed:
            self._roomy = self._roomy + 1 if roomy else 0
        if self._roomy >= _RESTART and not self._refused and now >= self._over_until:
            return self._restart(x, latency, now)
        if roomy:
            gain, self._phase = _CYCLE[0], 1  # the probe found room: probe again, not drain
        base = max(1, round(estimate))
        if gain > 1:
            return self._set(max(base + 1, math.ceil(estimate * gain)), now, estimate)
        if gain < 1 and (estimate >= _FULL * self._ceiling or now < self._over_until):
            # The probe was held at the ceiling, or at the limit 429s found (a server that
            # refuses what it cannot take queues none): it built no queue to drain.
            gain = 1.0
        if gain < 1:
            self._drains += 1
            # A steady server's startup judged each step by exact latencies: no queue of a
            # step it had no room for stayed, and its first drain need not go below.
            if self._drains % _DEEP == 1 and (self._drains > 1 or not self._bar.steady()):
                # One below: at a small limit a tenth less rounds back to the limit itself, and
                # the queue of startup's last step (two or three at a one-slot server) stayed,
                # min R never seeing the latency without it.
                return self._set(max(1, min(round(estimate * gain), base - 1)), now, estimate)
        return self._set(max(1, round(estimate * gain)), now, estimate)

    def _restart(self, x: float, latency: float, now: float) -> bool:
        """Startup again from the limit whose probe found room (_RESTART)."""
        self._startup, self._roomy, self._phase = True, 0, 0
        self._rounds.pop()  # (_grow appends it again, and pools its latencies in the bar)
        return self._grow(x, latency, now)

    def _set(self, wanted: int, now: float, estimate: float | None = None) -> bool:
        # Capped: the server took all the ceiling allowed (or startup would double past it),
        # so it may well take more.
        if estimate is None:
            self.capped = wanted > self._ceiling
        else:
            self.capped = estimate >= _FULL * self._ceiling
        self._cut = False
        new = min(wanted, self._ceiling)
        if now < self._over_until:
            new = min(new, self._held)
        self._begin(now)
        if new == self.limit:
            return False
        self.limit = new
        return True
