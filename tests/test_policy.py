"""Backoff, Retry-After and error classes: pure code, no sleeping (the limiter: test_limiter)."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq import backoff
from aiq.providers.base import classify_status, retry_after_s, retry_after_upper
from aiq.providers.failures import stated_limit
from aiq.ratelimit_headers import StatedLimit


@given(
    attempt=st.integers(1, 200),
    base=st.floats(0.001, 10),
    cap=st.floats(0.01, 600),
    r=st.floats(0, 1, exclude_max=True),
)
def test_backoff_is_full_jitter_under_the_exponential_cap(
    attempt: int, base: float, cap: float, r: float
) -> None:
    d = backoff.delay(attempt, base_s=base, cap_s=cap, rand=lambda: r)
    ceiling = min(cap, base * 2 ** (attempt - 1))
    assert 0 <= d <= ceiling
    assert d == pytest.approx(ceiling * r)


@given(retry_after=st.floats(0, 3600), r=st.floats(0, 1), attempt=st.integers(1, 50))
def test_backoff_never_retries_sooner_than_the_server_asked(
    retry_after: float, r: float, attempt: int
) -> None:
    d = backoff.delay(attempt, retry_after_s=retry_after, rand=lambda: r)
    # (At most a tenth more, and never over half a second more: a wait to a minute's turn
    # must not keep one job seconds after the others.)
    assert retry_after <= d <= retry_after + min(0.1 * retry_after, 0.5) + 1e-9


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError):
        backoff.delay(0)


@pytest.mark.parametrize(
    ("headers", "message", "expected"),
    [
        ({"retry-after-ms": "1500"}, "", 1.5),
        ({"retry-after": "7"}, "", 7.0),
        ({"retry-after": "0.25"}, "", 0.25),
        (
            {
                "retry-after": "Wed, 21 Oct 2026 07:28:10 GMT",
                "date": "Wed, 21 Oct 2026 07:28:00 GMT",
            },
            "",
            10.0,
        ),
        ({}, "Rate limit reached. Please try again in 18.6s.", 18.6),
        ({}, "Please try again in 120ms", 0.12),
        ({"retry-after": "52.905443"}, "", 52.905443),  # LiteLLM's parallel limiter
        ({"llm_provider-retry-after": "60"}, "", 60.0),  # LiteLLM's router, no standard header
        ({"retry-after": "3", "llm_provider-retry-after": "60"}, "", 3.0),  # the standard wins
        ({"retry-after-ms": "250", "llm_provider-retry-after": "60"}, "", 0.25),
        ({"retry-after": "soon", "llm_provider-retry-after": "60"}, "", 60.0),
        ({"llm_provider-retry-after": "60"}, "Please try again in 2s", 60.0),
        ({"llm_provider-retry-after": "later"}, "", None),
        ({"retry-after": "soon"}, "", None),
        ({}, "no hint here", None),
        # Groq: whole seconds in the header, rounded up from the message's exact wait.
        ({"retry-after": "1"}, "Please try again in 200ms.", 0.2),
        ({"retry-after": "19"}, "Please try again in 18.642s.", 18.642),
        ({"retry-after": "5"}, "Please try again in 200ms.", 5.0),  # no rounding: the header
        ({"retry-after": "0.5"}, "Please try again in 200ms.", 0.5),  # (not whole seconds)
    ],
)
def test_retry_after_forms(headers: dict[str, str], message: str, expected: float | None) -> None:
    got = retry_after_s(httpx.Headers(headers), message)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("headers", "upper"),
    [
        ({"llm_provider-retry-after": "60"}, True),  # LiteLLM's router: it counts calendar minutes
        ({"retry-after": "soon", "llm_provider-retry-after": "60"}, True),
        ({"retry-after": "3", "llm_provider-retry-after": "60"}, False),  # the standard is read
        ({"retry-after-ms": "250", "llm_provider-retry-after": "60"}, False),
        ({"retry-after": "52.905443"}, False),
        ({}, False),
    ],
)
def test_only_litellm_routers_delay_is_a_bound(headers: dict[str, str], upper: bool) -> None:
    assert retry_after_upper(httpx.Headers(headers)) is upper


@pytest.mark.parametrize(
    ("message", "stated"),
    [
        # OpenAI (its rate-limits guide; captures of real replies)
        (
            "Rate limit reached for gpt-4o-mini in organization org-abc on requests per min "
            "(RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.",
            StatedLimit("requests", 3),
        ),
        (
            "Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): "
            "Limit 30000, Used 29803, Requested 1223. Please try again in 2.052s.",
            StatedLimit("tokens", 30000),
        ),
        # Groq (console.groq.com/docs/rate-limits): "per minute", and per day, not a pace
        (
            "Rate limit reached for model `llama-3.1-8b-instant` in organization `org_x` "
            "service tier `on_demand` on requests per minute (RPM): Limit 30, Used 30, "
            "Requested 1. Please try again in 2s.",
            StatedLimit("requests", 30),
        ),
        (
            "Rate limit reached for model `m` in organization `o` on tokens per minute (TPM): "
            "Limit 6,000, Used 5,654, Requested 1,234.",
            StatedLimit("tokens", 6000),
        ),
        ("... on requests per day (RPD): Limit 14400, Used 14400, Requested 1.", None),
        ("Deployment over defined rpm limit=600. current usage=600", None),
        ("Rate limit exceeded", None),
    ],
)
def test_a_429_message_naming_its_per_minute_limit_is_read(
    message: str, stated: StatedLimit | None
) -> None:
    assert stated_limit(message) == stated


@given(ms=st.integers(0, 10**9))
def test_retry_after_ms_round_trips(ms: int) -> None:
    assert retry_after_s(httpx.Headers({"retry-after-ms": str(ms)})) == pytest.approx(ms / 1000)


@pytest.mark.parametrize(
    ("status", "message", "code", "expected"),
    [
        (400, "bad", None, ("invalid_request", False, False)),
        (401, "Incorrect API key", "invalid_api_key", ("auth", False, True)),
        (403, "nope", None, ("auth", False, True)),
        (404, "model not found", "model_not_found", ("not_found", False, True)),
        (429, "slow down", None, ("rate_limit", True, False)),
        (
            429,
            "Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 45000.",
            "rate_limit_exceeded",
            ("invalid_request", False, False),
        ),
        (429, "You exceeded your current quota", "insufficient_quota", ("quota", False, True)),
        (429, "spend limit", "organization_spend_limit_exceeded", ("spend_limit", False, True)),
        (429, "spend limit", "project_spend_limit_exceeded", ("spend_limit", False, True)),
        (400, "Your credit balance is too low", None, ("quota", False, True)),
        (400, "maximum context length is 8192", None, ("invalid_request", False, False)),
        (500, "oops", None, ("server", True, False)),
        (503, "overloaded", None, ("server", True, False)),
        (529, "overloaded", None, ("server", True, False)),
        (599, "?", None, ("server", True, False)),
        (418, "teapot", None, ("invalid_request", False, False)),
    ],
)
def test_error_classes(
    status: int, message: str, code: str | None, expected: tuple[str, bool, bool]
) -> None:
    assert classify_status(status, message, code) == expected
