"""What a :class:`~aiq.limiter.RateLimiter`'s limits say now, read without booking: the
limits in force, whether and how much may go at once, the pace they allow, and how long a
request would wait (for ``--concurrency auto``'s size and for saying why a run waits).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .budget import Budget, RequestTooLarge
from .refusal_limit import RefusalLimit
from .split_tokens import SplitTokens
from .tokens import LearnedRatio


@dataclass(slots=True)
class Limits:
    """The limits the run paces to now (None: not limited, or not known yet)."""

    rpm: float | None
    tpm: float | None
    itpm: float | None = None  # input and output tokens apart (Anthropic)
    otpm: float | None = None


class LimitReadings:
    """:class:`~aiq.limiter.RateLimiter`'s readings (its state is set and documented in
    ``RateLimiter.__init__``)."""

    _headroom: float
    _clock: Callable[[], float]
    _requests: Budget | None
    _tokens: Budget | None
    _split: SplitTokens | None
    _refusal: RefusalLimit
    _avg_cost: LearnedRatio
    _paused_until: float

    if TYPE_CHECKING:

        def _budgets(self) -> list[Budget]: ...
        def _ready_at(self, at: float, cost: float) -> float: ...

    @property
    def bursting(self) -> bool:
        """Whether the provider's headers say some of its window may go at once."""
        if self._refusal.limit is not None and self._refusal.paced is None:
            return True  # a fixed window's count at its start
        return any(
            b is not None and (b.burst or b.presumed) for b in (self._requests, self._tokens)
        )

    def burst_size(self) -> float:
        """How many requests the provider's window lets go at once now (0: paced)."""
        requests = self._requests
        if requests is not None and (requests.burst or requests.presumed):
            return requests.burst_size
        refusal = self._refusal
        if refusal.limit is not None and refusal.paced is None:
            return refusal.limit
        tokens = self._tokens
        if tokens is not None and (tokens.burst or tokens.presumed) and self._avg_cost.samples:
            return tokens.burst_size / max(1.0, self._avg_cost.ratio)
        return 0.0

    @property
    def limits(self) -> Limits:
        rpm = self._requests.per_minute if self._requests else self._refusal.per_minute
        split = self._split
        return Limits(
            rpm,
            self._tokens.per_minute if self._tokens else None,
            split.input.per_minute if split and split.input else None,
            split.output.per_minute if split and split.output else None,
        )

    def requests_per_s(self) -> float | None:
        """The pace the limits allow, in requests per second (None if unlimited)."""
        rates = []
        if (learned := self._refusal.per_minute) is not None:
            rates.append(learned * self._headroom / 60.0)
        if self._requests is not None:
            rates.append(self._requests.per_minute * self._headroom / 60.0)
        if self._tokens is not None and self._avg_cost.samples:
            rates.append(self._tokens.per_minute * self._headroom / 60.0 / self._avg_cost.ratio)
        if self._split is not None and (split_rate := self._split.requests_per_s()):
            rates.append(split_rate)
        return min(rates) if rates else None

    def wait_s(self) -> float:
        """Seconds until the next request booked for later goes, or with none booked, until
        one more could go (0: now). For saying why a run waits; it books nothing."""
        now = self._clock()
        booked = [at for budget in self._budgets() if (at := budget.next_booked(now)) is not None]
        if booked:
            return min(booked) - now
        try:
            return max(0.0, self._ready_at(max(now, self._paused_until), 1.0) - now)
        except RequestTooLarge:  # a tokens-per-minute limit under one token: never
            return math.inf

    def paused_s(self) -> float:
        """Seconds left of the pause a 429 asked for (0: none)."""
        return max(0.0, self._paused_until - self._clock())
