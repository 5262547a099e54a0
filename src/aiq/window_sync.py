"""How a :class:`~aiq.budget.Budget` follows the provider's window from each reply's headers.

A sample (``limit``, ``remaining``, ``reset``) replaces the last one, never a count added to
ours. Where the three add up to a minute's bucket refilled continuously (OpenAI's, full at
the start), what it holds may go at once and another client's share of its refill is learned
(:class:`_Share`); a sliding window (Kong's) is followed as a bucket of its count (which kind
a window is: :mod:`aiq.window_shape`); any other window (per-second or 10-second enforcement,
a calendar minute, a day's count) caps what may go before its reset, where the pace starts
over (when such a window turns: :mod:`aiq.window_turn`). The budget's own half (pace, guard,
log) is in :mod:`aiq.budget`; this is the half that reads the provider.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .booking_log import Booking
from .ratelimit_headers import Window
from .window_shape import SHORT_WINDOW_S, WINDOW_S, WindowShape
from .window_turn import WindowTurn, early_in_minute

# A booking leaves the window a hair after it is 60 s old, so float rounding never keeps it in.
EPSILON_S = 1e-6
# Senders booked ahead are let go into what a window says is left at most this often: each
# time wakes every sender. (Whether there is room is looked at on every reply: it costs a sum.)
REBOOK_EVERY_S = 0.025


def _short(remaining: float, reset_s: float, limit: float) -> bool:
    """Whether a sample shows a short window (per-second or 10-second enforcement): a short
    reset, and no more left than its seconds' share of the limit (more, with a short reset,
    is a longer window's count: Groq's requests per day)."""
    return reset_s <= SHORT_WINDOW_S and remaining <= limit * SHORT_WINDOW_S / WINDOW_S + 1


class WindowSync(WindowTurn):
    """:class:`~aiq.budget.Budget`'s reading of the provider's samples (its state is set
    and documented in ``Budget.__init__``; the attributes the turn reads, in
    :class:`~aiq.window_turn.WindowTurn`)."""

    presumed: bool
    shown: bool
    stated: bool
    burst: bool
    burst_off: bool
    _headroom: float
    _ceiling: float
    _guard: bool
    _bucket: bool
    _shape: WindowShape
    _capacity: float
    _refill: float
    _own_full_at: float
    _seen_full_at: float
    _booked_refill: float
    _cap_left: float
    _cap_until: float
    _fresh_at: float
    _rebook_check_at: float
    _turn_at: float
    _woken_until: float

    if TYPE_CHECKING:

        def set_limit(self, per_minute: float) -> None: ...
        def drop_ahead(self, now: float) -> None: ...

    def sync(
        self,
        now: float,
        reported: Window,
        entry: Booking | None = None,
        *,
        minute_left_s: float,
        refused: bool = False,
        sent_at: float | None = None,
    ) -> bool:
        """Follow what the provider says about this budget in the headers of the reply to
        ``entry``'s request (with none, to one sent at ``sent_at``, before the limit was
        known; with neither, now); True if slots booked ahead are to be booked again: the limit is
        lower (they are too close), or what is left may go now (they are too far).

        The sample is the provider's window, replacing the last one, never a count to add to
        ours: ``remaining`` is what may still go, less what we booked after the request it
        answers (the provider may count at arrival, so a reply is a latency old), and
        ``reset`` when the window is full again. So usage beyond ours (another client on the
        key) holds back only until the window has refilled, never later.

        - **A minute's bucket** (``remaining + reset * limit / 60`` is the limit: OpenAI's,
          full at the start, ``reset`` the time to full): what it holds may go at once
          (:attr:`burst`), then the pace at which it refills. A 429 ends bursts for the run
          (per-second enforcement behind minute headers); the bucket still says what is left.
        - **Any other window**: no more than ``remaining`` before ``reset`` (with none, the
          next minute of the clock: LiteLLM counts calendar minutes), when the window has
          refilled and the pace starts over. Where the window is short (per-second or
          10-second enforcement, fixed or refilled) or has no reset, ``remaining`` may go at
          once; over a longer one, at the pace.
        - **A sliding window** (the last window's count still weighing at a turn: Kong's) is
          followed as a bucket of its count, refilled at the limit's pace.
        """
        rebook = self._follow_limit(now, reported.limit)
        if reported.remaining is None:
            return rebook
        since_turn_s = entry.at - (now + minute_left_s - WINDOW_S) if entry is not None else -1
        if refused and self._shows_calendar(reported) and early_in_minute(since_turn_s):
            return rebook  # the old minute's count: the server's clock is behind ours
        # What the model of a bucket said before this sample, to learn from the difference.
        predicted = (max(self._own_full_at, self._seen_full_at), self._refill)
        remaining = float(reported.remaining)
        window_limit = float(reported.limit or self.per_minute)  # the provider's own limit
        reset = reported.reset_s
        own = self._take_window(remaining, reset, window_limit)
        capacity = self._bucket_capacity(now, reported, remaining, entry, own)
        if capacity is not None:
            # (A 429's sample: its own request is in the model, not in the provider's count.)
            learn = not refused
            sync = self._sync_bucket(now, remaining, capacity, predicted, learn, entry)
            return sync or rebook
        # What is left may go at once where the provider says its window is short (then
        # ``remaining`` is what it enforces) or gives no reset (a calendar minute); over a
        # longer one, it is a ceiling for the pace (a minute may be enforced per second).
        # A window the headers name (a gateway's minute) is the server's own count: what it
        # says is left it takes now, as a bucket's content.
        named = reported.span_s is not None and reported.span_s <= WINDOW_S
        short = reset is None or named or _short(remaining, reset, window_limit)
        self.burst = own and not self.burst_off and short
        if entry is not None:
            sent_at = entry.at
        turn_s = self._turn_in_s(
            now, reported, entry, sent_at, remaining, window_limit, minute_left_s, refused
        )
        # (A hair after the turn, so a boundary's float rounding never counts it as before.)
        return self._sync_window(now, remaining, now + EPSILON_S + turn_s, entry) or rebook

    def _take_window(self, remaining: float, reset: float | None, window_limit: float) -> bool:
        """What kind of window a sample shows: the limit's own (True) or a ceiling over it;
        its refill, guard, whether a bucket. The last sample's cap is cleared."""
        per_s = window_limit / WINDOW_S
        # A configured limit under the provider's is the user's own, the provider's window
        # (Groq's requests per day) a ceiling for it.
        own = window_limit <= self.per_minute * 1.05
        if own or not self.presumed:  # (a presumed bucket refills at its own limit's pace)
            self._refill = per_s * self._headroom
        if own and not self.shown:  # the limit's own window, shown: it rules from now
            self.shown = True
            self.presumed = False  # (the pace keeps what the burst owes it)
        # The 60-second guard once a burst was refused (not over a bucket: set there), but
        # not where the window has no reset: that is taken for a calendar minute (LiteLLM's
        # router), whose own count says what may go from its turn. Guarded, a burst refused
        # 15 s before the turn held the rest a whole minute from the burst.
        self._calendar = own and reset is None
        # (Not over a limit a 429 named: a minute's bucket, OpenAI's or Groq's.)
        self._guard = ((self.burst_off and not self._calendar) or not own) and not self.stated
        self._bucket = own and self._shape.bucket(remaining, reset, window_limit)
        self._cap_left, self._cap_until, self._fresh_at = math.inf, -math.inf, math.inf
        self._seen_full_at = -math.inf
        self._counted.probe_at = -math.inf
        return own

    def _bucket_capacity(
        self, now: float, reported: Window, remaining: float, entry: Booking | None, own: bool
    ) -> float | None:
        """What a sample of the limit's own window (``own``) is followed as a bucket of: a
        minute's bucket, its limit; a window seen to slide (:meth:`WindowShape.slide`), its
        count; None where it is neither."""
        limit = float(reported.limit or self.per_minute)
        span_s = self._span_s(reported)
        if own and entry is not None:
            slides = self._shape.slide(
                now,
                remaining,
                reported.reset_s,
                limit=limit,
                span_s=span_s,
                turn_at=self._reset_turn.hi,
                sent_at=entry.at,
                sent_between=self._log.booked,
            )
            if slides:
                self._bucket = True
                return limit * min(span_s, WINDOW_S) / WINDOW_S
        return limit if self._bucket else None

    @property
    def slides(self) -> bool:
        """Whether the limit's own window was seen to slide (:meth:`WindowShape.slide`)."""
        return self._shape.slides

    def _follow_limit(self, now: float, reported: int | None) -> bool:
        """A limit the provider reports below ours wins; True if slots booked ahead at the
        old pace were taken back (too close for the new one)."""
        if not reported:
            return False
        limit = min(self._ceiling, reported)
        if limit == self.per_minute:
            return False
        lower = limit < self.per_minute
        self.set_limit(limit)
        if lower:
            self.drop_ahead(now)
        return lower

    def _sync_bucket(
        self,
        now: float,
        remaining: float,
        capacity: float,
        predicted: tuple[float, float],
        learn: bool = True,
        entry: Booking | None = None,
    ) -> bool:
        """A minute's bucket sampled: ``remaining`` from full. True if a burst begins.

        ``predicted`` is when the model said it would be full, at what refill: a bucket
        emptier than that was spent by another client on the key, and its share is learned
        as a rate (``_outside``) taken from the refill, so the model stops sending into a
        bucket it keeps finding empty; fuller, and the share shrinks back (it stopped)."""
        rebook = False
        # A bucket allows more than a minute's worth in a minute: no 60-second guard.
        self._guard = False
        self._capacity = capacity
        if not self.burst_off and not self.burst:
            self.burst = rebook = True  # slots booked ahead at the pace may go now
            self.drop_ahead(now)
        # Our bookings not sent yet come on top of what the bucket is from full. Only those:
        # the ones sent since the request this answers may be counted already (a reply's
        # headers may be written as it leaves), and a bucket's debt is paid at its refill, a
        # minute for a minute's worth; our own bookings drain the model of it apart
        # (``_own_full_at``), so a stale sample sends no more.
        owed = capacity - remaining + self._owed_ahead(now, entry)
        nominal = self._refill  # (sync set it from the provider's limit)
        full_at, refill = predicted
        share = self._outside
        if share.learns:
            expected = max(0.0, full_at - now) * refill
            if learn:
                share.learn(owed, expected, nominal)
            elif remaining < 1:
                share.refused_empty(expected, nominal)
        share.sampled_at = now
        new = nominal - share.rate
        if self._own_full_at > now:  # (what our bookings owe, kept, at the new refill)
            self._own_full_at = now + (self._own_full_at - now) * refill / new
        self._refill = new
        if abs(new - self._booked_refill) > 0.1 * nominal and now >= self._rebook_check_at:
            # Slots booked ahead at the old share are too close or too far: booked again.
            self._rebook_check_at = now + REBOOK_EVERY_S
            self._booked_refill = new
            self.drop_ahead(now)
            rebook = True
            owed = capacity - remaining + self._owed_ahead(now, entry)
        self._seen_full_at = now + owed / new
        return rebook

    def _owed_ahead(self, now: float, entry: Booking | None) -> float:
        """What a bucket's sample leaves out of our own: bookings not sent yet; over a sliding
        window, whose count the headers show as the request arrived (Kong's), everything
        sent after the request it answers too (our own model of it is no help: it refilled
        from each booking, and the window gives nothing back before its turn)."""
        if self._shape.slides:
            return self._unseen(now, entry)
        return self._log.ahead(now)

    def _sync_window(
        self, now: float, remaining: float, until: float, entry: Booking | None
    ) -> bool:
        """Any other window sampled: no more than ``remaining`` (less what it may not have
        counted) before ``until``, the pace starting over there. True if slots booked ahead
        may go now into what it says is left."""
        rebook = False
        self._peak = max(self._peak, remaining)
        unseen = self._unseen(now, entry)
        # Room for slots booked ahead: they are booked again, at most now and then (each time
        # wakes every sender). Only a look that finds room waits for the next: a bunch of
        # replies comes at once, and the first of them may show none where a later one does.
        log = self._log
        room = self.burst and log.last_at > now and remaining - unseen + log.ahead(now) >= 1
        # The turn pinned sooner than the last sample said (aiq.reset_turn): senders waiting
        # for the later one look again (each express-rate-limit window's turn went 0.6 s
        # late, its first request held to the first reply's reset).
        sooner = until < self._woken_until - REBOOK_EVERY_S
        if (room or sooner) and now >= self._rebook_check_at:
            self._rebook_check_at, self._woken_until = now + REBOOK_EVERY_S, until
            rebook = True  # slots booked ahead at the pace may go now
            self.drop_ahead(now)
            unseen = self._unseen(now, entry)
        self._cap_left, self._cap_until, self._fresh_at = remaining - unseen, until, until
        self._turn_at = until if self._calendar else math.inf
        return rebook

    def _unseen(self, now: float, entry: Booking | None) -> float:
        """What we booked that the provider's count in the reply to ``entry`` may not hold:
        everything booked after it, and at least what was sent in the last second and not
        answered: a request sent before ``entry``'s on a new connection may reach the
        provider after it (at 20,000 a minute on a per-second bucket, the opening burst's
        replies let up to 16% more go than the bucket held). With no entry (a request sent
        before the limit was known: the second of startup's two, or one of a fixed
        concurrency's first round), the last second's too: a burst sent on the first
        sample's word was read as counted, and 6 went over a gateway's minute."""
        log = self._log
        if entry is None:
            return log.open_recent(now)
        return max(log.after(entry), log.open_recent(now, but=entry))
