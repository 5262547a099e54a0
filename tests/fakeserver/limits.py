"""The fake server's own rate limiter: OpenAI's requests and tokens per minute over sliding
windows (the ``rpm``, ``tpm`` and ``limit_window_s`` knobs), and the 429 it refuses with.

The modes of ``modes/`` count as a given provider does instead; this one is the server's default
and what its older tests rely on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from .modes import ORGANIZATION, openai_duration

_RATE_LIMIT_HELP = "Visit https://platform.openai.com/account/rate-limits to learn more."
_PER_MINUTE = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}


class _Window:
    """The requests admitted in the last ``span_s`` seconds, with their token total.

    Each request enters once and leaves once, so keeping the total costs O(1) per request.
    The window is half-open: a request admitted at ``t`` counts while ``now - span_s < t``.
    """

    __slots__ = ("events", "span_s", "tokens")

    def __init__(self, span_s: float, events: Iterable[tuple[float, int]] = ()) -> None:
        self.span_s = span_s
        self.events: deque[tuple[float, int]] = deque(events)  # (admitted at, tokens), oldest first
        self.tokens = sum(cost for _, cost in self.events)

    def expire(self, now: float) -> None:
        """Forget the requests that left the window by ``now``."""
        horizon = now - self.span_s
        events = self.events
        while events and events[0][0] <= horizon:
            self.tokens -= events.popleft()[1]

    def add(self, now: float, tokens: int) -> None:
        """Count one request of ``tokens`` admitted at ``now``."""
        self.events.append((now, tokens))
        self.tokens += tokens

    def used(self, kind: str) -> int:
        """Requests or tokens in the window."""
        return len(self.events) if kind == "requests" else self.tokens

    def fits(self, kind: str, *, limit: float, cost: int) -> bool:
        """Whether ``cost`` more requests or tokens (``kind``) fit under ``limit`` now."""
        return self.used(kind) + cost <= limit

    def wait_to_fit(self, now: float, kind: str, *, limit: float, cost: int) -> float | None:
        """Seconds from ``now`` until ``cost`` more requests or tokens (``kind``) fit under
        ``limit``, or None if they never can."""
        if cost > limit:
            return None
        used, wait = self.used(kind), 0.0
        for admitted, tokens in self.events:  # oldest first, the order in which they leave
            if used + cost <= limit:
                break
            used -= 1 if kind == "requests" else tokens
            wait = admitted + self.span_s - now
        return wait

    def reset_in(self, now: float) -> float:
        """Seconds until the window is empty again: OpenAI's "resets to its initial state"."""
        return self.events[-1][0] + self.span_s - now if self.events else 0.0


class _RateLimiter:
    """OpenAI's two limits, requests and tokens per minute, over sliding windows.

    The headers always speak per minute, like OpenAI's, so a minute window is kept; when the
    limit is enforced over a shorter window (per second, say) a second window does that.
    Only the server's loop touches it, so it needs no lock.
    """

    def __init__(self) -> None:
        self.minute = _Window(60.0)
        self.enforced = self.minute

    def judge(
        self, now: float, *, rpm: int | None, tpm: int | None, window_s: float, tokens: int
    ) -> tuple[str, float | None] | None:
        """Admit and count a request of ``tokens`` arriving at ``now``, returning None; or, when
        it does not fit, leave the windows as they were and return the limit it broke
        (``"requests"`` or ``"tokens"``) and the seconds until it fits (None: it never will)."""
        enforced = self._windows(now, window_s)
        scale = enforced.span_s / 60.0
        limits = [
            (kind, limit * scale, cost)
            for kind, limit, cost in (("requests", rpm, 1), ("tokens", tpm, tokens))
            if limit is not None
        ]
        if all(enforced.fits(kind, limit=limit, cost=cost) for kind, limit, cost in limits):
            self.minute.add(now, tokens)
            if enforced is not self.minute:
                enforced.add(now, tokens)
            return None
        waits = {
            kind: enforced.wait_to_fit(now, kind, limit=limit, cost=cost)
            for kind, limit, cost in limits
        }
        # Blame the limit that can never be met, else the one that takes longer to free up.
        blame = {kind: math.inf if wait is None else wait for kind, wait in waits.items()}
        kind = max(blame, key=blame.__getitem__)
        return kind, waits[kind]

    def windows(
        self, now: float, *, rpm: int | None, tpm: int | None
    ) -> list[tuple[str, int, int, float]]:
        """(kind, limit, remaining, seconds to reset) of the limits that are set, over the last
        minute. ``reset`` is the time until the window is empty, so ``remaining`` is back at
        the limit."""
        minute = self.minute
        minute.expire(now)
        reset = minute.reset_in(now)
        return [
            (kind, limit, max(0, limit - minute.used(kind)), reset)
            for kind, limit in (("requests", rpm), ("tokens", tpm))
            if limit is not None
        ]

    def headers(self, now: float, *, rpm: int | None, tpm: int | None) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for the limits that are set (see ``windows``)."""
        headers = {}
        for kind, limit, remaining, reset in self.windows(now, rpm=rpm, tpm=tpm):
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(remaining)
            headers[f"x-ratelimit-reset-{kind}"] = openai_duration(reset)
        return headers

    def _windows(self, now: float, window_s: float) -> _Window:
        """Bring both windows up to ``now``; return the enforced one."""
        self.minute.expire(now)
        if window_s == 60.0:
            self.enforced = self.minute
        elif self.enforced.span_s != window_s:
            # A new span starts from the last minute's requests, so none is forgotten.
            recent = [e for e in self.minute.events if e[0] > now - window_s]
            self.enforced = _Window(window_s, recent)
        self.enforced.expire(now)
        return self.enforced


def retry_after(seconds: float) -> dict[str, str]:
    """Both of OpenAI's forms, rounded up so that a client waiting exactly that long fits."""
    ms = max(1, math.ceil(seconds * 1000))
    return {"retry-after": str(math.ceil(ms / 1000)), "retry-after-ms": str(ms)}


def openai_429(
    kind: str, *, limit: int | None, used: int, model: str, requested: int, wait_s: float | None
) -> tuple[dict, dict[str, str]]:
    """OpenAI's 429 body and headers for the ``kind`` of limit broken and the wait it needs."""
    where = f"for {model} in organization {ORGANIZATION} on {_PER_MINUTE[kind]}: Limit {limit}"
    if wait_s is None:  # it alone is over the limit: no wait helps, and OpenAI names none
        retry: dict[str, str] = {}
        message = (
            f"Request too large {where}, Requested {requested}. The input or output tokens "
            f"must be reduced in order to run successfully. {_RATE_LIMIT_HELP}"
        )
    else:
        retry = retry_after(wait_s)
        message = (
            f"Rate limit reached {where}, Used {used}, Requested "
            f"{requested}. Please try again in "
            f"{openai_duration(int(retry['retry-after-ms']) / 1000)}. {_RATE_LIMIT_HELP}"
        )
    error = {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}
    return {"error": error}, retry
