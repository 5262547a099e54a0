"""A per-minute limit for a window whose headers say what is left and when it refills, but no
limit: Azure OpenAI's docs name only ``x-ratelimit-remaining-requests`` and ``-tokens``, and
it evaluates its limits over windows of 1 or 10 s (PROVIDERS.md). Without a limit the reply's
window went unread, and its 429s taught a minute's count it does not keep: 0.48 of the
quota, a quarter of the calls refused. Together's unsuffixed ``x-ratelimit-limit`` is such a
window's count, per second: read as per minute it would pace at a sixtieth.

A window holds at least the most it was seen to have left (and the one request that saw it),
and lasts at least the longest reset seen, so the limit is taken as that many per that long,
a minute's worth. It is followed as the provider's own: what is left may go before the reset,
no more (:mod:`aiq.window_sync`), so an estimate off by a little costs pace, never 429s.
"""

from __future__ import annotations

import math

# Windows longer than this are a day's count or a month's (no per-minute limit in them).
_LONGEST_S = 60.0
# A reset shorter than this says the window is at least this long: a sample taken as it
# turned would make a 10 s window's limit look hundreds of times larger.
_SHORTEST_S = 1.0


class ImpliedLimit:
    """The per-minute limit the samples of one window imply (:meth:`sample`)."""

    def __init__(self) -> None:
        self._most = 0.0  # the most left at once, with the request that saw it
        self._span_s: float | None = None  # the longest reset seen (None: none yet)
        self._turned_at: float | None = None  # the last turn a 429 named

    def turned(self, at: float) -> None:
        """A 429 named the window's turn exactly (Azure's ``retry-after-ms``). Two such turns
        are a whole number of windows apart, and a window is no shorter than the longest
        reset: the fewest windows between them that fit that is how long one is (turns 10 s
        apart with resets of up to 6.5 s seen: one 10 s window, not the 6.5 s that made
        each later turn come early, a 429 each)."""
        last, self._turned_at = self._turned_at, at
        span = self._span_s
        if last is None or span is None or at - last < span:
            return
        windows = math.floor((at - last) / span + 1e-6)
        self._span_s = max(span, (at - last) / windows)

    @property
    def span_s(self) -> float | None:
        """How long the window is taken to be (None: no reset seen yet)."""
        return self._span_s

    def sample(self, remaining: int, reset_s: float | None, count: int | None = None) -> int | None:
        """The limit per minute after one more sample, or None if none is implied yet (no
        reset seen: a 429's exact ``retry-after`` is one) or the window is too long to.
        ``count``: how many the window holds, where the headers say (Together's limit per
        second, unsuffixed), else the most seen left is all that shows it."""
        self._most = max(self._most, remaining + 1.0, float(count or 0))
        if reset_s is not None:
            if reset_s > _LONGEST_S:
                return None
            self._span_s = max(self._span_s or _SHORTEST_S, reset_s)
        if self._span_s is None:
            return None
        return math.ceil(self._most * 60.0 / self._span_s)
