"""What kind of window a limit's samples (``limit``, ``remaining``, ``reset``) show: a minute's
bucket refilled continuously (OpenAI's, full at the start), a sliding window (Kong's default),
or some other window (fixed, calendar-aligned, short). :class:`~aiq.budget.Budget` follows
the first two as a bucket (:mod:`aiq.window_sync`), the rest as a cap until the reset.
"""

from __future__ import annotations

from collections.abc import Callable

WINDOW_S = 60.0
# A provider's reset no longer than this describes a short window (per-second or 10-second
# enforcement): what it says is left is what it enforces (a sliding one is not looked for:
# it costs no more than its span).
SHORT_WINDOW_S = 10.0
# A long window's sample whose reset is within this of the whole window was taken at its
# start (whole-second resets: Kong's on nginx's clock), where a fixed window shows its whole
# count again and a sliding one still weighs the last.
SLIDE_EARLY_S = 2.0


class WindowShape:
    """A budget's reading of its window's kind, from the samples of the limit's own window."""

    __slots__ = ("_last_fit", "_moved", "_not_bucket", "_strayed", "slides")

    def __init__(self) -> None:
        self._not_bucket = False  # a sample far off a bucket's: not one, for the run
        # A sample did not fit a bucket: the last that did since, and whether two showed its
        # reset move against what is left.
        self._strayed = False
        self._last_fit: tuple[float, float] | None = None
        self._moved = False
        self.slides = False  # the window slides (:meth:`slide`): followed as a bucket

    def bucket(self, remaining: float, reset: float | None, limit: float) -> bool:
        """Whether a sample is a minute's bucket's: what is left and what refills by the
        reset add up to the limit (OpenAI's, full at the start)."""
        if reset is None:
            return False
        full = remaining + reset * limit / WINDOW_S
        # A bucket fits every sample; one far off (a sliding minute's first: little used and
        # a minute to go, half again over the limit) says the window is something else, for
        # the run. One a little off (a rounded reset, a late reply) is only not a bucket's;
        # a reset in whole seconds is off by at most a second's refill.
        if full > 1.5 * limit:
            self._not_bucket = True
        off = 0.05 * limit if not float(reset).is_integer() else limit / WINDOW_S + 1.0
        if abs(full - limit) > max(2.0, off) or self._not_bucket:
            self._strayed = True
            return False
        if not self._strayed or self._moved:
            return True
        # After one that did not fit, a fixed window's burst passes through such samples (what
        # is left falls, its reset with the clock: 2 to 10 of 600 over, at the refill the
        # bucket was taken to have while they fit): two must show the reset moving against
        # what is left, as a bucket's does (up as it is spent, down as it refills).
        last, self._last_fit = self._last_fit, (remaining, reset)
        self._moved = last is not None and (remaining - last[0]) * (reset - last[1]) < 0
        return self._moved

    def slide(
        self,
        now: float,
        remaining: float,
        reset: float | None,
        *,
        limit: float,
        span_s: float,
        turn_at: float,
        sent_at: float,
        sent_between: Callable[[float, float], float],
    ) -> bool:
        """Whether the window slides (for the run, once a sample shows it): at the start of a
        long window (``span_s``; its turn pinned so far ``turn_at``), far less is left than a
        fixed window's count would show (its whole count, less what we sent from its turn to
        the request sampled, sent at ``sent_at``: ``sent_between(start, end)``): the last
        window's count still weighs, and gives its room back
        at the limit's pace (Kong's sliding minute, its plugin's default). Capped until its
        reset, a whole minute was lost after every full one (bench h-kong-sliding 0.49), and
        its 429s' ``Retry-After`` asks as long."""
        if self.slides:
            return True
        if reset is None or not SHORT_WINDOW_S < span_s <= WINDOW_S:
            return False
        # (The first samples of a window: its turn a window after the one pinned so far.)
        if reset < span_s - SLIDE_EARLY_S or now + reset < turn_at + span_s / 2:
            return False
        # (Whole-second resets: the turn up to a second before the one they say.)
        sent = sent_between(sent_at - (span_s - reset) - 1.0, sent_at)
        self.slides = remaining + sent < limit * span_s / WINDOW_S / 2
        return self.slides
