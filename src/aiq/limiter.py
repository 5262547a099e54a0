"""Requests-per-minute and tokens-per-minute budgets, paced smoothly (GCRA).

Each budget is a virtual clock ``tat`` (theoretical arrival time): a request of cost c may go
once ``tat - tolerance <= now`` and pushes ``tat`` forward by ``c * 60 / limit``. That spreads
calls evenly instead of firing a minute's quota at once and then stalling, and needs no
background refill task. Time comes from the injected clock, so tests drive it directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class Budget:
    """One per-minute limit; ``reserve`` returns how long the caller must wait."""

    def __init__(self, per_minute: float, *, burst_s: float = 1.0) -> None:
        if per_minute <= 0:
            raise ValueError("per_minute must be positive")
        self.per_minute = per_minute
        self._interval = 60.0 / per_minute
        # How far ahead of its even pace a caller may run: about burst_s of quota at once.
        self._tolerance = max(0.0, burst_s - self._interval)
        self._tat = 0.0

    def reserve(self, now: float, cost: float = 1.0) -> float:
        """Book ``cost`` units; returns seconds to wait before using them (0 if none)."""
        tat = max(self._tat, now)
        self._tat = tat + cost * self._interval
        return max(0.0, tat - self._tolerance - now)


class RateLimiter:
    """Paces calls under optional requests/min and tokens/min limits."""

    def __init__(
        self,
        *,
        rpm: float | None = None,
        tpm: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._requests = Budget(rpm) if rpm else None
        self._tokens = Budget(tpm) if tpm else None
        self._clock = clock
        self._sleep = sleep
        self._paused_until = 0.0

    def pause(self, seconds: float) -> None:
        """Hold every caller for ``seconds`` (a 429 tells the whole client to back off)."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)

    async def acquire(self, tokens: int = 0) -> None:
        """Wait until one request of ``tokens`` estimated tokens fits both budgets."""
        now = self._clock()
        wait = max(0.0, self._paused_until - now)
        if self._requests is not None:
            wait = max(wait, self._requests.reserve(now))
        if self._tokens is not None and tokens:
            wait = max(wait, self._tokens.reserve(now, tokens))
        if wait > 0:
            await self._sleep(wait)
