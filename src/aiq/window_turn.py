"""When a window that is no bucket turns, as :class:`~aiq.window_sync.WindowSync` reads it
from a sample: at its reset (pinned over samples by :mod:`aiq.reset_turn`, or sooner by a
second's counts, :mod:`aiq.count_phase`); a calendar minute's count (LiteLLM's router: what
is left, no reset) just after the clock's minute; a window that shows neither reset nor
limit (Azure's) at the clock's minute, or sooner where it never held half the limit, anchored
from a turn a 429 named.
"""

from __future__ import annotations

import math

from .booking_log import Booking, BookingLog
from .count_phase import CountedTurns
from .outside_share import OutsideShare
from .ratelimit_headers import Window
from .reset_turn import ResetTurn
from .window_shape import WINDOW_S

# How far a server's clock may be behind ours: a 429 to a request sent this soon after the
# clock's minute turned is the old minute's count (its senders wait this long after the
# turn), and a window that shows neither reset nor limit (Azure's) is guessed to turn this
# long after the clock's minute.
CALENDAR_MARGIN_S = 0.5
# A calendar minute the headers show (LiteLLM's router: what is left, no reset; its cache
# key is the UTC minute) is taken to turn this long after the clock's minute, its pace
# starting over; its first request not refused by the time a 429 would be back lets the
# minute's count go (Budget.let_in_turn), else the first reply does. NTP keeps clocks within
# tens of milliseconds. At half a second and a reply, every turn cost 0.7 s (bench
# c-litellm-configured 0.925). A turn no header shows is looked at this long after it too,
# one request first (aiq.refusal_limit): a server whose clock is further behind costs that
# one 429 and two seconds.
TURN_MARGIN_S = 0.1
# A window that shows neither reset nor limit, its turn not yet named by a 429, is looked at
# again this long after its last sample.
LOOK_S = 1.0


def early_in_minute(since_turn_s: float) -> bool:
    """Whether a request sent ``since_turn_s`` after the clock's minute turned, and refused
    by a calendar minute's count, was sent before the server's own turn: its clock behind
    ours by up to CALENDAR_MARGIN_S. (Its 429 is the old minute's count: no burst refused.)"""
    return 0.0 <= since_turn_s < CALENDAR_MARGIN_S


class WindowTurn:
    """The turn-finding half of :class:`~aiq.window_sync.WindowSync` (its state is set and
    documented in ``Budget.__init__``)."""

    per_minute: float
    implied: bool
    resetless: bool
    _log: BookingLog
    _calendar: bool
    _outside: OutsideShare
    _peak: float
    _anchor_at: float
    _reset_turn: ResetTurn
    _counted: CountedTurns

    def _shows_calendar(self, reported: Window) -> bool:
        """Whether a sample is a calendar minute's count: a limit, no reset (LiteLLM's
        router; Azure's shows no limit, or one only implied)."""
        return reported.reset_s is None and reported.limit is not None and not self.implied

    def _turn_in_s(
        self,
        now: float,
        reported: Window,
        entry: Booking | None,
        sent_at: float | None,
        remaining: float,
        window_limit: float,
        minute_left_s: float,
        refused: bool,
    ) -> float:
        """Seconds to the turn of a window that is no bucket: its reset (as
        :class:`~aiq.reset_turn.ResetTurn` pins it from this and earlier samples); a calendar
        minute's TURN_MARGIN_S after the clock's; one showing neither reset nor limit, as
        :meth:`_turn_s` finds it."""
        if self._shows_calendar(reported):
            return minute_left_s + TURN_MARGIN_S
        sent_at = now if sent_at is None else sent_at  # (a reply is a latency old)
        if reported.reset_s is not None:
            if refused:
                self._reset_turn.refused(sent_at)
            turn_at = self._reset_turn.turn_at(sent_at, now, reported.reset_s)
            return self._counted_turn(now, entry, reported, remaining, refused, turn_at) - now
        self.resetless = True
        minute_s = minute_left_s + CALENDAR_MARGIN_S
        return self._turn_s(now, sent_at, remaining, window_limit, minute_s)

    def _counted_turn(
        self,
        now: float,
        entry: Booking | None,
        reported: Window,
        remaining: float,
        refused: bool,
        turn_at: float,
    ) -> float:
        """``turn_at``, or sooner where a second's window's counts say
        (:class:`~aiq.count_phase.CountedTurns`). Requests only: a token booking is an
        estimate."""
        if not (self._outside.learns and entry is not None):
            return turn_at
        period_s = self._span_s(reported)
        return self._counted.turn_at(
            turn_at,
            sent_at=entry.at,
            now=now,
            reset_s=float(reported.reset_s or 0.0),
            period_s=period_s,
            remaining=remaining,
            count_limit=float(reported.limit or self.per_minute) * period_s / WINDOW_S,
            refused=refused,
            sent_between=self._log.booked,
        )

    def _turn_s(
        self, now: float, sent_at: float, remaining: float, window_limit: float, minute_s: float
    ) -> float:
        """Seconds to the turn of a window that shows neither reset nor limit: the clock's
        next minute (``minute_s``), as a calendar minute's count, unless it was never seen
        to hold half the limit. Then it is shorter (Azure evaluates over 1 or 10 s windows
        and names only what is left; a minute's cap on a 10 s window sent a sixth of the
        quota): as long as what it holds at most implies, turning that long after one a 429
        named (:meth:`anchor`), from the request the sample answers. With none named yet,
        requests look again a second on: the first one refused names it (Azure's
        ``retry-after-ms``). One that shows its limit (LiteLLM's router) counts its calendar
        minute."""
        most = max(self._peak, remaining) + 1.0  # (and the request that saw it)
        if most >= window_limit / 2:
            return minute_s
        span_s = WINDOW_S * most / window_limit
        if self._anchor_at == -math.inf:
            return min(span_s, LOOK_S)  # (its 429 names the turn: anchored from then)
        # The first turn after the request it answers went (one since is past: the sample is
        # the old window's, and the new one is open).
        turns = max(0, math.ceil((sent_at - self._anchor_at) / span_s))
        return self._anchor_at + turns * span_s - now

    @property
    def calendar(self) -> bool:
        """Whether the last sample showed a calendar minute's count (a limit, no reset:
        LiteLLM's router)."""
        return self._calendar

    def anchor(self, turn_at: float) -> None:
        """A 429 named when the window turns (its exact ``retry-after``): a window that shows
        no reset turns then, and every span after."""
        self._anchor_at = turn_at

    def _span_s(self, reported: Window) -> float:
        """How long the window is: as the headers name it, else no shorter than its resets."""
        return reported.span_s or self._reset_turn.longest_s
