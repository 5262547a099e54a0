"""Read a provider's rate-limit headers into one shape the limiter can follow.

OpenAI sends ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` with resets as Go-style
durations (``1s``, ``6m0s``, ``120ms``, ``59.99s``, ``1h2m3.5s``). Anthropic sends
``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` with resets as RFC 3339
times, and its input and output token limits apart as ``-input-tokens-*`` and
``-output-tokens-*`` (``tokens-*`` is then the most restrictive of the two). Each describes the
same thing: how much of the current window is left and when it refills.

Together sends them unsuffixed, ``x-ratelimit-{limit,remaining,reset}`` for requests and
``x-tokenlimit-{limit,remaining}`` for tokens, its limit per **second** (PROVIDERS.md; public
clients multiply it by 60), and other gateways use the same names per minute or per hour. So
an unsuffixed limit is read as a window's ``count``, its length unknown: what its resets
imply (aiq.implied_limit) makes it a rate, never the name. A bare reset that is a Unix time
(GitHub's style, many gateways'; OpenRouter's in milliseconds) is read as one.

Gateways in front of a model server report in their own words (PROVIDERS.md): Kong per
period, ``x-ratelimit-{limit,remaining}-{second,minute,...}`` beside the IETF draft's
``ratelimit-{limit,remaining,reset}``; express-rate-limit the draft's headers in one of its
versions, the window's length in ``ratelimit-policy`` (``100;w=60``, or ``"name"; q=100;
w=60``) and the state in ``ratelimit-*`` (draft 6), ``ratelimit: limit=100, remaining=40,
reset=21`` (draft 7) or ``ratelimit: "name"; r=40; t=21`` (draft 8). A window of a minute
or less is a per-minute limit with what is left in it; longer ones (an hour's, a day's) only
say what is left.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_PARAM = re.compile(r'(\w+)=("[^"]*"|[^;,\s]+)')  # a draft header's ``key=value``
# A bare reset this large is no delay but a Unix time (in seconds: 2001 on; in milliseconds
# past this many): a delay of 31 years read as one held nothing back, and said nothing.
_EPOCH_S = 1e9
_EPOCH_MS = 1e12
_PERIOD_S = {"second": 1, "minute": 60}  # Kong's names for windows of a minute or less
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True, slots=True)
class Window:
    """One budget as the server reports it: limit per window, what is left, when it refills."""

    limit: int | None
    remaining: int | None
    reset_s: float | None
    # A limit per a window of unknown length (Together's unsuffixed ``x-ratelimit-limit``):
    # not a per-minute limit, only how many the window holds (aiq.implied_limit).
    count: int | None = None
    # How long the window is, where the headers name it (a gateway's ``-minute``, a draft
    # policy's ``w=60``): what is left in it is the server's own count, not a pace's.
    span_s: float | None = None


NO_WINDOW = Window(None, None, None)


@dataclass(frozen=True, slots=True)
class StatedLimit:
    """A per-minute limit a 429's message names (``requests`` or ``tokens``), where no
    header may show it (Groq's requests per minute)."""

    kind: str
    per_minute: int


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    """The server's view of its budgets after one response. ``input_tokens`` and
    ``output_tokens`` are Anthropic's separate limits (ITPM, OTPM); others send neither."""

    requests: Window
    tokens: Window
    input_tokens: Window = NO_WINDOW
    output_tokens: Window = NO_WINDOW

    @property
    def empty(self) -> bool:
        return all(
            v is None
            for w in (self.requests, self.tokens, self.input_tokens, self.output_tokens)
            for v in (w.limit, w.remaining, w.reset_s, w.count)
        )

    @property
    def split_tokens(self) -> bool:
        """Whether input and output tokens are limited apart (Anthropic's headers)."""
        return bool(self.input_tokens.limit or self.output_tokens.limit)


@functools.lru_cache(maxsize=1024)  # every reply has one or two; most repeat (1s, 6m0s, 2ms)
def parse_duration(text: str) -> float | None:
    """Seconds in a Go-style duration (``6m0s``, ``120ms``, ``1h2m3.5s``), or None if not one."""
    text = text.strip()
    if not text:
        return None
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text):
        # A bare number is seconds (some gateways send "1.5").
        try:
            return max(0.0, float(text)) if pos == 0 else None
        except ValueError:
            return None
    return total


