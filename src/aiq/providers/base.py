"""What every provider returns: a Reply, or a ProviderError that says what to do about it.

The classification of failures lives in ``failures.py``; its public names are re-exported
here, where the providers and their callers have always found them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from ..contract import ErrorType
from ..ratelimit_headers import (
    RATE_LIMIT_PREFIXES,
    RateLimitInfo,
    parse_rate_limit_headers,
)
from ..stops import Stop
from ..usage import Usage
from .failures import (
    MIN_SECRET_CHARS,
    SPEND_LIMIT_CODES,
    ProviderError,
    body_start,
    classify_status,
    describe,
    error_codes,
    error_from,
    error_message,
    fatal_hint,
    redact,
    retry_after_s,
    retry_after_upper,
    secret_of,
)

__all__ = [
    "MIN_SECRET_CHARS",
    "SPEND_LIMIT_CODES",
    "Post",
    "Provider",
    "ProviderError",
    "Reply",
    "body_start",
    "classify_status",
    "describe",
    "error_codes",
    "error_from",
    "error_message",
    "exchange",
    "fatal_hint",
    "redact",
    "reply_headers",
    "retry_after_s",
    "retry_after_upper",
    "secret_of",
]


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
    # The service tier the reply says served it (OpenAI's ``service_tier``: ``default``,
    # ``flex``, ``priority``), which is what it is billed at; None: not said.
    tier: str | None = None

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
