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
- **The provider's window as its headers last showed it** (:meth:`Budget.sync`, in
  :mod:`aiq.window_sync`): what it says is left may go now, no more before its reset, and at
  the reset the pace starts over.
"""

from __future__ import annotations

import math

from .booking_log import Booking, BookingLog
from .count_phase import CountedTurns
from .outside_share import OutsideShare
from .reset_turn import ResetTurn
from .window_shape import WindowShape
from .window_sync import EPSILON_S, WINDOW_S, WindowSync
from .window_turn import CALENDAR_MARGIN_S, TURN_MARGIN_S

__all__ = [
    "CALENDAR_MARGIN_S",
    "HEADROOM",
    "TURN_MARGIN_S",
    "WINDOW_S",
    "Budget",
    "RequestTooLarge",
]

# Pace at this share of a limit: requests leave the event loop a few ms late now and then, so
# an exact pace would sometimes put one request too many into a provider's one-second window.
HEADROOM = 0.98
# What a bucket refills in this long is kept back at its bottom. Our model of it starts
# refilling at our first booking, the provider's at the first arrival, a connection's
# handshake (and a busy event loop) later, so at the bottom ours runs ahead by about that
# much: about 1 run in 7 sent the request one past the bucket there, and Anthropic answers
# it with a whole second's retry-after for every sender (bench/README.md, "Session 10: the
# burst row"). It costs this much once, at the bottom of the bucket.
BUCKET_SKEW_S = 0.15


class RequestTooLarge(Exception):
    """One request needs more tokens than the whole tokens-per-minute limit: it never fits."""


class Budget(WindowSync):
    """One per-minute limit: its pace, its log of the last minute's bookings, and the
    provider's window as its headers last showed it.

    A configured limit whose window no header has shown is :attr:`presumed` a minute's bucket
    full at the start (OpenAI's, Anthropic's, Groq's; aiolimiter's and the cookbook client's
    way of counting), its burst opened as answers come back: the even pace until the first
    (what per-second enforcement allows), then the opening doubling each round trip
    (:meth:`grow`: TCP's slow start), and past a minute's worth one request looks first
    (:meth:`_beyond_minute`). A server counting some other way (per second) refuses about one
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
        self._calendar = False  # the last sample showed no reset: a calendar minute's count
        # A minute's bucket refilled continuously (OpenAI's, full at the start), once the
        # headers show one: its capacity, refill, and when it is full again.
        self._bucket = False
        self._shape = WindowShape()  # ...or a sliding window, followed as one
        self._capacity = per_minute
        self._refill = per_minute * headroom / WINDOW_S  # per second, at our headroom
        self._own_full_at = -math.inf  # ...after our bookings
        self._seen_full_at = -math.inf  # ...after what the last sample showed
        # The booking that found the model full (its drain's start), until a reply shows when
        # the provider began to count: :meth:`reached`.
        self._drain_from: Booking | None = None
        self._outside = OutsideShare(outside)  # another client's share of the refill
        self._booked_refill = self._refill  # the refill slots booked ahead were paced at
        # Any other window: at most ``_cap_left`` more before ``_cap_until``, when it has
        # refilled and the pace starts over (``_fresh_at``).
        self._cap_left = math.inf
        self._cap_until = -math.inf
        self._fresh_at = math.inf
        self._peak = 0.0  # the most any sample said was left: what a window lets go at once
        self._rebook_check_at = -math.inf
        self._anchor_at = -math.inf  # a turn a 429 named, for a window that shows no reset
        self._reset_turn = ResetTurn()  # a window's turn, pinned from its samples' resets
        self._woken_until = math.inf  # ...when senders last booked again for it
        self._counted = CountedTurns()  # a second's window: its turn from its counts
        # A calendar minute's turn, its first request sent past it while out (let_in_turn),
        # and the last turn so looked at (one look a turn).
        self._turn_at, self._looked_at = math.inf, -math.inf
        self._turn_look: Booking | None = None
        self.burst = False  # what the provider says is left may go at once
        self.burst_off = False  # a 429 came after a burst: pace for the rest of the run
        self.presumed = configured  # taken for a bucket full at the start (class docstring)
        self.allowance = 1.0
        # Presumed: the one request past a minute's worth, while out, and whether one got
        # through (the server allows more than the limit in a minute: a bucket's refill).
        self._probe: Booking | None = None
        self._past_minute = False
        self._opened = 1.0  # the opening when slots booked ahead were last booked again
        self.shown = not configured  # whether headers have shown this limit's own window
        self.stated = False  # a 429 named the limit (:meth:`follow_stated`)
        self.implied = False  # no header named the limit: its window's samples imply it
        self.resetless = False  # its window showed neither reset nor limit (Azure's)

    def set_limit(self, per_minute: float) -> None:
        """A new limit (one the provider reported); the pace changes from the next booking."""
        self.per_minute = per_minute
        self._interval = 60.0 / (per_minute * self._headroom)

    def follow_stated(self, per_minute: float, now: float) -> None:
        """A limit a 429's message named (OpenAI's, Groq's: a minute's bucket, just found
        empty): a ceiling from now, paced from now with no 60-second guard, whatever window
        the headers show; slots booked ahead at the old pace are taken back."""
        self._ceiling = min(self._ceiling, per_minute)
        self.set_limit(min(self.per_minute, per_minute))
        self.stated = True
        self.presumed, self._guard = False, False
        self._tat = min(self._tat, now)
        self.drop_ahead(now)

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

    def ready_at(self, earliest: float, cost: float, *, backlog: float = 0.0) -> float:
        """The first time from ``earliest`` that ``cost`` fits the pace, the guard and the
        provider's window; ``backlog``: how many more requests wait to go besides this one
        (where more wait than the window has left, its last ones look for its turn)."""
        if cost > self.per_minute:
            raise RequestTooLarge(f"needs {cost:.0f}, more than the limit of {self.per_minute:.0f}")
        at = max(earliest, self._log.last_at)
        if at < self._cap_until:
            if cost > self._cap_left:
                at = self._cap_until
            elif self.burst:  # the provider says it is left: it may go now
                return max(at, self._look_at(self._cap_left - cost, backlog))
        if self.presumed:  # a bucket of ``allowance``, refilled at the limit's pace
            if self._probe is not None and self._beyond_minute(at, cost):
                return math.inf  # one request looks past a minute's worth; the rest wait
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
                    at = e.at + WINDOW_S + EPSILON_S
                used -= e.cost
        if not self._bucket:
            return at
        # The bucket holds ``cost`` once it is that far from full.
        need = min(cost, self._capacity) + self._refill * BUCKET_SKEW_S
        full_at = max(self._own_full_at, self._seen_full_at)
        return max(at, full_at - (self._capacity - need) / self._refill)

    def first_ahead(self, now: float) -> Booking | None:
        """The earliest slot booked after ``now`` (None: none)."""
        return self._log.first_ahead(now)

    def short_at(self, at: float, now: float, remaining: float, need: float) -> bool:
        """Whether a minute's bucket sampled at ``now`` with ``remaining`` left holds less
        than ``need`` at ``at``, as :meth:`ready_at` asks (its refill meanwhile; nothing else
        booked before then). Any other window: False."""
        if not self._bucket:
            return False
        level = min(self._capacity, remaining + (at - now) * self._refill)
        return level + 1e-6 < min(need, self._capacity) + self._refill * BUCKET_SKEW_S

    def _look_at(self, left: float, backlog: float) -> float:
        """When a request that leaves ``left`` of the window goes, if it is one of the last
        held back to look for the turn: a second's by its counts (aiq.count_phase), or one
        pinned from whole-second resets while more wait for it (aiq.reset_turn)."""
        if left < 1:
            look_at = self._counted.probe_at
            if look_at > -math.inf:
                return look_at
        if backlog > left:
            return self._reset_turn.look_at(left, self._peak)
        return -math.inf

    def _beyond_minute(self, at: float, cost: float) -> bool:
        """Whether a booking at ``at`` puts more than the limit into the last 60 s, where a
        presumed bucket is not yet known to allow it. A bucket would, with its refill; a
        calendar minute or a sliding one (LiteLLM's router, most gateways) would refuse all
        of it, and what a round trip's refill let go was that many 429s: one goes first."""
        return not self._past_minute and self._log.since(at - WINDOW_S) + cost > self.per_minute

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
        full = self._own_full_at <= at
        self._own_full_at = max(self._own_full_at, at) + drain
        self._seen_full_at = max(self._seen_full_at, at) + drain
        if at < self._cap_until:
            self._cap_left -= cost
        probe = self.presumed and self._probe is None and self._beyond_minute(at, cost)
        entry = self._log.add(at, cost)
        if full:
            self._drain_from = entry
        if probe:
            self._probe = entry
        return entry

    def went(self, entry: Booking) -> bool:
        """``entry``'s request goes: True if it is the first past a calendar minute's turn
        (to be let in once a 429 would be back: :meth:`let_in_turn`)."""
        turn_at = self._turn_at
        if entry.at < turn_at or self._looked_at >= turn_at or not (self._calendar and self.burst):
            return False
        self._looked_at, self._turn_look = turn_at, entry
        return True

    def let_in_turn(self, entry: Booking, now: float) -> bool:
        """``entry``, the first request past a calendar minute's turn, is out past the time
        a 429 takes (aiq.pause_test: a gateway refuses at its door): the minute has turned
        at the server too, and its count goes now, as the reply would say a latency later
        (a server whose clock is behind ours refuses it first). True if slots booked ahead
        may go now."""
        if entry is not self._turn_look:
            return False
        self._turn_look = None
        if not (self._calendar and self.burst) or self._cap_until > now:
            return False
        self._cap_left = self._peak - self._log.booked(entry.at, now)
        self._cap_until = self._fresh_at = self._cap_until + WINDOW_S  # the next turn
        return self._log.last_at > now

    def used(self, now: float) -> float:
        """What the log holds in the minute ending at ``now`` (bookings after it excluded)."""
        return self._log.used(now)

    def booked(self, start: float, end: float) -> float:
        """What the log holds booked from ``start`` to ``end`` (given back: none)."""
        return self._log.booked(start, end)

    def forget(self, entry: Booking) -> None:
        """Take a booking out of the window's count, and out of the bucket's drain (the
        provider did not count it); the pace is left as it is."""
        if entry is self._probe:
            self._probe = None
        if entry is self._turn_look:
            self._turn_look = None
        if entry is self._drain_from:
            self._drain_from = None  # (no drain began there)
        if entry.cost and self._log.holds(entry):
            self._own_full_at -= entry.cost / self._refill
        self._log.adjust(entry, 0.0)

    def reached(self, entry: Booking, now: float, quickest_s: float) -> None:
        """A reply at ``now`` to ``entry``'s request. The first since a booking found the model's
        bucket full says when the provider began to count what followed: no sooner than the
        quickest reply seen (``quickest_s``) before now. Until then its bucket stayed full, its
        refill lost, so the model's drain starts that much later. (A burst of 12,000 reached
        a busy server 1.3 s after it was booked: the model's bottom came 260 requests early,
        156 of them 429s, and the 429s were taken for another client's share.)"""
        start = self._drain_from
        if start is None or entry.at < start.at:
            return
        self._drain_from = None
        late_s = now - quickest_s - start.at
        if late_s > 0 and self._own_full_at > now:
            self._own_full_at += late_s

    def close(self, entry: Booking, now: float, *, through: bool = True) -> bool:
        """``entry``'s request was answered at ``now`` (or never will be): it has reached the
        provider (``through``: and got through, not refused). True if it was the look past a
        minute's worth: the senders held for it may go."""
        self._log.advance(now)
        self._log.close(entry)
        if entry is self._turn_look:
            self._turn_look = None  # (its reply's sample says what is left)
        if entry is not self._probe:
            return False
        self._probe, self._past_minute = None, through
        return True

    def settle(self, entry: Booking, cost: float) -> None:
        """The booking really cost ``cost``: correct the log, and the pace by the difference."""
        self._tat += (cost - entry.cost) * self._interval
        drain = (cost - entry.cost) / self._refill
        self._own_full_at += drain
        self._seen_full_at += drain
        self._log.adjust(entry, cost)

    def drop_ahead(self, now: float) -> None:
        """Take back every slot booked after ``now`` (their senders book again, told so by
        the rate limiter), and start the pace again from now, at the new limit."""
        log = self._log
        if self._drain_from is not None and self._drain_from.at > now:
            # Taken back, it began no drain: a reply past it would push the bottom a drain
            # late for each second it stood ahead (one slot lost at a presumed bucket's end).
            self._drain_from = None
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
        """A 429: pace from now to the end of the run (and guard the minute, unless the
        headers show a bucket, which allows more), unless it is the window's count met as its
        headers showed it. The pace starts from now: a burst moved it a minute ahead, and the
        bucket still holds what is left. A presumed bucket was wrong: pace evenly from now,
        with no guard (a server that shows no window is learned from its 429s:
        :mod:`aiq.refusal_limit`)."""
        if self.presumed:
            self.presumed, self._tat, self._guard = False, now, False
            self.burst_off = True
            return
        if self.burst and not self._bucket and now < self._cap_until and self._cap_left <= 1:
            # Refused where the headers said the window was spent, or all but one (LiteLLM's
            # router lets N-1 through and shows N): its own count met, no sign of a shorter
            # window. Its turn refills it whole (paced and guarded, the rest waited a minute).
            self._cap_left = min(self._cap_left, 0.0)  # (the one it showed is not there)
            return
        if self.burst and self._bucket:
            self._tat = min(self._tat, now)
        self.burst, self.burst_off = False, True
        # (As ``sync`` sets it.)
        self._guard = not (self._bucket or self._calendar or self.stated)

    def next_booked(self, now: float) -> float | None:
        """When the earliest booking after ``now`` goes (refunded ones are no request)."""
        return self._log.next_booked(now)
