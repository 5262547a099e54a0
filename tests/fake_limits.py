"""How real providers and gateways count rate limits, as modes of the tests' fake server.

``FakeServer(limit_mode=OpenAIBucket(rpm=600))`` hands every request to the mode: it admits it
or refuses it (the 429 in that provider's words), and writes the rate-limit headers of every
reply as that provider does. Without a mode the server keeps its own sliding-window limiter
(``rpm``, ``tpm``, ``limit_window_s``), which its older tests rely on.

Each mode is one small class whose docstring names its source (the facts are gathered in
``/work/shared/PROVIDERS.md``). They are modelled on the providers, never on aiq's limiter, so
that aiq is measured against how the world counts rather than against its own idea of it.

Time is an argument (``now``, in seconds since the epoch, since gateways count calendar
minutes): the server passes ``time.time()``, a test passes a fake clock. Like the rest of the
fake server this imports nothing from ``aiq``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import fake_anthropic as anthropic

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

    def admit(self, now: float, cost: Cost) -> Refused | None:
        """Count a request arriving at ``now`` and return None, or refuse it uncounted."""
        return None

    def settle(self, now: float, usage: dict[str, Any], cost: Cost | None = None) -> None:
        """Account a reply's ``usage`` once it is generated (for limits counted after), for
        the request admitted at ``cost``."""

    def headers(self, now: float) -> dict[str, str]:
        """The rate-limit headers of a reply sent at ``now``."""
        return {}


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
    docs name only the remaining headers). 429 with ``retry-after`` and ``retry-after-ms``.

    Source: learn.microsoft.com/azure/ai-services/openai/how-to/quota ("Understanding rate
    limits": "requests be evenly distributed over a one-minute period", the 600-RPM example),
    and Microsoft Q&A 1336515 (a Microsoft employee: "typically 1 or 10 seconds").
    """

    def __init__(self, *, rpm: int | None = None, tpm: int | None = None, window_s: float = 10):
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
        return _x_ratelimit(
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


class Headerless(Mode):
    """A server that says nothing about limits: no rate-limit headers on any reply.

    - vLLM, Ollama, llama.cpp's server: no limit at all (``rpm=None``); capacity is what the
      hardware serves at once, ``slots`` of them, the rest queue (llama-cpp-python's server:
      one at a time, "You can't run concurrent completions on the same llama.cpp context, you
      have to queue them": abetlen/llama-cpp-python#1529; llama.cpp's ``--parallel N`` slots).
    - A gateway refusing over ``rpm`` per calendar minute, with one of three hints:
      ``hint="retry-after"``: LiteLLM's parallel request limiter, ``retry-after`` the seconds
      to the next minute, fractional (``str(time_to_next_minute())``: ``52.905443``; it admits
      while ``current_rpm < rpm_limit``: litellm/proxy/hooks/parallel_request_limiter.py);
      ``hint="retry-after-whole"``: the same count with ``retry-after`` as RFC 9110 writes it,
      whole ``delay-seconds`` (rounded up, so a client waiting that long finds the new minute);
      ``hint="llm_provider"``: LiteLLM's router, ``llm_provider-retry-after: 60`` and no
      standard header (see ``LiteLLMRouter``); ``hint=None``: no hint at all (a model that
      always fails may send none: PROVIDERS.md).
    """

    def __init__(
        self, *, rpm: int | None = None, hint: str | None = "retry-after", slots: int | None = None
    ) -> None:
        if hint not in ("retry-after", "retry-after-whole", "llm_provider", None):
            raise ValueError(
                'hint must be "retry-after", "retry-after-whole", "llm_provider" or None'
            )
        self.rpm, self.hint, self.slots = rpm, hint, slots
        self.window = CalendarWindow(60)

    def admit(self, now: float, cost: Cost) -> Refused | None:
        if self.rpm is not None and self.window.used(now) >= self.rpm:
            message = (
                "Max parallel request limit reached. LiteLLM Rate Limit Handler for rate "
                f"limit type = key. current rpm: {int(self.window.used(now))}, rpm limit: "
                f"{self.rpm}"
            )
            reset_s = self.window.reset_in(now)
            headers = {
                "retry-after": {"retry-after": str(round(reset_s, 6))},
                "retry-after-whole": {"retry-after": str(math.ceil(reset_s))},
                "llm_provider": {"llm_provider-retry-after": "60"},
                None: {},
            }[self.hint]
            error = {"message": message, "type": "None", "param": "None", "code": "429"}
            return Refused({"error": error}, headers)
        self.window.add(now, 1)
        return None


class OtherClient(Mode):
    """Another client on the same key: from ``start_at`` until ``stop_at`` (clock times) it
    sends ``rpm`` requests a minute of ``tokens`` each through ``inner``, taking its share of
    the quota (its own refusals ignored), then stops. It acts lazily: before each of our
    requests and replies, everything it would have sent by then is replayed in order.

    Source: every provider counts per key or organization, not per process ("Rate limits apply
    at the organization level": Groq's rate-limits page; OpenAI's guide: limits are per
    organization and project), so a second batch, a colleague or a retry storm elsewhere
    spends the same limit.
    """

    def __init__(
        self, inner: Mode, *, rpm: float, start_at: float, stop_at: float, tokens: int = 0
    ) -> None:
        self.inner, self.interval_s, self.stop_at = inner, 60 / rpm, stop_at
        self.next_at, self.cost = start_at, Cost(tokens=tokens, input_tokens=tokens)
        self.slots = inner.slots
        self.sent = self.admitted = 0
        self.admitted_at: list[float] = []  # its own admissions, for a test's window count

    def _catch_up(self, now: float) -> None:
        while self.next_at <= now and self.next_at < self.stop_at:
            self.sent += 1
            if self.inner.admit(self.next_at, self.cost) is None:
                self.admitted += 1
                self.admitted_at.append(self.next_at)
            self.next_at += self.interval_s

    def admit(self, now: float, cost: Cost) -> Refused | None:
        self._catch_up(now)
        return self.inner.admit(now, cost)

    def settle(self, now: float, usage: dict[str, Any], cost: Cost | None = None) -> None:
        self.inner.settle(now, usage, cost)

    def headers(self, now: float) -> dict[str, str]:
        self._catch_up(now)
        return self.inner.headers(now)


class SpendLimit(Mode):
    """A hard spend limit reached after ``after`` accepted calls: every request after that is
    refused with a 429 that is money, not pacing, and no ``retry-after``.

    - ``shape="openai-organization"`` / ``"openai-project"``: ``{"error": {"type":
      "insufficient_quota", "code": "organization_spend_limit_exceeded"}}`` (or
      ``project_spend_limit_exceeded``): OpenAI's hard spend limits (its spend-limits guide;
      enforcement "not instantaneous").
    - ``shape="anthropic"``: ``{"type": "error", "error": {"type": "rate_limit_error",
      "message": "You have reached your API usage limits...", "details": {"error_code":
      "enforced_spend_limit_reached"}}}``: Anthropic's monthly spend cap; retries fail until
      the next month.

    Source: ../shared/PROVIDERS.md, "429s and other errors that are not pacing" (both rows),
    and the bodies quoted in issue 13.
    """

    _SHAPES = ("openai-organization", "openai-project", "anthropic")

    def __init__(self, *, after: int, shape: str = "openai-organization") -> None:
        if shape not in self._SHAPES:
            raise ValueError(f"shape must be one of {', '.join(self._SHAPES)}")
        self.after, self.shape, self.admitted = after, shape, 0

    def admit(self, now: float, cost: Cost) -> Refused | None:
        if self.admitted < self.after:
            self.admitted += 1
            return None
        if self.shape == "anthropic":
            error = {
                "type": "rate_limit_error",
                "message": (
                    "You have reached your API usage limits. You will regain access on "
                    "2027-01-01 at 00:00 UTC."
                ),
                "details": {"error_code": "enforced_spend_limit_reached"},
            }
            return Refused({"type": "error", "error": error}, {})
        which = self.shape.removeprefix("openai-")
        error = {
            "message": f"You have exceeded your {which}'s spend limit.",
            "type": "insufficient_quota",
            "param": None,
            "code": f"{which}_spend_limit_exceeded",
        }
        return Refused({"error": error}, {})


MODES: dict[str, Callable[..., Mode]] = {
    "openai": OpenAIBucket,
    "per-second": PerSecond,
    "litellm": LiteLLMRouter,
    "azure": AzureWindows,
    "groq": GroqDaily,
    "anthropic": AnthropicBuckets,
    "headerless": Headerless,
}


def build(
    name: str,
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    rpd: int | None = None,
    slots: int | None = None,
) -> Mode:
    """The mode ``name`` (a key of ``MODES``) from command-line style limits: for
    ``anthropic``, ``tpm`` is both its input and its output limit; for ``groq``, ``rpd`` is the
    reported day limit and ``rpm`` the unreported minute one."""
    if name == "anthropic":
        if rpm is None or tpm is None:
            raise ValueError("anthropic needs rpm and tpm")
        return AnthropicBuckets(rpm=rpm, itpm=tpm, otpm=tpm)
    if name == "groq":
        if rpd is None:
            raise ValueError("groq needs rpd")
        return GroqDaily(rpd=rpd, tpm=tpm, rpm=rpm)
    if name == "headerless":
        return Headerless(rpm=rpm, slots=slots)
    return MODES[name](rpm=rpm, tpm=tpm)
