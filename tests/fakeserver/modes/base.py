"""What every rate-limit mode shares: a request's cost, a refusal, the interface the server calls,
the two ways providers count (a bucket, a calendar window) and how their headers write time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ORGANIZATION = "org-fake"
_HELP = "Visit https://platform.openai.com/account/rate-limits to learn more."


@dataclass(frozen=True)
class Cost:
    """What one request counts against the limits, as the provider estimates it on arrival:
    ``tokens`` is prompt plus ``max_tokens`` (OpenAI, Azure, Groq), ``input_tokens`` the prompt
    alone (Anthropic), ``cached_tokens`` the part of it the server's prompt cache holds
    already (read, not written, by this request) and ``max_tokens`` the output it asks for."""

    tokens: int = 0
    input_tokens: int = 0
    model: str = "gpt-4o-mini"
    cached_tokens: int = 0
    max_tokens: int = 0


@dataclass(frozen=True)
class Refused:
    """A 429: its JSON body and its headers."""

    payload: dict
    headers: dict[str, str]


class Mode:
    """The interface the server calls. ``slots``: requests served at once (the rest queue)."""

    slots: int | None = None
    # The headers are the count as the request arrived (a gateway's plugin sets them as it
    # lets the request through), not as its reply leaves.
    reports_at_arrival = False

    def admit(self, now: float, cost: Cost) -> Refused | None:
        """Count a request arriving at ``now`` and return None, or refuse it uncounted."""
        return None

    def settle(self, now: float, usage: dict[str, Any], cost: Cost | None = None) -> None:
        """Account a reply's ``usage`` once it is generated (for limits counted after), for
        the request admitted at ``cost``."""

    def headers(self, now: float) -> dict[str, str]:
        """The rate-limit headers of a reply sent at ``now``."""
        return {}

    def release(self, now: float) -> None:
        """A request this mode admitted has been answered (its reply or a fault)."""


# -- the two ways of counting ------------------------------------------------------------------


class Bucket:
    """``capacity`` units refilled continuously at ``per_s`` a second, full at start."""

    def __init__(self, capacity: float, per_s: float) -> None:
        self.capacity, self.per_s = capacity, per_s
        self._level, self._at = capacity, -math.inf

    def level(self, now: float) -> float:
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.per_s)
            self._at = now
        return self._level

    def wait_for(self, now: float, n: float) -> float | None:
        """Seconds until ``n`` fit (0: now); None if they never can."""
        if n > self.capacity:
            return None
        return max(0.0, (n - self.level(now)) / self.per_s)

    def spend(self, now: float, n: float) -> None:
        """Take ``n`` (may go below zero, as a bill settled after the call does; a negative
        ``n`` gives back, up to the capacity)."""
        self._level = min(self.capacity, self.level(now) - n)

    def full_in(self, now: float) -> float:
        return max(0.0, (self.capacity - self.level(now)) / self.per_s)


class CalendarWindow:
    """A count that restarts at every multiple of ``span_s`` on the clock (whole minutes for
    ``span_s=60``), whatever happened just before the boundary."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._index, self._used = -1, 0.0

    def used(self, now: float) -> float:
        index = math.floor(now / self.span_s)
        if index != self._index:
            self._index, self._used = index, 0.0
        return self._used

    def add(self, now: float, n: float) -> None:
        self._used = self.used(now) + n

    def reset_in(self, now: float) -> float:
        return (math.floor(now / self.span_s) + 1) * self.span_s - now


# -- how the headers write time ----------------------------------------------------------------


def openai_duration(seconds: float) -> str:
    """``seconds`` as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``120ms``, ``59.99s``,
    ``6m0s``, ``1h2m5.5s`` (Go's duration format, to the millisecond)."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    text = f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    return f"{hours}h{text}" if hours else text


def groq_duration(seconds: float) -> str:
    """Groq's resets: ``2m59.56s``, ``7.66s``, ``940ms`` (Go durations, to the centisecond)."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    hours, rest = divmod(round(seconds * 100), 360_000)
    minutes, rest = divmod(rest, 6000)
    text = f"{rest / 100:.2f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    return f"{hours}h{text}" if hours else text


def _x_ratelimit(rows: Sequence[tuple[str, float, float, str | None]]) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{kind}`` from (kind, limit, remaining, reset)."""
    headers = {}
    for kind, limit, remaining, reset in rows:
        headers[f"x-ratelimit-limit-{kind}"] = str(int(limit))
        headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(remaining)))
        if reset is not None:
            headers[f"x-ratelimit-reset-{kind}"] = reset
    return headers


def _openai_429(kind: str, limit: float, used: float, cost: Cost, wait_s: float | None) -> Refused:
    """OpenAI's 429 for a broken ``kind`` limit; None ``wait_s``: the request alone is over."""
    requested = 1 if kind == "requests" else cost.tokens
    unit = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
    where = f"for {cost.model} in organization {ORGANIZATION} on {unit}: Limit {int(limit)}"
    headers: dict[str, str] = {}
    if wait_s is None:
        message = f"Request too large {where}, Requested {requested}. {_HELP}"
    else:
        ms = max(1, math.ceil(wait_s * 1000))
        headers = {"retry-after": str(math.ceil(ms / 1000)), "retry-after-ms": str(ms)}
        message = (
            f"Rate limit reached {where}, Used {int(used)}, Requested {requested}. "
            f"Please try again in {openai_duration(ms / 1000)}. {_HELP}"
        )
    error = {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}
    return Refused({"error": error}, headers)


def _first_refusal(
    now: float, buckets: dict[str, Bucket], costs: dict[str, float]
) -> tuple[str, float | None] | None:
    """The limit a request breaks and its wait (the longest, or one it can never meet)."""
    waits = {kind: buckets[kind].wait_for(now, n) for kind, n in costs.items()}
    broken = {kind: math.inf if w is None else w for kind, w in waits.items() if w != 0}
    if not broken:
        return None
    kind = max(broken, key=broken.__getitem__)
    return kind, waits[kind]


# -- the modes ---------------------------------------------------------------------------------
