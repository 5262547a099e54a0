"""Rate-limit header parsing: OpenAI durations and Anthropic RFC 3339 resets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq.providers.base import reply_headers
from aiq.ratelimit_headers import (
    RateLimitInfo,
    Window,
    parse_duration,
    parse_rate_limit_headers,
    parse_rfc3339_delay,
    read_rate_limits,
)

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("120ms", 0.12),
        ("59.99s", 59.99),
        ("1h2m3.5s", 3723.5),
        ("0s", 0.0),
        ("250us", 0.00025),
        ("1.5", 1.5),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "1x", "s1", "1s junk", "-1s"])
def test_not_durations(text: str) -> None:
    assert parse_duration(text) is None


def _go(seconds_ms: int) -> str:
    """Format milliseconds the way OpenAI does: 1h2m3.5s, 6m0s, 120ms."""
    if seconds_ms < 1000:
        return f"{seconds_ms}ms"
    h, rest = divmod(seconds_ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s = f"{rest / 1000:g}s"
    return (f"{h}h" if h else "") + (f"{m}m" if h or m else "") + s


@given(st.integers(0, 10 * 3_600_000))
def test_duration_round_trips(ms: int) -> None:
    assert parse_duration(_go(ms)) == pytest.approx(ms / 1000)


@given(st.integers(-3600, 86_400))
def test_rfc3339_delay(offset_s: int) -> None:
    when = (NOW + timedelta(seconds=offset_s)).isoformat().replace("+00:00", "Z")
    assert parse_rfc3339_delay(when, NOW) == pytest.approx(max(0, offset_s))


def test_rfc3339_without_zone_is_refused() -> None:
    assert parse_rfc3339_delay("2026-11-29T12:00:05", NOW) is None


def test_openai_headers() -> None:
    info = parse_rate_limit_headers(
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "200000",
            "x-ratelimit-remaining-tokens": "150000",
            "x-ratelimit-reset-tokens": "6m0s",
        },
        NOW,
    )
    assert info == RateLimitInfo(Window(500, 499, 0.12), Window(200_000, 150_000, 360.0))


def test_anthropic_headers() -> None:
    info = parse_rate_limit_headers(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2026-11-29T12:00:07Z",
            "anthropic-ratelimit-tokens-limit": "40000",
            "anthropic-ratelimit-tokens-remaining": "39000",
            "anthropic-ratelimit-tokens-reset": "2026-11-29T12:00:01+00:00",
        },
        NOW,
    )
    assert info == RateLimitInfo(Window(50, 0, 7.0), Window(40_000, 39_000, 1.0))


def test_together_unsuffixed_headers_are_a_windows_count_not_a_limit() -> None:
    # Together's limit per second: a count for the window its resets imply, never per minute.
    info = parse_rate_limit_headers(
        {
            "x-ratelimit-limit": "10",
            "x-ratelimit-remaining": "7",
            "x-ratelimit-reset": "0.3",
            "x-tokenlimit-limit": "5000",
            "x-tokenlimit-remaining": "4200",
        },
        NOW,
    )
    assert info.requests == Window(None, 7, 0.3, count=10)
    assert info.tokens == Window(None, 4200, None, count=5000)
    # OpenAI's names, where they are sent, are what is read.
    both = parse_rate_limit_headers(
        {"x-ratelimit-limit": "10", "x-ratelimit-limit-requests": "600"}, NOW
    )
    assert both.requests == Window(600, None, None)
    assert read_rate_limits({"x-tokenlimit-remaining": "4200"}) is not None


def test_no_headers_and_garbage() -> None:
    assert parse_rate_limit_headers({}, NOW).empty
    info = parse_rate_limit_headers(
        {"x-ratelimit-limit-requests": "lots", "x-ratelimit-reset-requests": "later"}, NOW
    )
    assert info.requests == Window(None, None, None)


@pytest.mark.parametrize("wrap", [httpx.Headers, dict], ids=["httpx.Headers", "dict"])
def test_read_rate_limits_finds_either_providers_headers_in_any_case(wrap: type) -> None:
    openai = wrap({"X-RateLimit-Limit-Requests": "500", "x-ratelimit-remaining-requests": "499"})
    info = read_rate_limits(openai if wrap is httpx.Headers else _lower(openai))
    assert info is not None and info.requests.limit == 500 and info.requests.remaining == 499
    anthropic = wrap({"anthropic-ratelimit-tokens-limit": "80000"})
    info = read_rate_limits(anthropic)
    assert info is not None and info.tokens.limit == 80000
    assert read_rate_limits(wrap({"content-type": "application/json", "x-request-id": "r"})) is None


def _lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


_PARTS, _KINDS = ("limit", "remaining", "reset"), ("requests", "tokens")
_NAMES = [f"x-ratelimit-{p}-{k}" for p in _PARTS for k in _KINDS] + [
    f"anthropic-ratelimit-{k}-{p}" for k in _KINDS for p in _PARTS
]
_VALUES = st.sampled_from(["500", "499", "0", "1.5", "6m0s", "120ms", "59.99s", "lots", "", "-3"])


@pytest.mark.slow
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*_NAMES, "x-request-id", "content-type"]).flatmap(
                lambda name: st.sampled_from([name, name.upper(), name.title()])
            ),
            _VALUES,
        ),
        max_size=16,
    )
)
def test_a_replys_one_pass_reads_what_the_headers_say(pairs: list[tuple[str, str]]) -> None:
    """reply_headers gathers the rate-limit headers in its one pass over a reply's headers
    (for speed); it reads the same as looking each up in httpx.Headers, repeats included."""
    headers = httpx.Headers(pairs)
    ids = [v for k, v in pairs if k.lower() == "x-request-id"]
    assert reply_headers(headers, b"x-request-id") == (
        ids[-1] if ids else None,
        read_rate_limits(headers),
    )
