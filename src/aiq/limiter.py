"""Requests-per-minute and tokens-per-minute budgets: paced smoothly, exact over any minute.

Each budget does two things for every request:

- **Pacing** (GCRA): a virtual clock ``tat`` (the next free slot) moves forward by
  ``cost * 60 / (limit * headroom)`` per booking, so requests are spread evenly rather than a
  minute's quota fired at once. Providers may enforce a per-minute limit per second (60,000/min
  as 1,000/s); an even pace a little under the limit passes both, a burst does not. (Exactly so
  from 3,000/min up, where the headroom is worth a request a second; under that, a one-second
  window may see one request more, which the provider answers with a short 429.)
- **A guard** over the last 60 s: a log of what was booked when, and no booking that would put
  more than the limit into any 60-second window. Pacing alone lets a large token request
  through at the end of a full window; the guard does not.

The provider's own headers keep both honest (:meth:`Budget.sync`): a limit it reports below
the configured one wins (slots booked at the old pace are booked again), and each reply's
``remaining`` and ``reset`` are a sample of the provider's window, replacing the last one: a
short window caps what goes before its reset, a minute's bucket (OpenAI's) lets what it holds
go at once, and usage beyond ours (another client on the same key) holds back only until the
window has refilled. Bursts stop for the run at the first 429 (:meth:`RateLimiter.rate_limited`).
Token estimates are settled against each reply's usage, and the prompt estimate learns the
ratio. Time comes from the injected clock, so tests drive it without sleeping.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from .ratelimit_headers import RateLimitInfo, Window

WINDOW_S = 60.0
# Pace at this share of a limit: requests leave the event loop a few ms late now and then, so
# an exact pace would sometimes put one request too many into a provider's one-second window.
HEADROOM = 0.98
# Differences this small between the provider's count and ours are noise (timing), not usage
# we did not see; the headroom covers them.
_SYNC_SLACK = 0.01
# A booking leaves the window a hair after it is 60 s old, so float rounding never keeps it in.
_EPSILON_S = 1e-6
# A sender waiting for its slot looks this often whether it was taken back.
_REBOOK_CHECK_S = 1.0
# A provider's reset shorter than this describes a short window (per-second or 10-second
# enforcement): what it says is left is all that may go before the reset.
SHORT_WINDOW_S = 10.0


class RequestTooLarge(Exception):
    """One request needs more tokens than the whole tokens-per-minute limit: it never fits."""


class _Entry:
    """One booking in a budget's log; ``cost`` changes when the booking is settled."""

    __slots__ = ("at", "cost")

    def __init__(self, at: float, cost: float) -> None:
        self.at = at
        self.cost = cost


