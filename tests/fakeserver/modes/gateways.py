"""Generic API gateways put in front of a model server, counting requests per window and
reporting it in their own headers, not OpenAI's: Kong's per-period headers beside the IETF
draft's ``RateLimit-*``, and express-rate-limit's draft headers with a ``RateLimit-Policy``.
Each class's docstring names its source."""

from __future__ import annotations

import math

from .base import CalendarWindow, Cost, Mode, Refused

# Kong names a window's headers by these lengths, others by their seconds (``-10``).
_KONG_NAMES = {1: "Second", 60: "Minute", 3600: "Hour", 86400: "Day"}


class KongGateway(Mode):
    """Kong Gateway's rate-limiting-advanced plugin (Kong's AI Gateway limits LLM traffic with
    it): ``limit`` requests per window of ``window_s``, windows aligned to the epoch
    (``floor(now / window) * window``), ``window_type`` "fixed" or "sliding" (the plugin's
    default: the last window's count weighed by how much of it still overlaps, plus this
    one's). Refused requests count too (its ``disable_penalty`` is off by default).

    Headers: ``X-RateLimit-Limit-Minute`` / ``X-RateLimit-Remaining-Minute`` per window
    (named by its length: Second, Minute, Hour, Day, else its seconds), and the IETF draft's
    ``RateLimit-Limit``, ``RateLimit-Remaining`` and ``RateLimit-Reset``: whole seconds to
    the window's end, at least 1, computed on nginx's clock (whole seconds); sliding, grown
    by how far the count is over. A 429 has ``{"message": "API rate limit exceeded"}`` and
    ``Retry-After``: that reset.

    Source: Kong/kong ``plugins/rate-limiting-advanced/handler.lua`` (``NewRLHandler:access``:
    the header names, ``reset = max(1.0, window - (now - window_start))`` with ``now =
    ngx.time()``, ``RATELIMIT_RETRY_AFTER``), its ``human_window_size_lookup``, and
    ``kong/tools/public/rate-limiting`` ``sliding_window`` (previous count times the share
    of the window not yet elapsed, plus the current count). The headers are computed in the
    ``access`` phase, as the request arrives (the open-source ``rate-limiting`` plugin's
    ``handler.lua`` the same: ``access`` keeps them in ``kong.ctx.plugin.headers``, and
    ``header_filter`` sets them on the upstream's reply).
    """

    reports_at_arrival = True

    def __init__(self, *, rpm: int, window_s: int = 60, window_type: str = "fixed") -> None:
        self.window_s, self.sliding = window_s, window_type == "sliding"
        self.limit = max(1, round(rpm * window_s / 60))
        self._name = _KONG_NAMES.get(window_s, str(window_s))
        self._counts: dict[int, float] = {}  # window index -> requests counted in it

    def _rate(self, now: float) -> float:
        index = math.floor(now / self.window_s)
        rate = self._counts.get(index, 0.0)
        if self.sliding:
            elapsed = now - index * self.window_s
            rate += self._counts.get(index - 1, 0.0) * (self.window_s - elapsed) / self.window_s
        return rate

    def admit(self, now: float, cost: Cost) -> Refused | None:
        index = math.floor(now / self.window_s)
        self._counts[index] = self._counts.get(index, 0.0) + 1  # (refused ones count too)
        for old in [i for i in self._counts if i < index - 1]:
            del self._counts[old]
        if self._rate(now) > self.limit:
            return Refused(
                {"message": "API rate limit exceeded"},
                {**self.headers(now), "Retry-After": str(self._reset(now))},
            )
        return None

    def _reset(self, now: float) -> int:
        whole = math.floor(now)  # ngx.time()
        start = math.floor(whole / self.window_s) * self.window_s
        reset = max(1.0, self.window_s - (whole - start))
        if self.sliding:
            rate = self._rate(now)
            reset = math.ceil(reset + max(0.0, (rate - self.limit) / self.limit * self.window_s))
        return int(reset)

    def headers(self, now: float) -> dict[str, str]:
        remaining = str(max(0, math.floor(self.limit - self._rate(now))))
        return {
            f"X-RateLimit-Limit-{self._name}": str(self.limit),
            f"X-RateLimit-Remaining-{self._name}": remaining,
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": remaining,
            "RateLimit-Reset": str(self._reset(now)),
        }


class ExpressDraftHeaders(Mode):
    """A Node gateway limited by express-rate-limit (its default ``MemoryStore``): ``limit``
    requests per fixed window of ``window_s`` (the store resets every key at once, each
    ``windowMs`` from its start), refused requests counted, and the IETF draft's headers in
    the version ``standardHeaders`` names: ``draft-6`` ``RateLimit-Policy: 100;w=60``,
    ``RateLimit-Limit``, ``RateLimit-Remaining`` and ``RateLimit-Reset`` (whole seconds to
    the window's end, rounded up); ``draft-7`` the same policy and ``RateLimit: limit=100,
    remaining=40, reset=21``; ``draft-8`` ``RateLimit-Policy: "100-in-1min"; q=100; w=60;
    pk=:...:`` and ``RateLimit: "100-in-1min"; r=40; t=21``. A 429 has ``Retry-After``, the
    same seconds.

    Source: express-rate-limit ``source/headers.ts`` (``setDraft6Headers``,
    ``setDraft7Headers``, ``setDraft8Headers``, ``setRetryAfterHeader``, ``Math.ceil`` of the
    reset) and ``source/memory-store.ts`` (one interval resetting every key; its windows
    start when the store is made: here at ``start``). The middleware sets its headers as it
    counts the request (``source/rate-limit.ts``, before ``next()``), so they are the count
    as the request arrived.
    """

    reports_at_arrival = True

    def __init__(self, *, rpm: int, window_s: int = 60, draft: int = 6, start: float = 0.0) -> None:
        self.limit = max(1, round(rpm * window_s / 60))
        self.window_s, self.draft, self.start = window_s, draft, start
        self._window = CalendarWindow(window_s)

    def _used(self, now: float) -> float:
        return self._window.used(now - self.start)

    def admit(self, now: float, cost: Cost) -> Refused | None:
        self._window.add(now - self.start, 1)  # (refused ones count too)
        if self._used(now) > self.limit:
            retry = {"Retry-After": str(self._reset(now))}
            return Refused({"error": "Too many requests, please try again later."}, retry)
        return None

    def _reset(self, now: float) -> int:
        return math.ceil(self._window.reset_in(now - self.start))

    def headers(self, now: float) -> dict[str, str]:
        remaining = max(0, math.floor(self.limit - self._used(now)))
        reset = self._reset(now)
        if self.draft == 8:
            name = f'"{self.limit}-in-{self.window_s}sec"'
            return {
                "RateLimit-Policy": f"{name}; q={self.limit}; w={self.window_s}; pk=:ZmFrZQ==:",
                "RateLimit": f"{name}; r={remaining}; t={reset}",
            }
        if self.draft == 7:
            return {
                "RateLimit-Policy": f"{self.limit};w={self.window_s}",
                "RateLimit": f"limit={self.limit}, remaining={remaining}, reset={reset}",
            }
        return {
            "RateLimit-Policy": f"{self.limit};w={self.window_s}",
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(remaining),
            "RateLimit-Reset": str(reset),
        }
