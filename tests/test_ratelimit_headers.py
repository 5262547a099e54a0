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


def test_a_unix_time_for_a_reset_is_read_as_one() -> None:
    # GitHub's style, many gateways' (seconds); OpenRouter's 429 metadata (milliseconds).
    at = NOW.timestamp() + 30
    for text in (f"{at:.0f}", f"{at * 1000:.0f}"):
        info = parse_rate_limit_headers(
            {"x-ratelimit-limit": "20", "x-ratelimit-remaining": "3", "x-ratelimit-reset": text},
            NOW,
        )
        assert info.requests == Window(None, 3, 30.0, count=20)
    left = {"x-ratelimit-remaining": "3"}
    past = {**left, "x-ratelimit-reset": f"{NOW.timestamp() - 5:.0f}"}
    assert parse_rate_limit_headers(past, NOW).requests.reset_s == 0.0
    hour = {**left, "x-ratelimit-reset": "3600"}  # (a delay: an hour)
    assert parse_rate_limit_headers(hour, NOW).requests.reset_s == 3600


def test_kongs_windows_are_read_per_minute_with_the_drafts_reset() -> None:
    # Kong's rate-limiting-advanced: a window per period beside the IETF draft's headers,
    # which show the window with least left.
    minute = {
        "x-ratelimit-limit-minute": "150",
        "x-ratelimit-remaining-minute": "20",
        "ratelimit-limit": "150",
        "ratelimit-remaining": "20",
        "ratelimit-reset": "7",
    }
    assert parse_rate_limit_headers(minute, NOW).requests == Window(150, 20, 7.0, span_s=60)
    # A second's 100 (6,000 a minute) and a minute's 600 beside it: the minute allows less;
    # the draft's reset is the second's (its limit shows), so not the minute's.
    both = {
        "x-ratelimit-limit-second": "100",
        "x-ratelimit-remaining-second": "4",
        "x-ratelimit-limit-minute": "600",
        "x-ratelimit-remaining-minute": "300",
        "ratelimit-limit": "100",
        "ratelimit-reset": "1",
    }
    assert parse_rate_limit_headers(both, NOW).requests == Window(600, 300, None, span_s=60)
    ten = {"x-ratelimit-limit-10": "50", "x-ratelimit-remaining-10": "9"}
    assert parse_rate_limit_headers(ten, NOW).requests == Window(300, 9, None, span_s=10)
    # An hour's count is no per-minute limit: only what is left shows, from the draft's.
    hour = {"x-ratelimit-limit-hour": "1000", "ratelimit-limit": "1000", "ratelimit-remaining": "9"}
    assert parse_rate_limit_headers(hour, NOW).requests == Window(None, 9, None, count=1000)


@pytest.mark.parametrize(
    "headers",
    [
        # express-rate-limit's draft-6, draft-7 and draft-8 headers for 100 a minute.
        {
            "ratelimit-policy": "100;w=60",
            "ratelimit-limit": "100",
            "ratelimit-remaining": "40",
            "ratelimit-reset": "21",
        },
        {"ratelimit-policy": "100;w=60", "ratelimit": "limit=100, remaining=40, reset=21"},
        {
            "ratelimit-policy": '"100-in-1min"; q=100; w=60; pk=:ZmFrZQ==:',
            "ratelimit": '"100-in-1min"; r=40; t=21',
        },
    ],
    ids=["draft-6", "draft-7", "draft-8"],
)
def test_the_ietf_drafts_headers_in_each_version(headers: dict[str, str]) -> None:
    assert parse_rate_limit_headers(headers, NOW).requests == Window(100, 40, 21.0, span_s=60)
    assert read_rate_limits(httpx.Headers({k.title(): v for k, v in headers.items()})) is not None


def test_the_drafts_headers_without_a_window_of_a_minute() -> None:
    # No policy: a count whose window's length is unknown (as Together's).
    bare = {"ratelimit-limit": "10", "ratelimit-remaining": "3", "ratelimit-reset": "2"}
    assert parse_rate_limit_headers(bare, NOW).requests == Window(None, 3, 2.0, count=10)
    # Several policies: the one whose quota the limit shows; a day's says only what is left.
    several = {"ratelimit-policy": "10;w=1, 1000;w=86400", "ratelimit-limit": "1000"}
    day = parse_rate_limit_headers({**several, "ratelimit-remaining": "5"}, NOW).requests
    assert day == Window(None, 5, None)
    second = parse_rate_limit_headers({**several, "ratelimit-limit": "10"}, NOW).requests
    assert second == Window(600, None, None, span_s=1)


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
_NAMES = [
    *(f"x-ratelimit-{p}-{k}" for p in _PARTS for k in _KINDS),
    *(f"anthropic-ratelimit-{k}-{p}" for k in _KINDS for p in _PARTS),
    *(f"x-ratelimit-{p}-{w}" for p in _PARTS[:2] for w in ("second", "minute", "10", "hour")),
    *(f"ratelimit-{p}" for p in (*_PARTS, "policy")),
    "ratelimit",
]
_VALUES = st.sampled_from(
    [
        *("500", "499", "0", "1.5", "6m0s", "120ms", "59.99s", "lots", "", "-3", "1765000000"),
        *("100;w=60", "10;w=1, 50;w=60", '"q"; q=100; w=60', '"q"; r=4; t=2', "limit=9, reset=3"),
    ]
)


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
