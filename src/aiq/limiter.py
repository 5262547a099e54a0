"""Requests-per-minute and tokens-per-minute limits for one model, configured or learned.

A :class:`RateLimiter` holds a :class:`~aiq.budget.Budget` per limit (how each paces, guards
and follows the provider's window is there) and hands out a slot that fits both: requests
wait for it in :meth:`RateLimiter.acquire`. It follows each reply's rate-limit headers
(:meth:`RateLimiter.observe`, in :mod:`aiq.feedback`): a limit the provider reports below
the configured one wins (slots booked at the old pace are booked again), and what its window
says is left may go at once, until the first 429 (:meth:`RateLimiter.rate_limited`), after
which the run paces. A 429's pause holds every caller. Token estimates are settled against
each reply's usage, and the prompt estimate learns the ratio. Time comes from the injected
clocks, so tests drive it without sleeping.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .booking_log import Booking
from .budget import HEADROOM, WINDOW_S, Budget, RequestTooLarge
from .feedback import Feedback
from .implied_limit import ImpliedLimit
from .left_cap import LeftCap
from .limit_readings import LimitReadings
from .refusal_limit import PROBE_WAIT_S, RefusalLimit
from .slot_waits import SlotWaits
from .split_tokens import NO_SPLIT, SplitCost, SplitTokens
from .tokens import LearnedRatio

__all__ = ["HEADROOM", "WINDOW_S", "Budget", "RateLimiter", "RequestTooLarge", "Ticket"]

# A slot booked before a pause began goes if the pause ends within this much after it: the
# two are found from different clocks' readings (a calendar minute's turn, and the 429's
# pause to it), and a slot a hair before the pause's end went to the back of the queue, its
# turn's first request a pace late (about one run in three at LiteLLM's minute).
PAUSE_SLACK_S = 0.005


@dataclass(slots=True)
class Ticket:
    """What one request booked; hand it back to :meth:`RateLimiter.settle` or ``refund``."""

    prompt_estimate: int
    reserved: int
    limiter: RateLimiter  # the one that booked it
    request: Booking | None = None
    tokens: Booking | None = None
    cost: float = 0.0
    # Input and output tokens apart (Anthropic's limits): the entries booked.
    split: tuple[Booking | None, Booking | None] = (None, None)
    sent_at: float = 0.0  # when it may go (the limiter's clock)
    window: Booking | None = None  # its place in a limit learned from 429s
    full_probe: bool = False  # let through a 429's pause, to see if the server is only full
    turn_look: bool = False  # the first past a calendar minute's turn, still out


class RateLimiter(Feedback, LimitReadings):
    """Paces calls under optional requests/min and tokens/min limits, configured or learned."""

    def __init__(
        self,
        *,
        rpm: float | None = None,
        tpm: float | None = None,
        headroom: float = HEADROOM,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._headroom = headroom
        self._wall = wall  # for calendar minutes (a window reported with no reset)
        self._requests = Budget(rpm, headroom=headroom, outside=True) if rpm else None
        self._tokens = Budget(tpm, headroom=headroom) if tpm else None
        self._clock = clock
        self._quickest_s = math.inf  # the quickest reply yet, from its request's slot
        self._paused_until = -math.inf
        self._prompt = LearnedRatio()
        self._avg_cost = LearnedRatio()  # tokens per request, for concurrency sizing
        self._deferred_until = -math.inf  # the next slot ``defer`` hands out
        # Slots booked at an old pace are taken back when a lower limit is learned (with
        # --concurrency auto every sender may hold one when the first reply says the limit
        # is lower than the one configured), or when the window says they may go now.
        self._slots = SlotWaits(sleep)
        # A server that reports no limit: what its 429s teach.
        self._refusal = RefusalLimit(headroom=headroom)
        # Windows that show what is left but no limit (Azure's): the limit their samples imply.
        self._implied: dict[str, ImpliedLimit] = {}
        # ...and before anything implies one, what such a window has left caps requests.
        self._left = LeftCap()
        self.learned: bool = False  # whether any limit came from the provider's headers
        # Input and output token limits apart, once a reply's headers show them (Anthropic).
        self._split: SplitTokens | None = None
        self._first_at: float | None = None  # the run's first request: a ramp starts there
        # A 429's pause with no limit known: when it began (None: no test of it armed), and
        # whether one request may go through it, sent once one sent before it got through.
        self._full_from: float | None = None
        self._full_pass = False
        self._let_in: Ticket | None = None  # a test taken as let in before its reply came
        # How many more requests wait to go besides the one asking (the run's queue, set by
        # the worker): where more wait than a window has left, its last ones look for its
        # turn (aiq.reset_turn). None: none known to wait.
        self.backlog: Callable[[], float] | None = None

    @property
    def counts_tokens(self) -> bool:
        """Whether requests need a token estimate (a tokens-per-minute limit is known)."""
        return self._tokens is not None or self._split is not None

    def pause(self, seconds: float) -> None:
        """Hold every caller for ``seconds`` (a 429 tells the whole client to back off)."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)

    def ticket_now(self) -> Ticket | None:
        """A ticket without waiting when nothing paces requests (no limit known, no pause),
        else None: then ``acquire``. No coroutine for the common case without limits."""
        now = self._clock()
        if self._first_at is None:
            self._first_at = now
        if self._refusal.pending is not None:
            self._confirm(now)
        if self._unpaced() and self._paused_until <= now and self._left_open():
            return self._went(Ticket(0, 0, self, sent_at=now))
        return None

    async def acquire(self, prompt_tokens: int = 0, reserved: int = 0) -> Ticket:
        """Wait until one request fits every budget; returns its ticket.

        Raises RequestTooLarge when its token cost exceeds the whole tokens-per-minute limit.
        """
        ticket = Ticket(prompt_tokens, reserved, self)
        now = self._clock()
        if self._first_at is None:
            self._first_at = now
        if self._refusal.pending is not None:
            self._confirm(now)
        if self._unpaced() and self._paused_until <= now and self._left_open():
            ticket.sent_at = now
            return self._went(ticket)  # nothing to pace (yet): the common case without limits
        while True:
            now = self._clock()
            if self._full_pass and self._unpaced():
                self._full_pass, ticket.sent_at, ticket.full_probe = False, now, True
                return self._went(ticket)  # through the pause: does the server take it?
            at = self._book(ticket, now)
            generation = self._slots.generation
            if at == math.inf:  # a probe is out (a limit learned from 429s): nothing booked
                await self._slots.wait(PROBE_WAIT_S, generation)
                continue
            if at > now:
                await self._slots.wait(at - now, generation)
            if self._refusal.pending is not None:  # (a pause's end: the row has stood)
                self._confirm(self._clock())
            if self._paused_until <= at + PAUSE_SLACK_S and self._slots.generation == generation:
                ticket.sent_at = at
                return self._went(ticket)
            # A pause began while this request waited for its slot, or a lower limit was
            # learned: give the slot back and book again, so the pause is kept and its end is
            # paced too, or the slot is paced to the new limit.
            self.refund(ticket)

    def _left_open(self) -> bool:
        """Whether what a window showed left (aiq.left_cap) lets one more go now."""
        return self._left.open or not self._left_capped()

    def _left_capped(self) -> bool:
        """Whether what a window showed left caps requests: no request limit is known."""
        return self._left.active and self._requests is None

    def _went(self, ticket: Ticket) -> Ticket:
        """``ticket`` goes (counted against what was left, where that caps requests)."""
        if self._left_capped():
            self._left.sent(ticket.sent_at, ticket)
        if ticket.request is not None and self._requests is not None:
            ticket.turn_look = self._requests.went(ticket.request)
        if self._split is not None:
            self._split.went(ticket.split[1])
        if ticket.window is None and not self._headers_rule():
            ticket.window = self._refusal.went(ticket.sent_at)  # (429s may yet teach a limit)
        return ticket

    def _confirm(self, now: float) -> None:
        """A row of 429s put off may show a limit by now (:meth:`RefusalLimit.confirm`)."""
        if now >= self._paused_until and self._refusal.confirm(now):
            self._slots.wake_all()

    @property
    def paces(self) -> bool:
        """Whether any limit is known (given, reported or learned from 429s)."""
        return not self._unpaced()

    @property
    def blind(self) -> bool:
        """Whether nothing at all is known of the provider's limits: none is known, and no
        window's ``remaining`` caps requests (aiq.left_cap)."""
        return self._unpaced() and not self._left_capped()

    def _unpaced(self) -> bool:
        return (
            self._requests is None
            and self._tokens is None
            and self._split is None
            and not self._refusal.books
        )

    def _budgets(self) -> list[Budget]:
        """Every budget known: requests, tokens, and input and output tokens apart."""
        budgets = [b for b in (self._requests, self._tokens) if b is not None]
        if self._split is not None:
            budgets.extend(self._split.budgets())
        return budgets

    def defer(self, prompt_tokens: int = 0, reserved: int = 0, *, after_s: float) -> float | None:
        """None if a request acquired now would wait ``after_s`` or less; else how many
        seconds from now it should come back, booking nothing.

        For a sender that can send another model's job meanwhile. The slots handed out are
        spaced at this limiter's pace, so deferred requests come back about as fast as it can
        take them rather than all at once. Raises RequestTooLarge as ``acquire`` does.
        """
        now = self._clock()
        cost = prompt_tokens * self._prompt.ratio + reserved
        split = self._split.costs(prompt_tokens, reserved) if self._split else NO_SPLIT
        at = self._ready_at(max(now, self._paused_until), cost, split)
        if at - now <= after_s:
            return None
        if at == math.inf:
            return PROBE_WAIT_S  # a probe is out: ask again after a while
        at = max(at, self._deferred_until)
        pace = self._requests.pace_s(1) if self._requests is not None else 0.0
        if self._tokens is not None and cost:
            pace = max(pace, self._tokens.pace_s(cost))
        if self._split is not None:
            pace = max(pace, self._split.pace_s(split))
        self._deferred_until = at + pace
        return at - now

    def _ready_at(
        self, at: float, cost: float, split: SplitCost = NO_SPLIT, owner: Ticket | None = None
    ) -> float:
        """The first time from ``at`` that one request of ``cost`` tokens (``split``: input
        and output tokens apart) fits every budget."""
        requests, tokens = self._paced_requests(), self._tokens
        backlog = self.backlog() if self.backlog is not None and requests is not None else 0.0
        if self._left_capped():
            at = self._left.ready_at(at, owner)
        if self._refusal.books:
            at = self._refusal.ready_at(at)
        if requests is not None:
            at = requests.ready_at(at, 1, backlog=backlog)
        if tokens is not None and cost:
            at = tokens.ready_at(at, cost)
            if requests is not None:  # the token guard moved it: the request pace still holds
                at = requests.ready_at(at, 1, backlog=backlog)
        if self._split is not None and (later := self._split.ready_at(at, split)) > at:
            at = later  # and the others' paces still hold there
            if requests is not None:
                at = requests.ready_at(at, 1, backlog=backlog)
            if tokens is not None and cost:
                at = tokens.ready_at(at, cost)
        return at

    def _book(self, ticket: Ticket, now: float) -> float:
        cost = ticket.prompt_estimate * self._prompt.ratio + ticket.reserved
        split = NO_SPLIT
        if self._split is not None:
            split = self._split.costs(ticket.prompt_estimate, ticket.reserved)
        at = self._ready_at(max(now, self._paused_until), cost, split, ticket)
        if at == math.inf:
            return at
        if self._refusal.books:
            ticket.window = self._refusal.book(at, now)
        if (requests := self._paced_requests()) is not None:
            ticket.request = requests.book(at, 1)
        if self._tokens is not None and cost:
            ticket.tokens = self._tokens.book(at, cost)
        if self._split is not None:
            ticket.split = self._split.book(at, split)
        ticket.cost = cost
        return at

    def _paced_requests(self) -> Budget | None:
        """The request budget, unless a limit learned from 429s rules instead: a configured
        one whose window no header shows (the 429s showed it)."""
        requests = self._requests
        if requests is not None and not requests.shown and self._refusal.limit is not None:
            return None
        return requests

    def _headers_rule(self) -> bool:
        """Whether the provider's headers show the request limit's window (then its 429s
        teach nothing more than they say)."""
        return self._requests is not None and self._requests.shown

    def refund(self, ticket: Ticket) -> None:
        """The request was not sent, or the provider did not count it (its 429): it leaves
        the minute's log. The pace keeps its slot: handing slots back let requests refunded
        together be booked again at one instant, a burst a per-second limit answers with
        429s (bench/README.md, "Rate limits")."""
        if ticket.request is not None and self._requests is not None:
            self._requests.forget(ticket.request)
        if ticket.tokens is not None and self._tokens is not None:
            self._tokens.forget(ticket.tokens)
        if self._split is not None:
            self._split.forget(ticket.split)
        if ticket.window is not None:
            self._refusal.forget(ticket.window)
        ticket.request = ticket.tokens = ticket.window = None
        ticket.split = (None, None)
        ticket.turn_look = False
        self._left.release(ticket)

    def settle(
        self,
        ticket: Ticket,
        prompt_tokens: int,
        *,
        output_tokens: int = 0,
        counted_in: int | None = None,
    ) -> None:
        """The request got through, its prompt ``prompt_tokens`` long and its reply
        ``output_tokens`` (0: not said) by the reply's usage: correct the booking.
        ``counted_in`` is the part of the prompt an input-token limit counts (Anthropic's
        leaves out cache reads; None: all of it)."""
        now = self._clock()
        self._reached(ticket, now)
        self._quickest_s = min(self._quickest_s, now - ticket.sent_at)
        self.answered(ticket)
        if prompt_tokens > 0 and self._tokens is not None:
            self._prompt.update(ticket.prompt_estimate, prompt_tokens)
            actual = prompt_tokens + ticket.reserved
            self._avg_cost.update(1, actual)
            if ticket.tokens is not None and self._tokens is not None:
                self._tokens.settle(ticket.tokens, actual)
        if self._split is not None:
            if counted_in is None and prompt_tokens > 0:
                counted_in = prompt_tokens
            now = self._clock()
            if self._split.settle(
                ticket.split,
                ticket.prompt_estimate,
                counted_in=counted_in,
                output_tokens=output_tokens,
                now=now,
            ):
                self._rebook_all(now)

    def answered(self, ticket: Ticket, *, through: bool = True) -> None:
        """The request got an answer other than a 429 (``through``: from the server, which
        counted it), or none at all."""
        opened = looked = False
        now = self._clock()
        ticket.turn_look = False
        if ticket is self._let_in:
            self._let_in = None  # (its early pass stands)
        if not through:
            self._left.unanswered()
        if self._split is not None:
            # (No more held: a reply, its latency the time a request is out; or none.)
            self._split.ended(ticket.split[1], now if through else None)
        for budget, entry in ((self._requests, ticket.request), (self._tokens, ticket.tokens)):
            if budget is not None and entry is not None:
                looked = budget.close(entry, now, through=through) or looked  # it went
                if through and budget.presumed:  # a presumed bucket opens by what got through
                    opened = budget.grow(entry.cost) or opened
        if opened:
            self._rebook_all(now)
        elif looked:
            self._slots.wake_all()
        if self._headers_rule():
            if ticket.window is not None:  # (sent before the headers showed it)
                self._refusal.forget(ticket.window)
                ticket.window = None
            return  # a limit the provider reports: its 429s teach nothing more
        self._tested_by(ticket, through=through)
        if through:
            # What got through is what a 429 would teach.
            if self._refusal.got_through(ticket.sent_at, now, ticket.window):
                self._slots.wake_all()  # a probe: the window turned, the senders held may go
        elif ticket.window is not None:
            self._refusal.forget(ticket.window)  # a probe lost: another may go
            ticket.window = None

    def let_in_turn(self, ticket: Ticket) -> None:
        """``ticket``, the first request past a calendar minute's turn, is out past the time
        a 429 takes (aiq.pause_test): the minute's count goes now (:meth:`Budget.let_in_turn`)."""
        requests = self._requests
        if not ticket.turn_look or requests is None or ticket.request is None:
            return
        ticket.turn_look = False
        now = self._clock()
        if requests.let_in_turn(ticket.request, now):
            self._rebook_all(now)
