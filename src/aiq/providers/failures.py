"""A failed call, classified: ``ProviderError``, and how a reply that is not a 200 becomes
one. The class comes from one table by status, refined by the codes and words of the body
(a spend limit, no quota, a prompt too long); the delay from the server's Retry-After in its
forms; the message from the server's own words, with the API key cut out of them.
"""

from __future__ import annotations

import re
from email.utils import parsedate_to_datetime

import httpx
import orjson

from ..contract import ErrorType
from ..ratelimit_headers import RateLimitInfo, StatedLimit, read_rate_limits

# status -> (error type, retryable, fatal). One table: the worker branches on the flags.
_BY_STATUS: dict[int, tuple[ErrorType, bool, bool]] = {
    400: ("invalid_request", False, False),
    401: ("auth", False, True),
    403: ("auth", False, True),
    404: ("not_found", False, True),
    408: ("timeout", True, False),
    409: ("server", True, False),
    413: ("invalid_request", False, False),
    422: ("invalid_request", False, False),
    425: ("server", True, False),
    429: ("rate_limit", True, False),
    500: ("server", True, False),
    502: ("server", True, False),
    503: ("server", True, False),
    504: ("server", True, False),
    529: ("server", True, False),
}
_FATAL_HINTS: dict[ErrorType, str] = {
    "auth": "check the API key (environment variable {key_env}) and its permissions",
    "not_found": "check --base-url and the model name",
    "quota": "the account is out of quota or credit; add credit or raise the limit, then resume",
    "spend_limit": (
        "the organization or project reached its spend limit: raise it in the provider's "
        "console (or wait for the limit's period to end), then run aiq resume"
    ),
}
# Error codes of a hard spend limit: a 429 that is money, not pacing, and fails again until
# someone raises the limit (OpenAI's spend-limits guide; Anthropic's monthly spend cap, sent as
# a rate_limit_error with ``details.error_code``; ../shared/PROVIDERS.md).
SPEND_LIMIT_CODES = frozenset(
    {
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "enforced_spend_limit_reached",
    }
)
# A provider out of capacity for a tier, not the client over its limit: OpenAI's flex tier
# answers "429 Resource Unavailable" and does not bill it (its flex-processing guide; the code
# is unverified, one client matches ``resource_unavailable``), Groq's flex tier 498
# ``capacity_exceeded`` (its errors page). Backed off, never paced to (PROVIDERS.md).
CAPACITY_CODES = frozenset({"resource_unavailable", "capacity_exceeded"})
_TRY_AGAIN = re.compile(r"try again in (\d+(?:\.\d+)?)\s*(ms|s)\b", re.IGNORECASE)
# OpenAI's and Groq's 429s name the per-minute limit broken ("... on requests per min (RPM):
# Limit 500, Used 500, Requested 1", Groq's "per minute"): a limit enforced without a header
# (Groq's RPM beside the per-day count its headers show) is learned from it, not from 429s.
_STATED = re.compile(
    r"\bon (requests|tokens) per min(?:ute)? \([RT]PM\): Limit (\d[\d,]*)", re.IGNORECASE
)
# A key shorter than this is not looked for in what aiq writes. Real keys are long (OpenAI's
# are 50+ characters, Anthropic's 100+); short ones are the dummies local servers are given
# (`x`, `test`, `null`, `EMPTY`, `ollama`, `content`), no secret, and common enough as words
# that cutting them out would garble the messages they appear in.
MIN_SECRET_CHARS = 8


