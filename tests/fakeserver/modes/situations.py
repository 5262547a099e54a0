"""The modes that are a situation rather than one provider: a server with no rate-limit headers,
another client on the same key, a hard spend limit, a flex tier out of capacity. Each docstring
names its source."""

from __future__ import annotations

import math
from typing import Any

from .base import CalendarWindow, Cost, Mode, Refused


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


class ParallelLimit(Mode):
    """LiteLLM proxy's parallel request limiter: a key's ``max_parallel_requests``, no limit
    on the rate and no rate-limit headers (a key with only this limit gets none: its success
    hook writes ``x-ratelimit-*`` for a key's rpm or tpm limit alone).

    Source: litellm/proxy/hooks/parallel_request_limiter.py. The count lives in a cache entry
    per key and calendar minute (``{key}::{YYYY-MM-DD-HH-MM}::request_count``): a request is
    admitted while ``current_requests < max_parallel_requests`` and adds one; its success or
    failure takes one off the entry of the minute it ends in (not below 0, a missing entry
    read as 1). So at each minute's turn the count starts again from 0 with the old minute's
    requests still running. A refusal is a 429 with the detail "Max parallel request limit
    reached" (the proxy's ``{"error": {..., "code": "429"}}`` body) and ``retry-after``
    ``str(time_to_next_minute())``, seconds to the minute's turn as a float (``52.905443``):
    when the count restarts, not when a slot frees.
    """

    def __init__(self, *, max_parallel: int, slots: int | None = None) -> None:
        self.max_parallel, self.slots = max_parallel, slots
        self.count = CalendarWindow(60)

    def admit(self, now: float, cost: Cost) -> Refused | None:
        current = int(self.count.used(now))
        if current >= self.max_parallel:
            message = (
                "LiteLLM Rate Limit Handler for rate limit type = key. Max parallel request "
                f"limit reached. current max_parallel_requests: {current}, "
                f"max_parallel_requests: {self.max_parallel}"
            )
            error = {"message": message, "type": "None", "param": "None", "code": "429"}
            return Refused({"error": error}, {"retry-after": str(self.count.reset_in(now))})
        self.count.add(now, 1)
        return None

    def release(self, now: float) -> None:
        used = self.count.used(now)
        self.count.add(now, -1 if used >= 1 else -used)


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


class FlexCapacity(Mode):
    """OpenAI's flex tier with no room for a while: once ``after`` requests got through, every
    request arriving in the next ``busy_s`` seconds is answered ``429 Resource Unavailable``,
    unbilled and with no ``retry-after``; otherwise ``inner`` counts and reports as it would
    have (the refusals never reach it: a request the tier had no room for is not counted).

    Source: OpenAI's flex-processing guide ("Resource unavailable errors": "Flex processing
    may sometimes lack sufficient resources to handle your requests, resulting in a 429
    Resource Unavailable error code. You will not be charged when this occurs"; it advises
    exponential backoff). The body's ``code`` is *unverified* (PROVIDERS.md: one client
    matches ``resource_unavailable``); the message is the guide's words.
    """

    def __init__(self, inner: Mode, *, busy_s: float, after: int = 0) -> None:
        self.inner, self.slots = inner, inner.slots
        self.after, self.busy_s = after, busy_s
        self.busy_at: float | None = None  # when the tier filled
        self.admitted = self.refused = 0

    def admit(self, now: float, cost: Cost) -> Refused | None:
        if self.busy_at is None and self.admitted >= self.after:
            self.busy_at = now
        if self.busy_at is not None and now < self.busy_at + self.busy_s:
            self.refused += 1
            error = {
                "message": "Resource Unavailable",
                "type": "resource_unavailable",
                "param": None,
                "code": "resource_unavailable",
            }
            return Refused({"error": error}, {})
        refused = self.inner.admit(now, cost)
        self.admitted += refused is None
        return refused

    def settle(self, now: float, usage: dict[str, Any], cost: Cost | None = None) -> None:
        self.inner.settle(now, usage, cost)

    def headers(self, now: float) -> dict[str, str]:
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
            error: dict[str, Any] = {
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
