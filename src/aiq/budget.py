"""One per-minute limit (requests or tokens): its pace, its log, and the provider's window.

A :class:`Budget` answers one question for the rate limiter, "when may this cost go?", from
three things:

- **The pace** (GCRA): a virtual clock ``tat`` (the next free slot) moves forward by
  ``cost * 60 / (limit * headroom)`` per booking, so that with nothing else known requests are
  spread evenly rather than a minute's quota fired at once: providers may enforce a per-minute
  limit per second (60,000/min as 1,000/s), and an even pace a little under the limit passes
  both.
- **A guard** over the last 60 s while the provider has said nothing about its window (or a
  burst was refused): no booking that would put more than the limit into any 60-second
  window, which pacing alone lets a large token request do at the end of a full window.
- **The provider's window as its headers last showed it** (:meth:`Budget.sync`): what it
  says is left may go now, no more before its reset, and at the reset the pace starts over.
"""

from __future__ import annotations

import math

from .booking_log import Booking, BookingLog
from .ratelimit_headers import Window

WINDOW_S = 60.0
# Pace at this share of a limit: requests leave the event loop a few ms late now and then, so
# an exact pace would sometimes put one request too many into a provider's one-second window.
HEADROOM = 0.98
# A booking leaves the window a hair after it is 60 s old, so float rounding never keeps it in.
_EPSILON_S = 1e-6
# A window that says what is left but not when it refills (LiteLLM's router counts per
# calendar minute, its cache key the UTC minute): it is taken to refill at the next minute of
# the clock, this long after, for clocks that differ by a little.
CALENDAR_MARGIN_S = 0.5
# Senders booked ahead are let go into what a window says is left at most this often: each
# time wakes every sender. (Whether there is room is looked at on every reply: it costs a sum.)
REBOOK_EVERY_S = 0.025
# Another client's share of a bucket is learned this fast: a sample this many tokens emptier
# than the model said moves the share by one token a second (so a steady share is found in
# about this many seconds, the noise of a stale sample averaged over as long).
OUTSIDE_TAU_S = 1.0
_OUTSIDE_MAX = 0.9  # of the refill: some always left to find out that it stopped
# A provider's reset shorter than this describes a short window (per-second or 10-second
# enforcement): what it says is left is what it enforces.
SHORT_WINDOW_S = 10.0
# What a bucket refills in this long is kept back at its bottom. Our model of it starts
# refilling at our first booking, the provider's at the first arrival, a connection's
# handshake (and a busy event loop) later, so at the bottom ours runs ahead by about that
# much: about 1 run in 7 sent the request one past the bucket there, and Anthropic answers
# it with a whole second's retry-after for every sender (bench/README.md, "Session 10: the
# burst row"). It costs this much once, at the bottom of the bucket.
BUCKET_SKEW_S = 0.15


class RequestTooLarge(Exception):
    """One request needs more tokens than the whole tokens-per-minute limit: it never fits."""


class _Share:
    """Of a bucket's refill, what another client on the key spends (per second): learned
    from samples of the bucket emptier than our own bookings explain (raised) or fuller
    (lowered: it stopped). Requests only: a token booking is an estimate, and Anthropic
    reserves max_tokens on arrival, so a token bucket is emptier than its model by design."""

    __slots__ = ("learns", "rate", "sampled_at")

    def __init__(self, learns: bool) -> None:
        self.learns = learns
        self.rate = 0.0
        self.sampled_at = -math.inf

    def learn(self, owed: float, expected: float, nominal: float) -> None:
        """The sample says the bucket owes ``owed``, the model said ``expected``."""
        # (A bucket full, or predicted so, hides what was spent: nothing to learn.)
        if owed >= 1 and expected >= 1 and self.sampled_at > -math.inf:
            # (Raised faster than lowered: a share guessed low sends into an empty bucket.)
            missing = owed - expected
            tau_s = OUTSIDE_TAU_S if missing > 0 else 2 * OUTSIDE_TAU_S
            rate = self.rate + missing / tau_s
            self.rate = min(_OUTSIDE_MAX * nominal, max(0.0, rate))


