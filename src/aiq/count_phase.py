"""Where a short window turns, found from its counts where its resets cannot say.

A window of a second that reports its reset in whole seconds (Kong's ``X-RateLimit-*-Second``:
``RateLimit-Reset`` is always 1 there; express-rate-limit's rounds up to 1) says nothing of when
it turns: :class:`~aiq.reset_turn.ResetTurn` can only take each turn at the sample's reply plus
a second, up to a second and a latency late (bench h-kong-second: the windows' turns 0.2-0.45 s
late, 0.92-0.96 of the quota). Its counts say more. Of two requests, the second sent after the
first's reply came back (so it reached the server later):

- a count that did not go down (``remaining`` as high or higher) was counted in a later window:
  the window turned between the two sends;
- a count higher than the requests we sent in between could have made in a new window was
  counted in the same one: it did not turn between them.

Each is an interval of the turn's phase (the windows turn every period), and they narrow it. Both
are on our clock of sends: a request's way to the server is taken as long as another's, so a
send after the turn so found reaches the server after its turn (give or take a jitter: the
turn is taken JITTER_S later). While the phase is wider than
PRECISE_S, the last request a window has left is held back and sent halfway across the interval
where the turn may be (:meth:`CountPhase.probe_before`): it is counted in one window or the
other, so it costs at most its own slot, and its reply halves the interval. A 429 says the phase
was wrong (another client's requests in the count, a server whose way in changed): forgotten and
learned again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from .reset_turn import WHOLE_S

# The phase is known once its interval is this share of the period: no more requests are held
# back to narrow it (each costs up to a slot; a turn taken this late costs as much of the window).
PRECISE = 0.01
# Requests sent this close together may reach the server in either order (one on a new
# connection, the event loop's own lateness).
REORDER_S = 0.005
# A turn found is taken this much later: a request held up on its way by more than the
# phase's own width (a network's jitter, a GC pause: tens of ms) still reaches the new window.
# Free where the window is fixed: its whole count still goes, a hair after its turn.
JITTER_S = 0.03
_SAMPLES = 64  # recent samples kept to find one answered before a request went
REFUSALS = 3  # 429s after a phase was taken that end it for the run


class CountPhase:
    """The turns of a window of ``period_s`` seconds: one in ``(lo, hi]`` on our clock of sends,
    the rest whole periods apart (``lo`` None until a pair of samples says)."""

    __slots__ = ("_refusals", "_samples", "hi", "lo", "off", "period_s")

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.off = False  # REFUSALS 429s since phases were taken: not this server's way
        self._refusals = 0
        self.lo: float | None = None
        self.hi = math.inf
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=_SAMPLES)

    @property
    def width_s(self) -> float:
        """How far apart the earliest and latest turn the samples allow are (a period: none
        known)."""
        return self.period_s if self.lo is None else self.hi - self.lo

    def sample(
        self,
        sent_at: float,
        now: float,
        remaining: float,
        count_limit: float,
        sent_between: Callable[[float, float], float],
    ) -> None:
        """A reply at ``now`` to a request sent at ``sent_at``: ``remaining`` of the window's
        ``count_limit``. ``sent_between(start, end)`` counts our requests sent in that time."""
        # The request sent last whose reply was back before this one went: it reached the
        # server first.
        before = None
        for sample in self._samples:
            if sample[1] < sent_at and (before is None or sample[0] > before[0]):
                before = sample
        self._samples.append((sent_at, now, remaining))
        if before is None or sent_at - before[0] >= self.period_s:
            return
        first_at, _, first_left = before
        if remaining >= first_left:
            self._narrow(first_at, sent_at)  # counted in a later window
            return
        # In a new window, all it counted came after the first request (which is not in it),
        # sent between the two (give or take the order of requests sent together).
        could = sent_between(first_at - REORDER_S, sent_at + REORDER_S) - 1
        if count_limit - remaining > could:
            self._narrow(sent_at, first_at + self.period_s)  # the same window

    def _narrow(self, start: float, end: float) -> None:
        """A turn in ``(start, end]`` (shorter than a period)."""
        if self.lo is None:
            self.lo, self.hi = start, end
            return
        period = self.period_s
        shift = math.floor((self.hi - end) / period)  # (no other shifts can meet)
        pieces = [
            (max(self.lo, start + k * period), min(self.hi, end + k * period))
            for k in (shift, shift + 1)
        ]
        pieces = [(lo, hi) for lo, hi in pieces if lo < hi]
        if not pieces:  # the samples disagree: the newest one is believed
            self.lo, self.hi = start, end
            return
        self.lo, self.hi = min(p[0] for p in pieces), max(p[1] for p in pieces)

    def end_of(self, sent_at: float) -> float | None:
        """The latest the window a request sent at ``sent_at`` counts in may turn (None: no
        phase known)."""
        if self.off or self.lo is None or self.width_s >= self.period_s:
            return None
        k = math.floor((sent_at - self.hi) / self.period_s) + 1  # (the first upper end after)
        hi, lo = self.hi + k * self.period_s, self.lo + k * self.period_s
        # A turn may have come just before it: its window then runs a whole period.
        return sent_at + self.period_s if lo < sent_at else hi

    def probe_before(self, turn_at: float) -> float:
        """When the last request the window turning at ``turn_at`` has left goes: halfway
        across where the turn may be, while that is wider than PRECISE (-inf: at once)."""
        width = self.width_s
        if self.off or width <= PRECISE * self.period_s:
            return -math.inf
        return turn_at - width / 2

    def refused(self) -> None:
        """A 429: once a phase was taken, it was wrong; forgotten, and after REFUSALS, not
        this server's way (the module's docstring)."""
        if self.end_of(0.0) is not None:
            self.lo, self.hi = None, math.inf
            self._refusals += 1
            self.off = self._refusals >= REFUSALS


class CountedTurns:
    """A budget's use of :class:`CountPhase`: for a window of a second whose resets are whole
    seconds (Kong's ``-Second``: always 1), and not once a reset had a fraction (a bucket
    refilled continuously says ``0s`` or ``1s`` at times, whole too, but has no turn and its
    count goes up between any two samples). ``probe_at``: when the last request the sampled
    window has left goes to look for the turn (-inf: at once)."""

    __slots__ = ("_fractions", "_phase", "probe_at")

    def __init__(self) -> None:
        self._phase: CountPhase | None = None
        self._fractions = False
        self.probe_at = -math.inf

    def turn_at(
        self,
        turn_at: float,
        *,
        sent_at: float,
        now: float,
        reset_s: float,
        period_s: float,
        remaining: float,
        count_limit: float,
        refused: bool,
        sent_between: Callable[[float, float], float],
    ) -> float:
        """The turn of the window a request sent at ``sent_at`` counts in: ``turn_at`` (its
        resets'), or sooner where its counts say (its reply: ``remaining`` of ``count_limit``
        a window of ``period_s``; ``refused``, a 429)."""
        self.probe_at = -math.inf
        self._fractions = self._fractions or not float(reset_s).is_integer()
        if self._fractions or period_s > WHOLE_S:
            return turn_at
        phase = self._phase
        if phase is None or phase.period_s != period_s:
            phase = self._phase = CountPhase(period_s)
        if refused:
            phase.refused()
            return turn_at
        phase.sample(sent_at, now, remaining, count_limit, sent_between)
        end = phase.end_of(sent_at)
        if end is None or end >= turn_at:
            self.probe_at = phase.probe_before(turn_at)
            return turn_at
        self.probe_at = phase.probe_before(end)  # (halfway across, jitter or none)
        return min(turn_at, end + JITTER_S)
