"""The modes modelled on one provider or gateway each: OpenAI's buckets (and per-second
enforcement), LiteLLM's router, Azure's windows, Groq's day and Anthropic's buckets. Each class's
docstring names its source (../shared/PROVIDERS.md)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from .. import anthropic
from .base import (
    Bucket,
    CalendarWindow,
    Cost,
    Mode,
    Refused,
    _first_refusal,
    _openai_429,
    _x_ratelimit,
    groq_duration,
    openai_duration,
)


class OpenAIBucket(Mode):
    """OpenAI: requests and tokens per minute, each a bucket refilled continuously and full at
    start (a minute's worth may go at once).

    Source: OpenAI's rate-limits guide (platform.openai.com/docs/guides/rate-limits, "rate
    limits in headers"): ``x-ratelimit-limit-*`` the limit, ``x-ratelimit-remaining-*`` what
    may still go, ``x-ratelimit-reset-*`` "the time until the rate limit resets to its initial
    state", written ``1s``, ``6m0s``; community captures show ``12ms``. The 429 body and its
    ``retry-after`` / ``retry-after-ms`` are those the API sends ("Rate limit reached for ... on
    requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms.").

    ``burst_s`` is how many seconds' worth the bucket holds: 60 is OpenAI's. A smaller one is a
    provider enforcing over a shorter period while it reports per minute (``PerSecond``).
    """

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None, burst_s: float = 60):
        self.limits = {k: v for k, v in (("requests", rpm), ("tokens", tpm)) if v is not None}
        self.buckets = {k: Bucket(v * burst_s / 60, v / 60) for k, v in self.limits.items()}

    def admit(self, now: float, cost: Cost) -> Refused | None:
        costs = {"requests": 1.0, "tokens": float(cost.tokens)}
        costs = {kind: costs[kind] for kind in self.buckets}
        if (broken := _first_refusal(now, self.buckets, costs)) is not None:
            kind, wait = broken
            used = self.buckets[kind].capacity - self.buckets[kind].level(now)
            return _openai_429(kind, self.limits[kind], used, cost, wait)
        for kind, n in costs.items():
            self.buckets[kind].spend(now, n)
        return None

    def headers(self, now: float) -> dict[str, str]:
        return _x_ratelimit(
            [
                (kind, self.limits[kind], b.level(now), openai_duration(b.full_in(now)))
                for kind, b in self.buckets.items()
            ]
        )


class PerSecond(OpenAIBucket):
    """A limit enforced per second and reported per second: 1,200 rpm as a bucket of 20
    refilled at 20/s. ``x-ratelimit-limit-requests`` says 1200, ``remaining`` is the bucket's
    level (0-20), ``reset`` the time until it is full (under a second).

    Source: OpenAI's rate-limits guide says a limit may be "quantized", enforced over shorter
    periods at high rates (PROVIDERS.md; the guide's exact wording is *unverified* here, the
    search tool found no copy of it); the reporting, a per-minute limit beside a short bucket's
    level and reset, is what issue 12 measured on a server enforcing so.
    """

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None) -> None:
        super().__init__(rpm=rpm, tpm=tpm, burst_s=1.0)


class TogetherPerSecond(OpenAIBucket):
    """Together AI: requests (and tokens) per second, as a bucket of a second's worth refilled
    continuously, reported unsuffixed: ``x-ratelimit-limit`` the requests a second,
    ``x-ratelimit-remaining`` the bucket's level, ``x-ratelimit-reset`` the seconds until it
    is full again; ``x-tokenlimit-limit`` / ``-remaining`` the same for tokens, no reset.

    Source: PROVIDERS.md ("``x-ratelimit-limit`` in requests per second (curator multiplies
    by 60)"); Together's support article "Rate limits" names the three request headers ("the
    time until the rate limit ... resets to its initial state"), and public clients read them
    as per second (one converts with ``limit * 60``). The reset's format is *unverified*:
    written here as bare seconds (``0.35``), as a client that reads it with ``parseInt``
    expects a number. A 429 asks ``retry-after`` in whole seconds; its error type is the
    ``dynamic_request_limited`` of Together's dynamic-limits docs.
    """

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None) -> None:
        super().__init__(rpm=rpm, tpm=tpm, burst_s=1.0)

    def admit(self, now: float, cost: Cost) -> Refused | None:
        refused = super().admit(now, cost)
        if refused is None:
            return None
        kind = "request" if "requests" in refused.payload["error"]["message"] else "token"
        wait_s = float(refused.headers.get("retry-after-ms", "1000")) / 1000
        error = {
            "message": f"You have exceeded your {kind} rate limit. Please slow down.",
            "type": f"dynamic_{kind}_limited",
            "code": None,
        }
        return Refused({"error": error}, {"retry-after": str(max(1, math.ceil(wait_s)))})

    def headers(self, now: float) -> dict[str, str]:
        headers = {}
        for kind, names in (("requests", ("ratelimit", True)), ("tokens", ("tokenlimit", False))):
            if kind not in self.buckets:
                continue
            bucket, (prefix, reset) = self.buckets[kind], names
            headers[f"x-{prefix}-limit"] = str(int(bucket.capacity))
            headers[f"x-{prefix}-remaining"] = str(max(0, math.floor(bucket.level(now))))
            if reset:
                headers[f"x-{prefix}-reset"] = f"{bucket.full_in(now):.3f}"
        return headers


class LiteLLMRouter(Mode):
    """LiteLLM proxy's router limits (``rpm:`` / ``tpm:`` on a deployment): counts per calendar
    minute (its cache key is the UTC ``%H-%M``), so they restart at :00 whatever came at :59;
    ``rpm: N`` lets N-1 through a minute. Tokens are counted from each reply's usage after the
    call, and a request is refused once the minute's tokens have reached the limit.

    Headers: ``x-ratelimit-{limit,remaining}-{requests,tokens}``, no reset. Its 429 says
    "Deployment over defined rpm limit=N. current usage=N" and asks for 60 s only as
    ``llm_provider-retry-after: 60``, with no standard retry header.

    Source: litellm/router_strategy/lowest_tpm_rpm_v2.py ``pre_call_check`` (the minute key,
    ``RateLimitError(..., headers={"retry-after": str(60)})``, relayed by the proxy with its
    ``llm_provider-`` prefix); litellm docs proxy/response_headers.md; the N-1 and the missing
    reset as measured against LiteLLM 1.108 (PROVIDERS.md). Newer LiteLLM (2026) weighs the
    previous minute too (``_build_sliding_window_keys``); this models the fixed minute.
    """

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None) -> None:
        self.rpm, self.tpm = rpm, tpm
        self.requests, self.tokens = CalendarWindow(60), CalendarWindow(60)

    def admit(self, now: float, cost: Cost) -> Refused | None:
        used = self.requests.used(now)
        if self.rpm is not None and used + 1 >= self.rpm:
            return self._refused("rpm", self.rpm, used + 1)
        if self.tpm is not None and self.tokens.used(now) >= self.tpm:
            return self._refused("tpm", self.tpm, self.tokens.used(now))
        self.requests.add(now, 1)
        return None

    def settle(self, now: float, usage: dict[str, Any], cost: Cost | None = None) -> None:
        total = usage.get("total_tokens")
        if total is None:  # an Anthropic usage, in case one comes this way
            total = usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
        self.tokens.add(now, total)

    def headers(self, now: float) -> dict[str, str]:
        rows = [
            (kind, limit, limit - window.used(now), None)
            for kind, limit, window in (
                ("requests", self.rpm, self.requests),
                ("tokens", self.tpm, self.tokens),
            )
            if limit is not None
        ]
        return _x_ratelimit(rows)

    @staticmethod
    def _refused(which: str, limit: int, usage: float) -> Refused:
        message = (
            f"litellm.RateLimitError: Deployment over defined {which} limit={limit}. "
            f"current usage={int(usage)}"
        )
        error = {"message": message, "type": None, "param": None, "code": "429"}
        return Refused({"error": error}, {"llm_provider-retry-after": "60"})


class AzureWindows(Mode):
    """Azure OpenAI: RPM and TPM "evaluated over a small period of time, typically 1 or 10
    seconds": a 600 rpm deployment refuses the 11th request in a 1-second period. Modelled as
    calendar-aligned windows of ``window_s`` allowing ``limit * window_s / 60`` each (limit/6
    per 10 s), tokens estimated on arrival as prompt plus ``max_tokens``.

    Headers: ``x-ratelimit-limit-*`` (per minute), ``x-ratelimit-remaining-*`` within the
    current window, ``x-ratelimit-reset-*`` the time to its boundary (*unverified*: Azure's
    docs name only the remaining headers). ``shows`` leaves some out: ``("remaining",)`` is
    what the docs name; ``("remaining", "reset")`` the issue's reading, a reset to the
    boundary and no limit. 429 with ``retry-after`` and ``retry-after-ms``.

    Source: learn.microsoft.com/azure/ai-services/openai/how-to/quota ("Understanding rate
    limits": "requests be evenly distributed over a one-minute period", the 600-RPM example),
    and Microsoft Q&A 1336515 (a Microsoft employee: "typically 1 or 10 seconds").
    """

    def __init__(
        self,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        window_s: float = 10,
        shows: tuple[str, ...] = ("limit", "remaining", "reset"),
    ):
        self.shows = shows
        self.limits = {k: v for k, v in (("requests", rpm), ("tokens", tpm)) if v is not None}
        self.windows = {k: CalendarWindow(window_s) for k in self.limits}
        self.per_window = {k: v * window_s / 60 for k, v in self.limits.items()}

    def admit(self, now: float, cost: Cost) -> Refused | None:
        costs = {"requests": 1, "tokens": cost.tokens}
        for kind, window in self.windows.items():
            if window.used(now) + costs[kind] > self.per_window[kind]:
                wait = window.reset_in(now)
                message = (
                    "Requests to the ChatCompletions_Create Operation under Azure OpenAI API "
                    "version 2024-10-21 have exceeded call rate limit of your current OpenAI S0 "
                    f"pricing tier. Please retry after {math.ceil(wait)} seconds."
                )
                headers = {
                    "retry-after": str(math.ceil(wait)),
                    "retry-after-ms": str(math.ceil(wait * 1000)),
                }
                return Refused({"error": {"code": "429", "message": message}}, headers)
        for kind, window in self.windows.items():
            window.add(now, costs[kind])
        return None

    def headers(self, now: float) -> dict[str, str]:
        headers = _x_ratelimit(
            [
                (
                    kind,
                    self.limits[kind],
                    self.per_window[kind] - window.used(now),
                    openai_duration(window.reset_in(now)),
                )
                for kind, window in self.windows.items()
            ]
        )
        return {k: v for k, v in headers.items() if k.split("-")[2] in self.shows}


class GroqDaily(Mode):
    """Groq: ``x-ratelimit-limit-requests`` is requests per *day* (RPD), tokens are per minute;
    both refill continuously, and resets read like ``2m59.56s`` (requests) or ``7.66s``
    (tokens). A per-minute request limit (``rpm``) may also be enforced without appearing in
    any header. A 429 carries ``retry-after`` in seconds.

    Source: console.groq.com/docs/rate-limits ("Rate limit headers": the requests headers are
    per day, the tokens headers per minute, with the example resets ``2m59.56s`` and
    ``7.66s``; ``retry-after`` only on a 429; its table: llama-3.1-8b-instant 30 RPM, 14.4K
    RPD, 6K TPM; "Rate limits apply at the organization level").
    """

    def __init__(self, *, rpd: int, tpm: int | None = None, rpm: int | None = None) -> None:
        self.rpd, self.tpm, self.rpm = rpd, tpm, rpm
        self.buckets = {"requests": Bucket(rpd, rpd / 86_400)}
        if tpm is not None:
            self.buckets["tokens"] = Bucket(tpm, tpm / 60)
        if rpm is not None:
            self.buckets["rpm"] = Bucket(rpm, rpm / 60)

    def admit(self, now: float, cost: Cost) -> Refused | None:
        costs = {"requests": 1.0, "rpm": 1.0, "tokens": float(cost.tokens)}
        costs = {kind: costs[kind] for kind in self.buckets}
        if (broken := _first_refusal(now, self.buckets, costs)) is not None:
            kind, wait = broken
            unit = {
                "requests": f"requests per day (RPD): Limit {self.rpd}",
                "rpm": f"requests per minute (RPM): Limit {self.rpm}",
                "tokens": f"tokens per minute (TPM): Limit {self.tpm}",
            }[kind]
            after = "" if wait is None else f" Please try again in {groq_duration(wait)}."
            message = (
                f"Rate limit reached for model `{cost.model}` in organization `org_fake` "
                f"service tier `on_demand` on {unit}.{after}"
            )
            error = {
                "message": message,
                "type": "tokens" if kind == "tokens" else "requests",
                "code": "rate_limit_exceeded",
            }
            headers = {} if wait is None else {"retry-after": str(max(1, math.ceil(wait)))}
            return Refused({"error": error}, headers)
        for kind, n in costs.items():
            self.buckets[kind].spend(now, n)
        return None

    def headers(self, now: float) -> dict[str, str]:
        rows = [
            (kind, bucket.capacity, bucket.level(now), groq_duration(bucket.full_in(now)))
            for kind, bucket in self.buckets.items()
            if kind != "rpm"  # enforced, never reported
        ]
        return _x_ratelimit(rows)


class AnthropicBuckets(Mode):
    """Anthropic: requests, input tokens (ITPM) and output tokens (OTPM) per minute, each a
    bucket "continuously replenished up to your maximum limit".

    - ITPM counts ``input_tokens`` + ``cache_creation_input_tokens``, not
      ``cache_read_input_tokens`` (except on Claude Haiku 3.5): on arrival a request takes its
      prompt less what the prompt cache already holds of it, and its reply settles that to
      the usage (two requests writing the same prefix at once both count it on arrival).
    - OTPM counts the tokens generated; "OTPM rate limits are estimated based on max_tokens
      at the beginning of each request, and the estimate is adjusted at the end of the
      request to reflect the actual number of output tokens used". So a request arriving
      takes its ``max_tokens`` from the bucket (and is refused when the bucket holds less:
      *unverified*, the docs do not say whether a request is refused or only counted), and
      its reply gives back what it did not generate.

    Headers ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
    remaining,reset}``: resets are RFC 3339 times at which the bucket is full again; token
    ``remaining`` is "rounded to the nearest thousand" (rounded down here, so it never claims
    more than there is); ``tokens-*`` is the most restrictive of input and output. A 429 is
    ``rate_limit_error`` with ``retry-after`` in seconds.

    Source: docs.anthropic.com/en/api/rate-limits ("Response headers", "Rate limits": token
    bucket, the cache rule for ITPM and its Haiku 3.5 exception, OTPM and ``max_tokens``).
    """

    def __init__(self, *, rpm: int, itpm: int, otpm: int) -> None:
        self.limits = {"requests": rpm, "input-tokens": itpm, "output-tokens": otpm}
        self.buckets = {kind: Bucket(v, v / 60) for kind, v in self.limits.items()}

    @staticmethod
    def reads_count(model: str) -> bool:
        """Whether cache reads count toward ``model``'s ITPM (Claude Haiku 3.5's only)."""
        return model.startswith(("claude-3-5-haiku", "claude-haiku-3-5"))

    def _input(self, cost: Cost) -> float:
        """What a request's input counts on arrival."""
        cached = 0 if self.reads_count(cost.model) else cost.cached_tokens
        return float(max(0, cost.input_tokens - cached))

    def admit(self, now: float, cost: Cost) -> Refused | None:
        costs = {
            "requests": 1.0,
            "input-tokens": self._input(cost),
            "output-tokens": float(cost.max_tokens),
        }
        waits = {kind: self.buckets[kind].wait_for(now, n) for kind, n in costs.items()}
        if (out := self.buckets["output-tokens"]).level(now) <= 0:  # spent beyond its estimate
            waits["output-tokens"] = max(
                waits["output-tokens"] or 0, (1 - out.level(now)) / out.per_s
            )
        broken = {kind: math.inf if w is None else w for kind, w in waits.items() if w != 0}
        if broken:
            kind = max(broken, key=broken.__getitem__)
            unit = kind.replace("-", " ")
            message = (
                f"This request would exceed the rate limit for your organization of "
                f"{self.limits[kind]} {unit} per minute. For details, refer to: "
                "https://docs.claude.com/en/api/rate-limits."
            )
            wait = waits[kind]
            headers = {} if wait is None else {"retry-after": str(max(1, math.ceil(wait)))}
            return Refused(anthropic.error_body(429, message), headers)
        for kind, n in costs.items():
            self.buckets[kind].spend(now, n)
        return None

    def settle(self, now: float, usage: dict[str, Any], cost: Cost | None = None) -> None:
        cost = cost or Cost(model="")
        counted = usage.get("input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
        if self.reads_count(cost.model):
            counted += usage.get("cache_read_input_tokens", 0)
        self.buckets["input-tokens"].spend(now, counted - self._input(cost))
        self.buckets["output-tokens"].spend(now, usage.get("output_tokens", 0) - cost.max_tokens)

    def headers(self, now: float) -> dict[str, str]:
        rows = {}
        for kind, bucket in self.buckets.items():
            remaining = max(0, math.floor(bucket.level(now)))
            if kind != "requests":
                remaining = remaining // 1000 * 1000
            rows[kind] = (self.limits[kind], remaining, bucket.full_in(now))
        rows["tokens"] = min(rows["input-tokens"], rows["output-tokens"], key=lambda r: r[1])
        headers = {}
        for kind, (limit, remaining, reset_s) in rows.items():
            prefix = f"anthropic-ratelimit-{kind}-"
            headers[prefix + "limit"] = str(limit)
            headers[prefix + "remaining"] = str(remaining)
            headers[prefix + "reset"] = anthropic.rfc3339(reset_s, datetime.fromtimestamp(now, UTC))
        return headers