class ProviderError(Exception):
    """A failed call, classified. The worker acts on ``retryable`` / ``fatal``, not on type."""

    def __init__(
        self,
        error_type: ErrorType,
        message: str,
        *,
        status_code: int | None = None,
        retryable: bool = False,
        fatal: bool = False,
        retry_after_s: float | None = None,
        retry_after_upper: bool = False,
        limits: RateLimitInfo | None = None,
        unreachable: bool = False,
        request_id: str | None = None,
        cut: bool = False,
        stated: StatedLimit | None = None,
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status_code = status_code
        self.retryable = retryable
        self.fatal = fatal
        self.retry_after_s = retry_after_s
        # The delay is a bound, not the window's turn (LiteLLM's router's 60 s): see
        # RateLimiter.rate_limited.
        self.retry_after_upper = retry_after_upper
        self.limits = limits
        # The request never reached a server: refused, unknown host, connect timeout.
        self.unreachable = unreachable
        # The provider's id of the failed call, when its reply named one: for its support,
        # and to follow the job through its retries (the log, the dead letter).
        self.request_id = request_id
        # aiq's own learned timeout cut the call (aiq.timeouts): it has waited a multiple of
        # the model's slowest replies already, so it goes again at once (aiq.outcomes).
        self.cut = cut
        # The per-minute limit a 429's message names (:func:`stated_limit`).
        self.stated = stated


def error_from(
    resp: httpx.Response,
    content: bytes,
    *,
    key_env: str,
    secret: str | None,
    code_keys: tuple[str, ...] = ("code", "type"),
    request_id_header: str = "x-request-id",
) -> ProviderError:
    """The classified ProviderError of a non-200 reply: the provider's message (``secret``
    cut out of it) and code, the class from the one table, a hint for fatal ones, its
    Retry-After and rate-limit headers."""
    message, code = error_message(resp, content, code_keys=code_keys, secret=secret)
    codes = error_codes(content) if resp.status_code in (429, 498) else frozenset()
    error_type, retryable, fatal = classify_status(resp.status_code, message, code, codes=codes)
    if fatal:
        message = f"{message} ({fatal_hint(error_type, key_env)})"
    return ProviderError(
        error_type,
        message,
        status_code=resp.status_code,
        retryable=retryable,
        fatal=fatal,
        retry_after_s=retry_after_s(resp.headers, message),
        retry_after_upper=retry_after_upper(resp.headers),
        limits=read_rate_limits(resp.headers),
        request_id=resp.headers.get(request_id_header),
        stated=stated_limit(message) if resp.status_code == 429 else None,
    )


def error_message(
    resp: httpx.Response,
    content: bytes,
    *,
    code_keys: tuple[str, ...] = ("code", "type"),
    secret: str | None = None,
) -> tuple[str, str | None]:
    """The provider's own message, and its error code (the first of ``code_keys`` that is a
    string), from an ``{"error": {"message": …}}`` body (OpenAI's and Anthropic's shape);
    else the start of the body as text. ``secret`` is cut out of the message."""
    try:
        err = orjson.loads(content).get("error")
        if isinstance(err, dict):
            codes = (err.get(k) for k in code_keys)
            code = next((c for c in codes if isinstance(c, str) and c), None)
            return redact(f"HTTP {resp.status_code}: {err.get('message') or err}", secret), code
    except (orjson.JSONDecodeError, AttributeError):
        pass
    text = body_start(content, secret, 300).strip()
    return f"HTTP {resp.status_code}: {text or resp.reason_phrase}", None


def body_start(content: bytes, secret: str | None, chars: int) -> str:
    """The first ``chars`` characters of a reply body, for a message, ``secret`` cut out
    first (a cut made first could leave the start of the key behind)."""
    # Enough bytes for ``chars`` characters of UTF-8 and a whole key, JSON-escaped, at the end.
    head = content[: 4 * chars + 6 * len(secret or "")]
    return redact(head.decode("utf-8", "replace"), secret)[:chars]


def describe(exc: Exception) -> str:
    """An httpx exception as text. httpx messages never include headers, so the API key
    cannot leak through them."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def secret_of(api_key: str | None) -> str | None:
    """The key as aiq looks for it in what it writes: None if it is too short to be a secret
    (:data:`MIN_SECRET_CHARS`)."""
    return api_key if api_key and len(api_key) >= MIN_SECRET_CHARS else None


def redact(text: str, secret: str | None) -> str:
    """A message aiq writes, with ``secret`` (the API key) cut out, as it is and as JSON
    escapes it. Some servers quote the key back ("Incorrect API key provided: sk-…") or echo
    the request, headers and all, in an error; aiq stores and prints what servers say in
    its messages, and must never store or print the key. Replies are never redacted: they
    are stored as the server sent them."""
    if not secret:
        return text
    escaped = orjson.dumps(secret).decode()[1:-1]
    # The escaped form first: it is the longer, and cutting the key out of it first could
    # leave pieces of it behind.
    for form in (escaped, secret) if escaped != secret else (secret,):
        if form in text:
            text = text.replace(form, "[redacted]")
    return text


def error_codes(content: bytes) -> frozenset[str]:
    """Every code an error body names: ``error.code``, ``error.type`` and Anthropic's
    ``error.details.error_code`` (a spend limit hides there behind ``rate_limit_error``)."""
    try:
        err = orjson.loads(content).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return frozenset()
    if not isinstance(err, dict):
        return frozenset()
    details = err.get("details")
    found = [err.get("code"), err.get("type")]
    if isinstance(details, dict):
        found.append(details.get("error_code"))
    return frozenset(c for c in found if isinstance(c, str) and c)


def classify_status(
    status: int, message: str, code: str | None = None, *, codes: frozenset[str] = frozenset()
) -> tuple[ErrorType, bool, bool]:
    """(error type, retryable, fatal) for an HTTP error status and the provider's message;
    ``codes``, every code the body names (:func:`error_codes`)."""
    lowered = message.lower()
    if codes & SPEND_LIMIT_CODES or code in SPEND_LIMIT_CODES:
        return "spend_limit", False, True
    if code in ("insufficient_quota", "billing_error") or "credit balance is too low" in lowered:
        return "quota", False, True
    if "context_length_exceeded" in (code or "") or "maximum context length" in lowered:
        return "invalid_request", False, False
    if status == 429 and "request too large" in lowered:  # bigger than the whole limit: never fits
        return "invalid_request", False, False
    capacity = codes & CAPACITY_CODES or code in CAPACITY_CODES
    if status == 498 or (status == 429 and (capacity or "resource unavailable" in lowered)):
        return "capacity", True, False
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 500 <= status < 600:
        return "server", True, False
    return "invalid_request", False, False


def fatal_hint(error_type: ErrorType, key_env: str) -> str:
    """What the user should fix after a fatal error of this type."""
    return _FATAL_HINTS.get(error_type, "fix the provider settings").format(key_env=key_env)


def retry_after_s(headers: httpx.Headers, message: str = "") -> float | None:
    """The server's requested delay: retry-after-ms, retry-after (seconds or date), LiteLLM's
    llm_provider-retry-after, or text.

    LiteLLM's proxy relays the headers of the exception behind a 429 with an ``llm_provider-``
    prefix; its router's own rpm/tpm refusal asks for 60 s that way and sends no standard
    header, so without this a client retries at once, again and again.
    """
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    said = _try_again_s(message)
    for name in ("retry-after", "llm_provider-retry-after"):
        value = headers.get(name)
        if value is not None and (waited := _seconds(value, headers)) is not None:
            if said is not None and value.isdigit() and waited - 1 < said <= waited:
                return said  # whole seconds rounded up from the message's (Groq's 1 for 0.2s)
            return waited
    return said


def _try_again_s(message: str) -> float | None:
    """The delay a message asks for ("Please try again in 18.642s", "... in 120ms")."""
    if m := _TRY_AGAIN.search(message):
        seconds = float(m.group(1))
        return seconds / 1000.0 if m.group(2).lower() == "ms" else seconds
    return None


def stated_limit(message: str) -> StatedLimit | None:
    """The per-minute limit a 429's message names (OpenAI's, Groq's), or None."""
    if (m := _STATED.search(message)) is None:
        return None
    limit = int(m.group(2).replace(",", ""))
    return StatedLimit(m.group(1).lower(), limit) if limit > 0 else None


def retry_after_upper(headers: httpx.Headers) -> bool:
    """Whether the delay :func:`retry_after_s` reads is LiteLLM's router's
    ``llm_provider-retry-after``: a fixed 60 s, where its count restarts at the next calendar
    minute, so a bound rather than the window's turn."""
    if "llm_provider-retry-after" not in headers:
        return False
    try:
        float(headers.get("retry-after-ms", ""))
        return False
    except ValueError:
        pass
    standard = headers.get("retry-after")
    return standard is None or _seconds(standard, headers) is None


def _seconds(value: str, headers: httpx.Headers) -> float | None:
    """A ``retry-after`` value in seconds: a number of seconds (LiteLLM sends fractions), or an
    HTTP date taken against the reply's ``date``; None when it is neither."""
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
        date = parsedate_to_datetime(headers.get("date", value))
        return max(0.0, (when - date).total_seconds())
    except (TypeError, ValueError):
        return None
