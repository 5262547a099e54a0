"""When a provider's window turns, pinned from the resets its replies give.

A reset is the time from when the provider wrote it to the window's turn, and a reply is up to
a latency old when it is read. Many gateways count whole seconds: Kong's ``RateLimit-Reset``
is the window's end less ``ngx.time()`` (the clock's whole second), express-rate-limit rounds
its reset up. So a reset of ``r`` puts the turn in ``(sent_at + r - 1, now + r]`` on our clock
(``sent_at`` the request's send, ``now`` its reply's arrival), and one sample alone takes the
turn up to a second and a latency late: a minute's window lost up to a second of its quota at
each turn (bench h-kong told the limit: 0.89, the turn 0.9 s late). Samples of one window
narrow it, each at another fraction of the server's second: the turn is taken at the least of
their upper ends, never before the server's own. A reset with a fraction (OpenAI's ``120ms``,
Azure's) is exact to the millisecond: its interval is the latency alone.

While a window's turn is pinned no closer than that and more requests wait for it than the
window has left, its last LOOKS requests are held back and sent across where the turn may be
(:meth:`ResetTurn.look_at`): each is counted in the old window or, past its turn, in the new
one, whose count its reply shows, and the rest go then. So the turn is found within a fraction
of the interval and a latency, at no cost (an express-rate-limit minute's, pinned from one
burst's replies: taken 0.7 s late, the run at 0.91 of its quota).

A server that cuts its reset down instead (a whole second less than the turn is away) shows
as a 429 to a request sent within a second after a turn so pinned: from then on each upper
end is a second later (:meth:`ResetTurn.refused`).
"""

from __future__ import annotations

import math

WHOLE_S = 1.0  # a reset in whole seconds: the turn may be up to this much nearer
EXACT_S = 0.001  # a reset with a fraction: to the millisecond
# A window's last requests held back to look for its turn (module docstring): one for each
# LOOK_SHARE of its count, at most LOOKS. Those sent after the turn, and those not sent when
# one shows it, count in the new window: the old one's slots they leave are at most this share.
LOOKS = 4
LOOK_SHARE = 150
LOOK_WIDTH_S = 0.05  # ...while the turn is pinned no closer than this


class ResetTurn:
    """The turn of the window the last samples came from: in ``(lo, hi]``, taken at ``hi``."""

    __slots__ = ("_grain", "_late_s", "_longest", "_passed", "hi", "lo")

    def __init__(self) -> None:
        self.lo = self.hi = -math.inf
        self._longest = 0.0  # the longest reset seen: the window is no shorter
        self._passed = -math.inf  # the turn pinned before this one
        self._grain = EXACT_S
        self._late_s = 0.0  # added to each upper end once a pinned turn proved early

    def turn_at(self, sent_at: float, now: float, reset_s: float) -> float:
        """A sample: a reset of ``reset_s`` in the reply (at ``now``) to a request sent at
        ``sent_at``. When the window it counts in turns, as narrowly as the samples of that
        window pin it."""
        self._grain = WHOLE_S if float(reset_s).is_integer() else EXACT_S
        self._longest = max(self._longest, reset_s)
        lo = sent_at + reset_s - self._grain
        hi = now + reset_s + self._late_s
        # The same window's turn if the two intervals meet and the turn pinned so far had not
        # come when this request went (one sent after it counts in a later window), as long
        # as the two together are too short to hold two turns: a second's window (Kong's
        # reset is always 1 there) is taken from each sample alone.
        single = (hi - lo) + (self.hi - self.lo) < self._longest
        if single and lo < self.hi and hi > self.lo and sent_at < self.hi:
            self.lo, self.hi = max(self.lo, lo), min(self.hi, hi)
        else:
            if sent_at >= self.hi:
                self._passed = self.hi
            self.lo, self.hi = lo, hi
        return self.hi

    def look_at(self, left: float, count: float) -> float:
        """When a request goes that leaves ``left`` of a window of ``count``: if it is one of
        the looks, spread across where the turn may be, the last one latest (-inf: at once;
        the turn is pinned, or the window is a second's, :mod:`aiq.count_phase`'s)."""
        looks = min(LOOKS, count // LOOK_SHARE)
        width = self.hi - self.lo
        if left >= looks or self._grain != WHOLE_S or self._longest <= WHOLE_S:
            return -math.inf
        if not LOOK_WIDTH_S < width < 2 * WHOLE_S:
            return -math.inf
        return self.lo + width * (looks - left) / (looks + 1)

    @property
    def longest_s(self) -> float:
        """The longest reset seen: the window is no shorter."""
        return self._longest

    def refused(self, sent_at: float) -> None:
        """A 429 to a request sent at ``sent_at``: sent within a second after a turn pinned
        from whole-second resets, it says the server's window had not turned. Its resets are
        cut down, not rounded up: each upper end a second later from now on."""
        if self._grain != WHOLE_S:
            return
        for turn in (self._passed, self.hi):  # (a sample since may have opened the next window)
            if turn <= sent_at < turn + WHOLE_S:
                self._late_s = WHOLE_S