class Budget:
    """One per-minute limit: its pace, its log of the last minute's bookings, and the
    provider's window as its headers last showed it."""

    def __init__(
        self, per_minute: float, *, headroom: float = HEADROOM, configured: bool = True
    ) -> None:
        if per_minute <= 0:
            raise ValueError("per_minute must be positive")
        self._headroom = headroom
        # A configured limit is a ceiling: the provider may report a lower one, which wins.
        self._ceiling = per_minute if configured else math.inf
        self.per_minute = per_minute
        self._interval = 60.0 / (per_minute * headroom)
        self._tat = -math.inf
        self._log: deque[_Entry] = deque()
        self._sum = 0.0  # of the costs in the log
        self._last_at = -math.inf  # bookings are made in time order: the guard relies on it
        self._horizon = -math.inf  # bookings at or before this have left the log
        self._guard = True  # the 60-second guard; off once the headers show a minute's bucket
        # The provider's window as a bucket (see ``sync``): None until headers describe it.
        self._capacity: float | None = None
        self._refill = per_minute * headroom / WINDOW_S  # per second, at our headroom
        self._own_full_at = -math.inf  # when the bucket is full again after our bookings
        self._seen_full_at = -math.inf  # ...and after what the last sample showed
        # Usage the provider counts beyond ours, in a window of ``_span_s``, until it refills.
        self._outside = 0.0
        self._outside_until = -math.inf
        self._span_s = WINDOW_S
        # A short window's cap: at most ``_cap_left`` more bookings before ``_cap_until``.
        self._cap_left = math.inf
        self._cap_until = -math.inf
        self._bucket = False  # the headers show a minute's bucket, refilled continuously
        self.burst = False  # ...and what it holds may go at once
        self.burst_off = False  # a 429 came after a burst: pace for the rest of the run

    def set_limit(self, per_minute: float) -> None:
        """A new limit (one the provider reported); the pace changes from the next booking."""
        self.per_minute = per_minute
        self._interval = 60.0 / (per_minute * self._headroom)

    def pace_s(self, cost: float) -> float:
        """How far one booking of ``cost`` moves the pace."""
        return cost * self._interval

    def ready_at(self, earliest: float, cost: float) -> float:
        """The first time from ``earliest`` that ``cost`` fits the pace, the guard and the
        provider's window."""
        if cost > self.per_minute:
            raise RequestTooLarge(f"needs {cost:.0f}, more than the limit of {self.per_minute:.0f}")
        # In a burst the pace lets a minute's worth through at once (GCRA's tolerance); the
        # bucket below holds it to what the provider said is left.
        tolerance = (self.per_minute - 1.0) * self._interval if self.burst else 0.0
        at = max(earliest, self._tat - tolerance, self._last_at)
        if self._guard:
            # The oldest bookings leave the window first; wait for enough of them.
            used = self._sum
            for e in self._log:
                if e.at > at - WINDOW_S:
                    if used + cost <= self.per_minute:
                        break
                    at = e.at + WINDOW_S + _EPSILON_S
                used -= e.cost
        if self._capacity is None:
            return at
        if at < self._cap_until and cost > self._cap_left:
            at = self._cap_until
        if at < self._outside_until:
            at = min(self._outside_until, self._fit_beside_outside(at, cost))
        if not self._bucket:
            return at
        # The bucket holds ``cost`` once it is that far from full.
        need = min(cost, self._capacity)
        full_at = max(self._own_full_at, self._seen_full_at)
        return max(at, full_at - (self._capacity - need) / self._refill)

    def _fit_beside_outside(self, at: float, cost: float) -> float:
        """The first time from ``at`` that ``cost`` fits the provider's window beside the
        usage it counts that is not ours (inf: not before that usage leaves)."""
        assert self._capacity is not None
        room, span = self._capacity - self._outside, self._span_s
        if cost > room:
            return math.inf
        used = self._sum  # every booking is at or before ``at`` (they are made in order)
        for e in self._log:
            if e.at > at - span:
                if used + cost <= room:
                    break
                at = e.at + span + _EPSILON_S
            used -= e.cost
        return at

    def book(self, at: float, cost: float) -> _Entry:
        """Book ``cost`` at ``at`` (from :meth:`ready_at`, or later)."""
        self._tat = max(self._tat, at) + cost * self._interval
        drain = cost / self._refill
        self._own_full_at = max(self._own_full_at, at) + drain
        self._seen_full_at = max(self._seen_full_at, at) + drain
        if at < self._cap_until:
            self._cap_left -= cost
        self._append(_Entry(at, cost))
        return self._log[-1]

    def _append(self, entry: _Entry) -> None:
        self._last_at = entry.at
        self._log.append(entry)
        self._sum += entry.cost
        log, horizon = self._log, entry.at - WINDOW_S
        while log[0].at <= horizon:  # no later booking can fall in a window holding these
            self._sum -= log.popleft().cost
        self._horizon = horizon

    def used(self, now: float) -> float:
        """What the log holds in the minute ending at ``now`` (bookings after it excluded)."""
        return self._used_within(now, WINDOW_S)

    def _used_within(self, now: float, span_s: float) -> float:
        """What the log holds in (now - span_s, now]."""
        used = self._sum - self._ahead(now, math.inf)
        for e in self._log:
            if e.at > now - span_s:
                break
            used -= e.cost
        return max(0.0, used)

    def _ahead(self, now: float, until: float) -> float:
        """What is booked after ``now`` and before ``until``: not sent yet, so no provider's
        count holds it."""
        ahead = 0.0
        for e in reversed(self._log):
            if e.at <= now:
                break
            if e.at < until:
                ahead += e.cost
        return ahead

    def forget(self, entry: _Entry) -> None:
        """Take a booking out of the window's count; the pace is left as it is."""
        if entry.at > self._horizon:
            self._sum -= entry.cost
        entry.cost = 0.0

    def settle(self, entry: _Entry, cost: float) -> None:
        """The booking really cost ``cost``: correct the log, and the pace by the difference."""
        self._tat += (cost - entry.cost) * self._interval
        drain = (cost - entry.cost) / self._refill
        self._own_full_at += drain
        self._seen_full_at += drain
        if entry.at > self._horizon:  # still in the log
            self._sum += cost - entry.cost
        entry.cost = cost

    def sync(self, now: float, reported: Window) -> bool:
        """Follow what the provider says about this budget in its headers after a reply;
        True if slots booked ahead are to be booked again: the limit is lower (they are too
        close), or a burst begins (they may go now).

        The sample is the provider's window, never a count to add to ours: ``remaining``
        is what may still go now, ``reset`` when the window is full again. A window that
        refills at ``limit`` per minute and is ``reset`` from full holds
        ``capacity = remaining + reset * limit / 60``: a minute's worth for OpenAI's bucket
        (``remaining`` = limit at the start, ``reset`` = time to full), 20 for 1,200/min
        enforced as a one-second bucket. The sample replaces what the last one said: what
        the provider counts beyond our bookings (another client, say) is gone from the
        model once the window refills, at the sample's ``reset``, never later.

        - **A minute's bucket** (``capacity`` is the limit, as OpenAI's: full at the start,
          ``reset`` = time to full): what it holds may go at once (:attr:`burst`), then the
          pace, the bucket refilling at it; the 60-second guard stands aside, as the bucket
          allows more than a minute's worth in the first minute. A 429 ends bursts for the
          run (per-second enforcement behind minute headers); the bucket, refilling at the
          pace, still says what is left.
        - **A short window** (``reset`` under ``SHORT_WINDOW_S`` and ``capacity`` below the
          limit: per-second or 10-second enforcement, fixed or refilled): no more than
          ``remaining`` goes before ``reset``, then the pace. It holds at most ``reset``.
        - **Otherwise** (a sliding minute, no ``reset``): the pace and the guard, and what the
          provider counts in its window of ``capacity / limit`` minutes beyond our bookings
          there is held as one quantity, replaced by every sample, until ``reset``.
        """
        rebook = False
        if reported.limit:
            limit = min(self._ceiling, reported.limit)
            if limit != self.per_minute:
                rebook = limit < self.per_minute
                self.set_limit(limit)
                if rebook:
                    self._drop_ahead(now)
        if reported.remaining is None:
            return rebook
        remaining = float(reported.remaining)
        window_limit = float(reported.limit or self.per_minute)  # the provider's own limit
        per_s = window_limit / WINDOW_S
        reset = reported.reset_s
        self._refill = per_s * self._headroom
        if reset is None:  # no reset said (LiteLLM): a minute's window, as the limit is
            capacity = window_limit
        else:
            capacity = max(1.0, remaining, min(window_limit, remaining + reset * per_s))
        self._capacity = capacity
        self._outside, self._outside_until = 0.0, -math.inf
        self._cap_left, self._cap_until = math.inf, -math.inf
        self._seen_full_at = -math.inf
        minute_bucket = reset is not None and abs(remaining + reset * per_s - window_limit) <= max(
            2.0, 0.05 * window_limit
        )
        self._bucket = minute_bucket
        if minute_bucket and not self.burst_off and not self.burst:
            self.burst = rebook = True  # slots booked ahead at the pace may go now
            self._drop_ahead(now)
        elif not minute_bucket:
            self.burst = False
        if reset is not None and reset < SHORT_WINDOW_S and capacity < window_limit:
            self._cap_left = remaining - self._ahead(now, now + reset)
            self._cap_until = now + reset
        elif minute_bucket:
            if self.burst:  # the bucket allows more than a minute's worth in a minute
                self._guard = False
            # The bucket is ``remaining`` from full now, and our bookings not sent yet come
            # on top (the provider cannot have counted them).
            owed = capacity - remaining + self._ahead(now, math.inf)
            self._seen_full_at = now + owed / self._refill
        else:
            # What it counts in its window beyond what we booked there is someone else's,
            # until the window refills (its reset: the window is full again by then).
            self._span_s = min(WINDOW_S, capacity / per_s)
            outside = capacity - remaining - self._used_within(now, self._span_s)
            if outside > _SYNC_SLACK * capacity:
                self._outside = outside
                self._outside_until = now + (WINDOW_S if reset is None else reset)
        return rebook

    def _drop_ahead(self, now: float) -> None:
        """Take back every slot booked after ``now`` (their senders book again, told so by
        :class:`RateLimiter`), and start the pace again from now, at the new limit."""
        log = self._log
        while log and log[-1].at > now:
            entry = log.pop()
            self._sum -= entry.cost
            drain = entry.cost / self._refill
            self._own_full_at -= drain
            self._seen_full_at -= drain
            entry.cost = 0.0
        self._last_at = log[-1].at if log else -math.inf
        self._tat = min(self._tat, now + self._interval)

    def stop_bursting(self) -> None:
        """A 429: whatever the headers say, pace from now to the end of the run."""
        self.burst, self.burst_off = False, True