def parse_rfc3339_delay(text: str, now: datetime) -> float | None:
    """Seconds from ``now`` until an RFC 3339 time (never negative), or None if unparseable."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return max(0, int(float(value)))
    except ValueError:
        return None


def _reset(value: str | None, now: datetime) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value)
    if seconds is not None and seconds >= _EPOCH_S:  # a Unix time, not a delay
        return max(0.0, seconds / (1000 if seconds >= _EPOCH_MS else 1) - now.timestamp())
    return seconds if seconds is not None else parse_rfc3339_delay(value, now)


def parse_rate_limit_headers(headers: Mapping[str, str], now: datetime) -> RateLimitInfo:
    """Every budget from OpenAI, Anthropic or Together headers (lower-case keys); missing parts
    are None."""

    def window(names: tuple[str, ...]) -> Window:
        limit, remaining, reset, *anthropic = names
        if limit not in headers and remaining not in headers:
            limit, remaining, reset = anthropic
        return Window(
            _int(headers.get(limit)), _int(headers.get(remaining)), _reset(headers.get(reset), now)
        )

    requests, tokens = window(_NAMES["requests"]), window(_NAMES["tokens"])
    if requests == NO_WINDOW:
        requests = _unsuffixed(headers, _UNSUFFIXED["requests"], now)
    if requests == NO_WINDOW:
        requests = _per_period(headers, now)
    if requests == NO_WINDOW:
        requests = _draft(headers, now)
    if tokens == NO_WINDOW:
        tokens = _unsuffixed(headers, _UNSUFFIXED["tokens"], now)
    return RateLimitInfo(
        requests, tokens, window(_NAMES["input-tokens"]), window(_NAMES["output-tokens"])
    )


def _unsuffixed(headers: Mapping[str, str], names: tuple[str, str, str], now: datetime) -> Window:
    """Together's window (see the module's docstring): a count, what is left, the reset."""
    count, remaining, reset = names
    if count not in headers and remaining not in headers:
        return NO_WINDOW
    return Window(
        None,
        _int(headers.get(remaining)),
        _reset(headers.get(reset), now),
        count=_int(headers.get(count)),
    )


def _per_period(headers: Mapping[str, str], now: datetime) -> Window:
    """Kong's windows (``x-ratelimit-limit-minute``, ``-second``, ``-10``: a window's
    seconds): of those a minute long or less, the one that allows least a minute. The draft's
    ``ratelimit-reset`` is the window's whose limit ``ratelimit-limit`` shows."""
    best: tuple[float, Window] | None = None
    prefix = "x-ratelimit-limit-"
    for key in headers:
        name = key.lower()
        if not name.startswith(prefix):
            continue
        period = name[len(prefix) :]
        span_s = _PERIOD_S.get(period) or (int(period) if period.isdigit() else 0)
        limit = _int(headers[key])
        if not 0 < span_s <= 60 or not limit:
            continue  # (an hour's, a day's: what is left shows in the draft's headers)
        per_minute = limit * 60 / span_s
        if best is None or per_minute < best[0]:
            shown = _int(headers.get("ratelimit-limit")) == limit
            reset = _reset(headers.get("ratelimit-reset"), now) if shown else None
            remaining = _int(headers.get(f"x-ratelimit-remaining-{period}"))
            best = (per_minute, Window(round(per_minute), remaining, reset, span_s=span_s))
    return NO_WINDOW if best is None else best[1]


def _draft(headers: Mapping[str, str], now: datetime) -> Window:
    """The IETF draft's headers, as express-rate-limit writes its versions 6 to 8 (see the
    module's docstring): a per-minute limit where the policy says a window of a minute or
    less, else a count (no length said) or only what is left (a longer window)."""
    state = _params(headers.get("ratelimit", ""))
    count = _int(headers.get("ratelimit-limit", state.get("limit")))
    remaining = _int(headers.get("ratelimit-remaining", state.get("remaining", state.get("r"))))
    reset = _reset(headers.get("ratelimit-reset", state.get("reset", state.get("t"))), now)
    if count is None and remaining is None:
        return NO_WINDOW
    quota, span_s = _policy(headers.get("ratelimit-policy", ""), count)
    count = count or quota
    if span_s is None:
        return Window(None, remaining, reset, count=count)
    if count and 0 < span_s <= 60:
        return Window(round(count * 60 / span_s), remaining, reset, span_s=span_s)
    return Window(None, remaining, reset)  # an hour's or a day's: only what is left


def _policy(text: str, count: int | None) -> tuple[int | None, float | None]:
    """The quota and window (seconds) of a ``ratelimit-policy``: the one whose quota is
    ``count``, else the first (``10;w=1, 100;w=60``, or ``"name"; q=100; w=60``)."""
    found: tuple[int | None, float | None] = (None, None)
    for item in text.split(","):
        params = _params(item)
        bare = item.split(";", 1)[0].strip()
        quota = _int(params.get("q", bare if bare.isdigit() else None))
        try:
            span_s = float(params["w"]) if "w" in params else None
        except ValueError:
            span_s = None
        if found == (None, None) or (count is not None and quota == count):
            found = (quota, span_s)
    return found


def _params(text: str) -> dict[str, str]:
    return {k.lower(): v.strip('"') for k, v in _PARAM.findall(text)}


# Each kind's header names, OpenAI's then Anthropic's: built once, not on every reply. (Input
# and output tokens apart are Anthropic's only; OpenAI has no such headers, so they are absent.)
_NAMES = {
    kind: (
        *(f"x-ratelimit-{part}-{kind}" for part in ("limit", "remaining", "reset")),
        *(f"anthropic-ratelimit-{kind}-{part}" for part in ("limit", "remaining", "reset")),
    )
    for kind in ("requests", "tokens", "input-tokens", "output-tokens")
}


_UNSUFFIXED = {
    "requests": ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"),
    "tokens": ("x-tokenlimit-limit", "x-tokenlimit-remaining", "x-tokenlimit-reset"),
}


_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "x-tokenlimit-", "ratelimit")
RATE_LIMIT_PREFIXES = tuple(p.encode() for p in _PREFIXES)  # as raw header names


def read_rate_limits(headers: Mapping[str, str]) -> RateLimitInfo | None:
    """The rate-limit headers of one response, or None when it carries none (most servers
    that are not OpenAI or Anthropic): a cheap check first, as this runs on every reply."""
    raw = getattr(headers, "raw", None)  # httpx.Headers: one pass over the bytes, ~1 µs
    if raw is not None:
        if not any(k.lower().startswith(RATE_LIMIT_PREFIXES) for k, _ in raw):
            return None
    elif not any(k.lower().startswith(_PREFIXES) for k in headers):
        return None
    return parse_rate_limit_headers(headers, datetime.now(UTC))
