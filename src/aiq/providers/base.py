"""What every provider returns: a Reply, or a ProviderError that says what to do about it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx
import orjson

from ..contract import ErrorType
from ..ratelimit_headers import (
    RATE_LIMIT_PREFIXES,
    RateLimitInfo,
    parse_rate_limit_headers,
    read_rate_limits,
)
from ..stops import Stop
from ..usage import Usage

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
_TRY_AGAIN = re.compile(r"try again in (\d+(?:\.\d+)?)\s*(ms|s)\b", re.IGNORECASE)
# A key shorter than this is not looked for in what aiq writes. Real keys are long (OpenAI's
# are 50+ characters, Anthropic's 100+); short ones are the dummies local servers are given
# (`x`, `test`, `null`, `EMPTY`, `ollama`, `content`), no secret, and common enough as words
# that cutting them out would garble the messages they appear in.
MIN_SECRET_CHARS = 8


@dataclass(slots=True)  # not frozen: that costs ~0.5 µs a reply (bench/README, "Pipeline")
class Reply:
    """A successful call: the raw body as received, plus what the store keeps about it."""

    status_code: int
    body: bytes
    request_id: str | None
    tokens_in: int
    tokens_out: int
    limits: RateLimitInfo | None = None  # the server's rate-limit headers, if it sent any
    # Its usage by kind (aiq.usage), priced kind by kind. None: the reply's usage was missing
    # or unusable (not counts), so its cost is unknown; tokens_in and tokens_out are then 0.
    usage: Usage | None = None
    stop: Stop | None = None  # how it stopped short (max_tokens, a content filter); aiq.stops
    # The prompt tokens the provider's input-token limit counts, when not all of them
    # (Anthropic's ITPM leaves out cache reads); None: tokens_in.
    limited_in: int | None = None

    @classmethod
    def of(
        cls,
        body: bytes,
        request_id: str | None,
        usage: Usage | None,
        limits: RateLimitInfo | None,
        stop: Stop | None = None,
        limited_in: int | None = None,
    ) -> Reply:
        """A 200 reply with its usage, unusable or not."""
        if usage is None:
            return cls(200, body, request_id, 0, 0, limits, None, stop, None)
        return cls(
            200, body, request_id, usage.tokens_in, usage.tokens_out, limits, usage, stop,
            limited_in,
        )  # fmt: skip


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


class Provider(Protocol):
    """Sends one request body to an endpoint; returns a Reply or raises ProviderError."""

    async def send(self, endpoint: str, body: bytes) -> Reply: ...


class Post:
    """POST requests to one URL with fixed headers, built as ``httpx.Request("POST", url,
    headers=headers, content=body)`` builds them (same headers, case and order), in a third
    of its time: ~10 µs a request, 3x that at 500 requests/s (bench/README.md, "CPU").

    Given a stream, httpx adds no header of its own and renormalises none, so the Host
    header is added once here and only Content-Length per request. Headers that would make
    httpx place its own differently (a Host, Content-Length or Transfer-Encoding of the
    caller's), or an empty body, take httpx's own way.
    """

    __slots__ = ("_extensions", "_headers", "_with_host", "url")

    def __init__(self, url: httpx.URL, headers: httpx.Headers, extensions: dict[str, Any]) -> None:
        self.url = url
        self._headers = headers
        self._extensions = extensions
        own = any(name in headers for name in ("host", "content-length", "transfer-encoding"))
        self._with_host = None if own else httpx.Headers([(b"Host", url.netloc), *headers.raw])

    def request(self, body: bytes) -> httpx.Request:
        """The request that sends ``body``, already read (``content`` is set)."""
        if not body or self._with_host is None:
            return httpx.Request(
                "POST", self.url, headers=self._headers, content=body, extensions=self._extensions
            )
        request = httpx.Request(
            "POST",
            self.url,
            headers=self._with_host,
            stream=httpx.ByteStream(body),
            extensions=self._extensions,
        )
        request.headers["Content-Length"] = str(len(body))
        request.read()
        return request


async def exchange(
    transport: httpx.AsyncBaseTransport, request: httpx.Request, *, base: str
) -> tuple[httpx.Response, bytes]:
    """Send ``request`` and read the whole reply, as the server sent it; every transport
    failure is raised as a classified ProviderError. ``base`` is the base URL, for messages."""
    try:
        resp = await transport.handle_async_request(request)
        try:
            stream = resp.stream
            if isinstance(stream, httpx.ByteStream):
                content = _read(resp, stream)
            else:
                content = await resp.aread()
        except BaseException:
            await resp.aclose()  # reading it whole closes it; only a failed read leaves it open
            raise
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        # Nothing answered at that address: name it, since a run may stop on this alone.
        message = f"cannot reach {request.url} ({describe(exc)})"
        error_type: ErrorType = (
            "timeout" if isinstance(exc, httpx.TimeoutException) else "connection"
        )
        raise ProviderError(error_type, message, retryable=True, unreachable=True) from None
    except httpx.TimeoutException as exc:
        raise ProviderError("timeout", describe(exc), retryable=True) from None
    except httpx.UnsupportedProtocol as exc:  # no retry can fix the base URL
        message = f"{describe(exc)} (check --base-url: {base!r})"
        raise ProviderError("connection", message, fatal=True) from None
    except httpx.TransportError as exc:
        raise ProviderError("connection", describe(exc), retryable=True) from None
    except httpx.DecodingError as exc:  # a reply that claims gzip but is not
        message = f"undecodable reply: {describe(exc)}"
        raise ProviderError("bad_response", message, retryable=True) from None
    return resp, content


def _read(resp: httpx.Response, stream: httpx.ByteStream) -> bytes:
    """The body of a reply already in memory (AiohttpTransport's, MockTransport's), as
    ``aread`` gives it: with no Content-Encoding there is nothing to decode, and httpx's
    decoders, chunkers and context managers cost ~40 µs a reply at 500 replies a second
    (bench/README.md, "CPU"); an encoded body is decoded by httpx, in one sync pass. Callers
    use the bytes returned, not ``resp.content``."""
    if any(key.lower() == b"content-encoding" for key, _ in resp.headers.raw):
        return resp.read()
    return b"".join(stream)


def error_from(
    resp: httpx.Response,
    content: bytes,
    *,
    key_env: str,
    secret: str | None,
    code_keys: tuple[str, ...] = ("code", "type"),
) -> ProviderError:
    """The classified ProviderError of a non-200 reply: the provider's message (``secret``
    cut out of it) and code, the class from the one table, a hint for fatal ones, its
    Retry-After and rate-limit headers."""
    message, code = error_message(resp, content, code_keys=code_keys, secret=secret)
    codes = error_codes(content) if resp.status_code == 429 else frozenset()
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
    )


def reply_headers(
    headers: httpx.Headers, id_name: bytes
) -> tuple[str | None, RateLimitInfo | None]:
    """A reply's request id (the ``id_name`` header, lower case) and its rate-limit headers,
    in one pass over the raw headers: this runs on every reply. The rate-limit ones are
    gathered as they pass, so they are parsed from a small dict rather than looked up one by
    one in ``httpx.Headers`` (each lookup a scan of every header: ~50 µs a reply at 500
    replies a second, bench/README.md "CPU")."""
    request_id = None
    limits_found: dict[str, str] | None = None
    encoding = headers.encoding  # a property: read once, not twice a header
    for key, value in headers.raw:
        key = key.lower()
        if key == id_name:
            request_id = value.decode("latin-1")
        elif key.startswith(RATE_LIMIT_PREFIXES):
            if limits_found is None:
                limits_found = {}
            name, text = key.decode(encoding), value.decode(encoding)
            # Repeated, they read as httpx.Headers.get reads them: joined by commas.
            limits_found[name] = f"{limits_found[name]}, {text}" if name in limits_found else text
    if limits_found is None:
        return request_id, None
    return request_id, parse_rate_limit_headers(limits_found, datetime.now(UTC))


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
    for name in ("retry-after", "llm_provider-retry-after"):
        value = headers.get(name)
        if value is not None and (waited := _seconds(value, headers)) is not None:
            return waited
    if m := _TRY_AGAIN.search(message):
        seconds = float(m.group(1))
        return seconds / 1000.0 if m.group(2).lower() == "ms" else seconds
    return None


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