@dataclass(slots=True)
class Ticket:
    """What one request booked; hand it back to :meth:`RateLimiter.settle` or ``refund``."""

    prompt_estimate: int
    reserved: int
    limiter: RateLimiter  # the one that booked it
    request: _Entry | None = None
    tokens: _Entry | None = None
    cost: float = 0.0


@dataclass(slots=True)
class _Learned:
    """The ratio of real prompt tokens to estimated ones, averaged over recent replies."""

    ratio: float = 1.0
    samples: int = 0

    def update(self, estimated: int, actual: int) -> None:
        if estimated <= 0 or actual <= 0:
            return
        self.samples += 1
        weight = max(0.05, 1.0 / self.samples)  # a plain mean first, then a moving average
        self.ratio += weight * (actual / estimated - self.ratio)


@dataclass(slots=True)
class Limits:
    """The limits the run paces to now (None: not limited, or not known yet)."""

    rpm: float | None
    tpm: float | None


class RateLimiter:
    """Paces calls under optional requests/min and tokens/min limits, configured or learned."""

    def __init__(
        self,
        *,
        rpm: float | None = None,
        tpm: float | None = None,
        headroom: float = HEADROOM,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._headroom = headroom
        self._requests = Budget(rpm, headroom=headroom) if rpm else None
        self._tokens = Budget(tpm, headroom=headroom) if tpm else None
        self._clock = clock
        self._sleep = sleep
        self._paused_until = -math.inf
        self._prompt = _Learned()
        self._avg_cost = _Learned()  # tokens per request, for concurrency sizing
        self._deferred_until = -math.inf  # the next slot ``defer`` hands out
        # Moves when a lower limit is learned: slots booked before it, at the old pace, are
        # booked again (with --concurrency auto every sender may hold one when the first
        # reply says the limit is lower than the one configured).
        self._generation = 0
        self.learned: bool = False  # whether any limit came from the provider's headers

    @property
    def counts_tokens(self) -> bool:
        """Whether requests need a token estimate (a tokens-per-minute limit is known)."""
        return self._tokens is not None

    @property
    def bursting(self) -> bool:
        """Whether the provider's headers show a minute's bucket whose content may go at once."""
        return any(b is not None and b.burst for b in (self._requests, self._tokens))

    @property
    def limits(self) -> Limits:
        return Limits(
            self._requests.per_minute if self._requests else None,
            self._tokens.per_minute if self._tokens else None,
        )

    def requests_per_s(self) -> float | None:
        """The pace the limits allow, in requests per second (None if unlimited)."""
        rates = []
        if self._requests is not None:
            rates.append(self._requests.per_minute * self._headroom / 60.0)
        if self._tokens is not None and self._avg_cost.samples:
            rates.append(self._tokens.per_minute * self._headroom / 60.0 / self._avg_cost.ratio)
        return min(rates) if rates else None

    def pause(self, seconds: float) -> None:
        """Hold every caller for ``seconds`` (a 429 tells the whole client to back off)."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)

    def ticket_now(self) -> Ticket | None:
        """A ticket without waiting when nothing paces requests (no limit known, no pause),
        else None: then ``acquire``. No coroutine for the common case without limits."""
        if self._requests is None and self._tokens is None and self._paused_until <= self._clock():
            return Ticket(0, 0, self)
        return None

    async def acquire(self, prompt_tokens: int = 0, reserved: int = 0) -> Ticket:
        """Wait until one request fits every budget; returns its ticket.

        Raises RequestTooLarge when its token cost exceeds the whole tokens-per-minute limit.
        """
        ticket = Ticket(prompt_tokens, reserved, self)
        if self._requests is None and self._tokens is None and self._paused_until <= self._clock():
            return ticket  # nothing to pace (yet): the common case without limits
        while True:
            now = self._clock()
            at = self._book(ticket, now)
            generation = self._generation
            # In steps, so a slot taken back (a lower limit, a burst) is booked again soon.
            left = at - now
            while left > 0 and self._generation == generation:
                step = min(left, _REBOOK_CHECK_S)
                await self._sleep(step)
                left -= step
            if self._paused_until <= at and self._generation == generation:
                return ticket
            # A pause began while this request waited for its slot, or a lower limit was
            # learned: give the slot back and book again, so the pause is kept and its end is
            # paced too, or the slot is paced to the new limit.
            self.refund(ticket)

    def defer(self, prompt_tokens: int = 0, reserved: int = 0, *, after_s: float) -> float | None:
        """None if a request acquired now would wait ``after_s`` or less; else how many
        seconds from now it should come back, booking nothing.

        For a sender that can send another model's job meanwhile. The slots handed out are
        spaced at this limiter's pace, so deferred requests come back about as fast as it can
        take them rather than all at once. Raises RequestTooLarge as ``acquire`` does.
        """
        now = self._clock()
        cost = prompt_tokens * self._prompt.ratio + reserved
        at = self._ready_at(max(now, self._paused_until), cost)
        if at - now <= after_s:
            return None
        at = max(at, self._deferred_until)
        pace = self._requests.pace_s(1) if self._requests is not None else 0.0
        if self._tokens is not None and cost:
            pace = max(pace, self._tokens.pace_s(cost))
        self._deferred_until = at + pace
        return at - now

    def _ready_at(self, at: float, cost: float) -> float:
        """The first time from ``at`` that one request of ``cost`` tokens fits every budget."""
        requests, tokens = self._requests, self._tokens
        if requests is not None:
            at = requests.ready_at(at, 1)
        if tokens is not None and cost:
            at = tokens.ready_at(at, cost)
            if requests is not None:  # the token guard moved it: the request pace still holds
                at = requests.ready_at(at, 1)
        return at

    def _book(self, ticket: Ticket, now: float) -> float:
        cost = ticket.prompt_estimate * self._prompt.ratio + ticket.reserved
        at = self._ready_at(max(now, self._paused_until), cost)
        if self._requests is not None:
            ticket.request = self._requests.book(at, 1)
        if self._tokens is not None and cost:
            ticket.tokens = self._tokens.book(at, cost)
        ticket.cost = cost
        return at

    def refund(self, ticket: Ticket) -> None:
        """The request was not sent, or the provider did not count it (its 429): it leaves
        the minute's log. The pace keeps its slot: handing slots back let requests refunded
        together be booked again at one instant, a burst a per-second limit answers with
        429s (bench/README.md, "Rate limits")."""
        if ticket.request is not None and self._requests is not None:
            self._requests.forget(ticket.request)
        if ticket.tokens is not None and self._tokens is not None:
            self._tokens.forget(ticket.tokens)
        ticket.request = ticket.tokens = None

    def settle(self, ticket: Ticket, prompt_tokens: int) -> None:
        """The reply's usage says the prompt was ``prompt_tokens``: correct the booking."""
        if prompt_tokens > 0 and self._tokens is not None:
            self._prompt.update(ticket.prompt_estimate, prompt_tokens)
            actual = prompt_tokens + ticket.reserved
            self._avg_cost.update(1, actual)
            if ticket.tokens is not None and self._tokens is not None:
                self._tokens.settle(ticket.tokens, actual)

    def observe(self, info: RateLimitInfo | None, ticket: Ticket | None = None) -> None:
        """Follow the provider's rate-limit headers from the reply (or error) to ``ticket``
        (:meth:`Budget.sync`)."""
        if info is None:
            return
        now = self._clock()
        for kind, window in (("requests", info.requests), ("tokens", info.tokens)):
            budget = self._requests if kind == "requests" else self._tokens
            if budget is None:
                if not window.limit:
                    continue
                # A limit nobody configured: learn it from the provider.
                budget = Budget(window.limit, headroom=self._headroom, configured=False)
                if kind == "requests":
                    self._requests = budget
                else:
                    self._tokens = budget
                self.learned = True
            if budget.sync(now, window):
                self._generation += 1

    def rate_limited(self) -> None:
        """The provider answered 429: no more bursts in this run, only the pace."""
        for budget in (self._requests, self._tokens):
            if budget is not None:
                budget.stop_bursting()

    def wait_s(self) -> float:
        """Seconds until the next request booked for later goes, or with none booked, until
        one more could go (0: now). For saying why a run waits; it books nothing."""
        now = self._clock()
        booked = [
            e.at
            for budget in (self._requests, self._tokens)
            if budget is not None
            for e in _future(budget._log, now)
        ]
        if booked:
            return min(booked) - now
        try:
            return max(0.0, self._ready_at(max(now, self._paused_until), 1.0) - now)
        except RequestTooLarge:  # a tokens-per-minute limit under one token: never
            return math.inf

    def paused_s(self) -> float:
        """Seconds left of the pause a 429 asked for (0: none)."""
        return max(0.0, self._paused_until - self._clock())


def _future(log: deque[_Entry], now: float) -> list[_Entry]:
    """The earliest booking after ``now`` in a log (kept in time order), if any; refunded
    ones (cost 0) are no request waiting."""
    first = None
    for e in reversed(log):
        if e.at <= now:
            break
        if e.cost > 0:
            first = e
    return [] if first is None else [first]


class Limiters:
    """One RateLimiter per model: providers limit each model on its own, and report each
    model's limits in its own replies' headers. A model named in ``per_model`` gets those
    limits; any other gets ``rpm`` / ``tpm``; unlimited ones may learn theirs from headers."""

    def __init__(
        self,
        *,
        rpm: float | None = None,
        tpm: float | None = None,
        per_model: Mapping[str, tuple[float | None, float | None]] | None = None,
        make: Callable[[float | None, float | None], RateLimiter] | None = None,
    ) -> None:
        self._default = (rpm, tpm)
        self._per_model = dict(per_model or {})
        self._make = make or (lambda r, t: RateLimiter(rpm=r, tpm=t))
        self._by_model: dict[str | None, RateLimiter] = {}
        # Whether more than one limiter is in use: then a sender need not wait for one.
        self.several = False

    @classmethod
    def shared(cls, limiter: RateLimiter) -> Limiters:
        """Every model under one limiter (tests, and callers that pass their own)."""
        limiters = cls()
        limiters._make = lambda r, t: limiter
        return limiters

    def for_model(self, model: str | None) -> RateLimiter:
        limiter = self._by_model.get(model)
        if limiter is None:
            rpm, tpm = self._per_model.get(model or "", self._default)
            limiter = self._by_model[model] = self._make(rpm, tpm)
            self.several = len({id(lim) for lim in self._by_model.values()}) > 1
        return limiter

    def requests_per_s(self) -> float | None:
        """The pace all models' limits allow together (None while none is known)."""
        rates = [r for lim in set(self._by_model.values()) if (r := lim.requests_per_s())]
        if rates:
            return sum(rates)
        # Before any reply: what the configured request limits say.
        configured = [r for r, _ in (self._default, *self._per_model.values()) if r]
        return max(configured) * HEADROOM / 60.0 if configured else None

    @property
    def bursting(self) -> bool:
        """Whether some model's limiter may send a bucket's content at once."""
        return any(lim.bursting for lim in self._by_model.values())

    @property
    def unpaced(self) -> bool:
        """Whether some model in use has no known request rate: it can keep any number of
        senders busy, whatever the others' limits allow."""
        return any(lim.requests_per_s() is None for lim in self._by_model.values())

    def in_use(self) -> dict[str | None, RateLimiter]:
        """The limiter of each model sent to so far."""
        return dict(self._by_model)

    def configured(self, model: str | None) -> tuple[float | None, float | None]:
        """The (rpm, tpm) the settings give ``model``, before anything the provider says."""
        return self._per_model.get(model or "", self._default)

    @property
    def any_limit(self) -> bool:
        """Whether any limit is known, configured or learned."""
        if any(r or t for r, t in (self._default, *self._per_model.values())):
            return True
        return any(lim.limits.rpm or lim.limits.tpm for lim in self._by_model.values())
