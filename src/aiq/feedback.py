"""How a :class:`~aiq.limiter.RateLimiter` follows what the provider says back: the
rate-limit headers of each reply (:meth:`Feedback.observe`, each limit's window followed by
its :class:`~aiq.budget.Budget`, a limit nobody configured learned from them) and its 429s
(:meth:`Feedback.rate_limited`: bursts end for the run; where no header shows a window, the
429s teach one, :mod:`aiq.refusal_limit`). The limiter's own half (booking and waiting) is
in :mod:`aiq.limiter`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .booking_log import Booking
from .budget import CALENDAR_MARGIN_S, TURN_MARGIN_S, WINDOW_S, Budget
from .full_test import FullTest
from .implied_limit import ImpliedLimit
from .left_cap import LeftCap
from .ratelimit_headers import RateLimitInfo, StatedLimit, Window
from .refusal_limit import RefusalLimit
from .slot_waits import SlotWaits
from .split_tokens import SplitTokens
from .window_turn import early_in_minute

# Told a limit, this share of it sent in a window before a 429 is the limit met.
_MET = 0.8


class Ticket(Protocol):
    """What feedback reads of a request's :class:`~aiq.limiter.Ticket`: its bookings."""

    request: Booking | None
    tokens: Booking | None
    split: tuple[Booking | None, Booking | None]
    sent_at: float
    full_probe: bool