class Budget:
    """One per-minute limit: its pace, its log of the last minute's bookings, and the
    provider's window as its headers last showed it.

    A configured limit whose window no header has shown is :attr:`presumed` a minute's bucket
    full at the start (OpenAI's, Anthropic's, Groq's; aiolimiter's and the cookbook client's
    way of counting), its burst opened as answers come back: the even pace until the first
    (what per-second enforcement allows), then the opening doubling each round trip
    (:meth:`grow`: TCP's slow start). A server counting some other way refuses about one
    round's excess: its first 429 ends this for the run (:meth:`stop_bursting`), and so do
    headers showing the limit's own window (:meth:`sync`)."""

    def __init__(
        self,
        per_minute: float,
        *,
        headroom: float = HEADROOM,
        configured: bool = True,
        outside: bool = False,
    ) -> None:
        if per_minute <= 0:
            raise ValueError("per_minute must be positive")
        self._headroom = headroom
        # A configured limit is a ceiling: the provider may report a lower one, which wins.
        self._ceiling = per_minute if configured else math.inf
        self.per_minute = per_minute
        self._interval = 60.0 / (per_minute * headroom)
        self._tat = -math.inf
        self._log = BookingLog(WINDOW_S)  # (in time order: the guard relies on it)
        self._guard = True  # the 60-second guard, while the provider's window is unknown
        # A minute's bucket refilled continuously (OpenAI's, full at the start), once the
        # headers show one: its capacity, refill, and when it is full again.
        self._bucket = False
        self._not_bucket = False  # a sample showed something else
        self._capacity = per_minute
        self._refill = per_minute * headroom / WINDOW_S  # per second, at our headroom
        self._own_full_at = -math.inf  # ...after our bookings
        self._seen_full_at = -math.inf  # ...after what the last sample showed
        self._outside = _Share(outside)  # another client's share of the refill
        self._booked_refill = self._refill  # the refill slots booked ahead were paced at
        # Any other window: at most ``_cap_left`` more before ``_cap_until``, when it has
        # refilled and the pace starts over (``_fresh_at``).
        self._cap_left = math.inf
        self._cap_until = -math.inf
        self._fresh_at = math.inf
        self._peak = 0.0  # the most any sample said was left: what a window lets go at once
        self._rebook_check_at = -math.inf
        self.burst = False  # what the provider says is left may go at once
        self.burst_off = False  # a 429 came after a burst: pace for the rest of the run
        self.presumed = configured  # taken for a bucket full at the start (class docstring)
        self.allowance = 1.0
        self._opened = 1.0  # the opening when slots booked ahead were last booked again
        self.shown = not configured  # whether headers have shown this limit's own window

    def set_limit(self, per_minute: float) -> None:
        """A new limit (one the provider reported); the pace changes from the next booking."""
        self.per_minute = per_minute
        self._interval = 60.0 / (per_minute * self._headroom)

    def pace_s(self, cost: float) -> float:
        """How far one booking of ``cost`` moves the pace."""
        return cost * self._interval

    @property
    def burst_size(self) -> float:
        """How much the provider's window lets go at once now (0 when paced)."""
        if self.presumed:  # (and the next round's opening: senders ready for it)
            return min(self.per_minute, 2 * self.allowance)
        if not self.burst:
            return 0.0
        return self._capacity if self._bucket else self._peak

    def ready_at(self, earliest: float, cost: float) -> float:
        """The first time from ``earliest`` that ``cost`` fits the pace, the guard and the
        provider's window."""
        if cost > self.per_minute:
            raise RequestTooLarge(f"needs {cost:.0f}, more than the limit of {self.per_minute:.0f}")
        at = max(earliest, self._log.last_at)
        if at < self._cap_until:
            if cost <= self._cap_left:
                if self.burst:  # the provider says it is left: it may go now
                    return at
            else:
                at = self._cap_until
        if self.presumed:  # a bucket of ``allowance``, refilled at the limit's pace
            need = min(cost, self.allowance)
            return max(at, self._own_full_at - (self.allowance - need) / self._refill)
        # In a minute's bucket the pace lets a minute's worth through at once (GCRA's
        # tolerance); the bucket below holds it to what the provider said is left.
        bursting = self.burst and self._bucket
        tolerance = (self.per_minute - 1.0) * self._interval if bursting else 0.0
        at = max(at, self._pace_at(at) - tolerance)
        if self._guard:
            # The oldest bookings leave the window first; wait for enough of them.
            used = self._log.sum
            for e in self._log:
                if e.at > at - WINDOW_S:
                    if used + cost <= self.per_minute:
                        break
                    at = e.at + WINDOW_S + _EPSILON_S
                used -= e.cost
        if not self._bucket:
            return at
        # The bucket holds ``cost`` once it is that far from full.
        need = min(cost, self._capacity) + self._refill * BUCKET_SKEW_S
        full_at = max(self._own_full_at, self._seen_full_at)
        return max(at, full_at - (self._capacity - need) / self._refill)

    def _pace_at(self, at: float) -> float:
        """The pace's next slot for a booking at ``at``: none owed from before the provider's
        window refilled, if ``at`` is after that and nothing is booked after it yet."""
        if at >= self._fresh_at > self._log.last_at:
            return min(self._tat, self._fresh_at)
        return self._tat

    def grow(self, cost: float) -> bool:
        """A request booked at ``cost`` was answered, not refused: a presumed bucket's burst
        opens by as much. True when it has doubled since it last said so: the slots booked
        ahead at the narrower opening are to be booked again (once a round trip, not once an
        answer: each time wakes every sender)."""
        if not self.presumed:
            return False
        # Two per answer: one for the room its request took, one more, so the requests it
        # lets out in a round trip double (one alone would only hold their number).
        self.allowance = min(self.per_minute, self.allowance + 2 * cost)
        doubled = self.allowance >= min(2 * self._opened, self.per_minute)
        if not doubled or self.allowance == self._opened:
            return False
        self._opened = self.allowance
        return True

    def book(self, at: float, cost: float) -> Booking:
        """Book ``cost`` at ``at`` (from :meth:`ready_at`, or later)."""
        if at >= self._fresh_at:
            self._tat, self._fresh_at = self._pace_at(at), math.inf
        self._tat = max(self._tat, at) + cost * self._interval
        drain = cost / self._refill
        self._own_full_at = max(self._own_full_at, at) + drain
        self._seen_full_at = max(self._seen_full_at, at) + drain
        if at < self._cap_until:
            self._cap_left -= cost
        return self._log.add(at, cost)

    def used(self, now: float) -> float:
        """What the log holds in the minute ending at ``now`` (bookings after it excluded)."""
        return self._log.used(now)

    def booked(self, start: float, end: float) -> float:
        """What the log holds booked from ``start`` to ``end`` (given back: none)."""
        return self._log.booked(start, end)

    def forget(self, entry: Booking) -> None:
        """Take a booking out of the window's count, and out of the bucket's drain (the
        provider did not count it); the pace is left as it is."""
        if entry.cost and self._log.holds(entry):
            self._own_full_at -= entry.cost / self._refill
        self._log.adjust(entry, 0.0)

    def settle(self, entry: Booking, cost: float) -> None:
        """The booking really cost ``cost``: correct the log, and the pace by the difference."""
        self._tat += (cost - entry.cost) * self._interval
        drain = (cost - entry.cost) / self._refill
        self._own_full_at += drain
        self._seen_full_at += drain
        self._log.adjust(entry, cost)

    def sync(
        self,
        now: float,
        reported: Window,
        entry: Booking | None = None,
        *,
        minute_left_s: float,
        refused: bool = False,
    ) -> bool:
        """Follow what the provider says about this budget in the headers of the reply to
        ``entry``'s request; True if slots booked ahead are to be booked again: the limit is
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
          once; over a sliding minute, at the pace.
        """
        rebook = self._follow_limit(now, reported.limit)
        if reported.remaining is None:
            return rebook
        # What the model of a bucket said before this sample, to learn from the difference.
        predicted = (max(self._own_full_at, self._seen_full_at), self._refill)
        remaining = float(reported.remaining)
        window_limit = float(reported.limit or self.per_minute)  # the provider's own limit
        per_s = window_limit / WINDOW_S
        reset = reported.reset_s
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
        self._guard = (self.burst_off and reported.reset_s is not None) or not own
        self._bucket = own and self._shows_bucket(remaining, reset, window_limit)
        self._cap_left, self._cap_until, self._fresh_at = math.inf, -math.inf, math.inf
        self._seen_full_at = -math.inf
        if self._bucket:
            # (A 429's sample: its own request is in the model, not in the provider's count.)
            learn = not refused
            return self._sync_bucket(now, remaining, window_limit, predicted, learn) or rebook
        # What is left may go at once where the provider says its window is short (then
        # ``remaining`` is what it enforces) or gives no reset (a calendar minute); over a
        # longer one, it is a ceiling for the pace (a minute may be enforced per second).
        # (A short window holds at most its seconds' share of the limit: more left than
        # that, with a short reset, is a longer window's count, Groq's requests per day.)
        short = reset is not None and reset < SHORT_WINDOW_S
        short = short and remaining <= window_limit * SHORT_WINDOW_S / WINDOW_S + 1
        self.burst = own and not self.burst_off and (reset is None or short)
        # A hair after the reset, so a boundary's float rounding never counts it as before.
        until = now + _EPSILON_S
        until += reset if reset is not None else minute_left_s + CALENDAR_MARGIN_S
        return self._sync_window(now, remaining, until, entry) or rebook

    def _shows_bucket(self, remaining: float, reset: float | None, limit: float) -> bool:
        """Whether a sample of the limit's own window is a minute's bucket's: what is left
        and what refills by the reset add up to the limit (OpenAI's, full at the start)."""
        if reset is None:
            return False
        full = remaining + reset * limit / WINDOW_S
        # A bucket fits every sample; one far off (a sliding minute's first: little used and
        # a minute to go, half again over the limit) says the window is something else, for
        # the run. One a little off (a rounded reset, a late reply) is only not a bucket's.
        if full > 1.5 * limit:
            self._not_bucket = True
        return abs(full - limit) <= max(2.0, 0.05 * limit) and not self._not_bucket

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
        owed = capacity - remaining + self._log.ahead(now)
        nominal = self._refill  # (sync set it from the provider's limit)
        full_at, refill = predicted
        share = self._outside
        if learn and share.learns:
            share.learn(owed, max(0.0, full_at - now) * refill, nominal)
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
            owed = capacity - remaining + self._log.ahead(now)
        self._seen_full_at = now + owed / new
        return rebook

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
        if room and now >= self._rebook_check_at:
            self._rebook_check_at = now + REBOOK_EVERY_S
            rebook = True  # slots booked ahead at the pace may go now
            self.drop_ahead(now)
            unseen = self._unseen(now, entry)
        self._cap_left, self._cap_until, self._fresh_at = remaining - unseen, until, until
        return rebook

    def _unseen(self, now: float, entry: Booking | None) -> float:
        """What we booked that the provider's count in the reply to ``entry`` may not hold:
        everything booked after it (or after ``now``, with no entry)."""
        return self._log.ahead(now) if entry is None else self._log.after(entry)

    def drop_ahead(self, now: float) -> None:
        """Take back every slot booked after ``now`` (their senders book again, told so by
        the rate limiter), and start the pace again from now, at the new limit."""
        log = self._log
        drain = log.take_back(now) / self._refill
        self._own_full_at -= drain
        self._seen_full_at -= drain
        # Never sooner than the pace after the last booking kept: a token booking's slot is
        # its cost long, and starting over from ``now`` would let the next one in beside it.
        kept = log.last.at + log.last.cost * self._interval if log else -math.inf
        self._tat = min(self._tat, max(now + self._interval, kept))
        if self._bucket:
            # The bucket's own drain moved to each booking's time (``book``): bookings far
            # ahead, taken back, leave it there unless it is walked again from what is left.
            full_at = -math.inf
            for e in log:
                full_at = max(full_at, e.at) + e.cost / self._refill
            self._own_full_at = min(self._own_full_at, max(full_at, now))

    def stop_bursting(self, now: float) -> None:
        """A 429: whatever the headers say, pace from now to the end of the run (and guard
        the minute, unless the headers show a bucket, which allows more). The pace starts
        from now: a burst moved it a minute ahead, and the bucket still holds what is left.
        A presumed bucket was wrong: pace evenly from now, with no guard (a server that
        shows no window is learned from its 429s: :mod:`aiq.refusal_limit`)."""
        if self.presumed:
            self.presumed, self._tat, self._guard = False, now, False
            self.burst_off = True
            return
        if self.burst and self._bucket:
            self._tat = min(self._tat, now)
        self.burst, self.burst_off, self._guard = False, True, not self._bucket

    def next_booked(self, now: float) -> float | None:
        """When the earliest booking after ``now`` goes (refunded ones are no request)."""
        return self._log.next_booked(now)