class Feedback(FullTest):
    """:class:`~aiq.limiter.RateLimiter`'s reading of replies and 429s (its state is set and
    documented in ``RateLimiter.__init__``)."""

    learned: bool
    _headroom: float
    _clock: Callable[[], float]
    _wall: Callable[[], float]
    _requests: Budget | None
    _tokens: Budget | None
    _split: SplitTokens | None
    _refusal: RefusalLimit
    _implied: dict[str, ImpliedLimit]
    _left: LeftCap
    _slots: SlotWaits
    _first_at: float | None
    _quickest_s: float

    if TYPE_CHECKING:

        def _budgets(self) -> list[Budget]: ...
        def _headers_rule(self) -> bool: ...

    def observe(
        self, info: RateLimitInfo | None, ticket: Ticket | None = None, *, refused: bool = False
    ) -> None:
        """Follow the provider's rate-limit headers from the reply (or error) to ``ticket``
        (:meth:`Budget.sync`); ``refused``: its 429's (the provider did not count it)."""
        if info is None:
            return
        now = self._clock()
        if ticket is not None:
            self._reached(ticket, now)  # (before its sample is read against the model)
        minute_left_s = WINDOW_S - self._wall() % WINDOW_S
        rebook = False
        for kind, window in (("requests", info.requests), ("tokens", info.tokens)):
            budget = self._requests if kind == "requests" else self._tokens
            if not window.limit and (budget is None or kind in self._implied):
                window = self._implied_window(kind, window)
            if budget is None:
                if not window.limit:
                    if kind == "requests" and window.remaining is not None and ticket:
                        self._left_sample(window, ticket.sent_at, now)
                    continue
                if kind == "tokens" and info.split_tokens:
                    # Anthropic's ``tokens-*`` is the tighter of its input and output limits:
                    # those are followed apart, each counted its own way.
                    continue
                budget = self._learn(kind, window.limit)
            entry = None
            if ticket is not None:
                entry = ticket.request if kind == "requests" else ticket.tokens
            sent_at = ticket.sent_at if ticket is not None else None
            synced = budget.sync(
                now, window, entry, minute_left_s=minute_left_s, refused=refused, sent_at=sent_at
            )
            rebook = synced or rebook
        if info.split_tokens:
            if self._split is None:
                started_at = self._first_at if self._first_at is not None else now
                self._split = SplitTokens(headroom=self._headroom, started_at=started_at)
                self.learned = True
            entries = ticket.split if ticket is not None else (None, None)
            split = self._split.sync(now, info, entries, minute_left_s=minute_left_s)
            rebook = split or rebook
        if rebook:
            self._rebook_all(now)

    def _reached(self, ticket: Ticket, now: float) -> None:
        """A reply to ``ticket``: each budget's drain starts when the provider began to
        count (:meth:`Budget.reached`)."""
        for budget, entry in ((self._requests, ticket.request), (self._tokens, ticket.tokens)):
            if budget is not None and entry is not None:
                budget.reached(entry, now, self._quickest_s)

    def _learn(self, kind: str, limit: float) -> Budget:
        """A limit nobody configured, learned from the provider: its budget from now on."""
        outside = kind == "requests"
        budget = Budget(limit, headroom=self._headroom, configured=False, outside=outside)
        budget.implied = kind in self._implied  # (a limit no header named)
        if kind == "requests":
            self._requests = budget
        else:
            self._tokens = budget
        self.learned = True
        return budget

    def _left_sample(self, window: Window, sent_at: float, now: float) -> None:
        """What a window with no limit yet has left, from the reply to a request sent at
        ``sent_at``: a cap until a limit is known (aiq.left_cap)."""
        assert window.remaining is not None
        if self._left.sample(window.remaining, sent_at, now):
            self._slots.wake_all()

    def _implied_window(self, kind: str, window: Window) -> Window:
        """A window with no limit (Azure's), given the limit its samples imply, if they do."""
        if window.remaining is None:
            return window
        reset_s = window.reset_s
        requests = self._implied.get("requests")
        if reset_s is None and window.count and kind == "tokens" and requests is not None:
            # Together's tokens per second name no reset: its requests' window, the same
            # second, says how long.
            reset_s = requests.span_s
        implied = self._implied.setdefault(kind, ImpliedLimit())
        limit = implied.sample(window.remaining, reset_s, window.count)
        return window if limit is None else Window(limit, window.remaining, window.reset_s)

    def _refused_window(self, now: float, retry_after_s: float, ticket: Ticket | None) -> None:
        """A 429 with an exact delay, the request window's turn (:meth:`Budget.anchor`).
        Where that window showed only what is left (Azure's docs name no other header), it
        is spent until then: a sample with a reset (which, with no limit given, implies
        it: aiq.implied_limit)."""
        requests = self._requests
        if requests is not None:
            requests.anchor(now + retry_after_s)
        if "requests" not in self._implied and (requests is None or not requests.resetless):
            return
        if (implied := self._implied.get("requests")) is not None:
            implied.turned(now + retry_after_s)
        spent = RateLimitInfo(Window(None, 0, retry_after_s), Window(None, None, None))
        self.observe(spent, ticket, refused=True)
        if requests is None and self._requests is not None:  # (the window read from now on)
            self._requests.anchor(now + retry_after_s)

    def _stop_bursting(self, now: float) -> None:
        """A 429: no more bursts (:meth:`Budget.stop_bursting`); senders held for a presumed
        bucket's look past a minute's worth book again."""
        presumed = False
        for budget in self._budgets():
            presumed = presumed or budget.presumed
            budget.stop_bursting(now)
        if presumed:
            self._slots.wake_all()

    def _rebook_all(self, now: float) -> None:
        # Every sender books again, in every budget: a slot still held in one would keep the
        # senders behind it there.
        for budget in self._budgets():
            budget.drop_ahead(now)
        if self._split is not None:
            self._split.taken_back(now)
        self._slots.wake_all()

    def _follow_stated(self, stated: StatedLimit, now: float) -> None:
        """A per-minute limit a 429 names: a ceiling from now, whatever window the headers
        show (Groq's show requests per day, and enforce a per-minute limit unreported: paced
        by its 429s' retry-after alone, one in 20 requests was refused)."""
        if stated.kind == "tokens" and self._split is not None:
            return  # (Anthropic's input and output tokens apart: no such message)
        budget = self._requests if stated.kind == "requests" else self._tokens
        if budget is None:
            budget = Budget(
                stated.per_minute, headroom=self._headroom, outside=stated.kind == "requests"
            )
            if stated.kind == "requests":
                self._requests = budget
            else:
                self._tokens = budget
            self.learned = True
        elif stated.per_minute >= budget.per_minute:
            return  # (followed already, or not the limit that held the request back)
        budget.follow_stated(stated.per_minute, now)
        self._slots.wake_all()  # senders booked at the old pace book again

    def rate_limited(
        self,
        retry_after_s: float | None = None,
        *,
        upper_bound: bool = False,
        ticket: Ticket | None = None,
        stated: StatedLimit | None = None,
    ) -> float | None:
        """The provider answered 429, asking to wait ``retry_after_s`` (None: no hint);
        returns how long to wait as far as its window goes (None: no hint to go by).

        No more bursts in this run, only the pace. A limit the 429's message names
        (``stated``) under the one in force is followed from now, as if configured. A server
        that reports no limit has just shown one: what got through in its window
        (:mod:`aiq.refusal_limit`), the window turning when the hint says, or with none, at
        the clock's next minute. A hint that is only an upper bound (LiteLLM's router asks
        for 60 s, but counts calendar minutes) is cut to that minute's turn; refused just
        after the turn, by a server whose clock is behind ours, to the turn's margin.
        """
        now = self._clock()
        if ticket is not None and ticket is self._let_in:
            self._let_in_refused()
        if retry_after_s is not None and not upper_bound:
            self._refused_window(now, retry_after_s, ticket)
        if stated is not None:
            self._follow_stated(stated, now)
        # The clock's minute turns after the one the refused request was sent in: a reply
        # that comes back after a turn is the last minute's refusal, not the new one's.
        sent_s = min(max(0.0, now - ticket.sent_at), WINDOW_S) if ticket is not None else 0.0
        since_turn_s = (self._wall() - sent_s) % WINDOW_S  # when it was sent
        to_turn_s = max(0.0, WINDOW_S - since_turn_s - sent_s)
        if self._headers_rule():
            assert self._requests is not None
            if self._requests.calendar and early_in_minute(since_turn_s):
                # The old minute's count, by the server's clock: bursts go on from its turn.
                return max(0.0, CALENDAR_MARGIN_S - since_turn_s - sent_s)
            self._stop_bursting(now)
            if self._requests.slides and retry_after_s is not None:
                # A sliding window's hint is when it surely has room (Kong's: its fixed turn,
                # grown by the overshoot: a minute); its refill has a slot far sooner.
                return min(retry_after_s, self._requests.pace_s(1.0))
            if upper_bound and retry_after_s is not None:
                # (LiteLLM's router shows its minute's count in headers too, and asks 60 s.)
                return min(retry_after_s, to_turn_s + TURN_MARGIN_S)
            return retry_after_s
        self._stop_bursting(now)
        return self._refused_unshown(now, retry_after_s, upper_bound, ticket, to_turn_s)

    def _refused_unshown(
        self,
        now: float,
        retry_after_s: float | None,
        upper_bound: bool,
        ticket: Ticket | None,
        to_turn_s: float,
    ) -> float | None:
        """A 429 where no header shows the request limit's window: it shows a limit
        (:mod:`aiq.refusal_limit`), the window turning when the hint says, or at the clock's
        next minute (``to_turn_s`` from now); returns the wait, as ``rate_limited``."""
        exact = retry_after_s is not None and not upper_bound
        # A turn guessed at the clock's minute is looked at by one request first
        # (aiq.refusal_limit), so it needs less margin than senders let go into a window.
        minute_s = to_turn_s + TURN_MARGIN_S
        ends_in = minute_s if retry_after_s is None or upper_bound else retry_after_s
        refusal = self._refusal
        sent_at = ticket.sent_at if ticket is not None else None
        # A configured request limit whose window no header shows: met, or not its window.
        # What was sent in it counts, answered or still out, refused ones given back: by
        # now, not by the refused one's slot (senders go a little after their slots, so
        # one booked later may have gone, and been counted, first).
        met = None
        if (requests := self._requests) is not None:
            start = refusal.window_start(now + ends_in)
            met = requests.booked(start, now) >= _MET * requests.per_minute
        bound = upper_bound and retry_after_s is not None
        refusal.refused(now, now + ends_in, exact=exact, bound=bound, sent_at=sent_at, met=met)
        if refusal.full:
            return None  # the refused job's own backoff (see server_full)
        self._test_pause(ticket, exact=exact, now=now)
        if refusal.limit is not None:
            self._slots.wake_all()  # senders let go, or held for a probe, book again
        return refusal.wait_s(now, retry_after_s, upper_bound=upper_bound, minute_s=minute_s)
