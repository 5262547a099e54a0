"""The HTTP stack: httpx's request and response model over one shared aiohttp connection pool.

Providers build an ``httpx.Request`` and hand it to an ``httpx.AsyncBaseTransport``, so tests
can pass ``httpx.MockTransport(handler)``. In a run that transport is :class:`AiohttpTransport`,
a minimal ``httpx.AsyncBaseTransport`` over one ``aiohttp.ClientSession``. Providers skip
``httpx.AsyncClient``: it cost more per request than the rest of a job together (bench/README.md,
"Pipeline"). Why this transport (figures in bench/README.md, from ``bench/http_stack.py``):

- httpx's own pool is ~7x slower at 64 connections (encode/httpcore#1035), so it is out.
- The ``httpx-aiohttp`` package is about as fast as this transport (this one is a few percent
  cheaper per request: no streaming wrapper, no per-request ``ClientTimeout``), so speed did
  not decide between them. Errors did: httpx-aiohttp 0.2 reports a refused connection or a
  server hang-up as ``httpx.ConnectTimeout`` and lets ``aiohttp.ClientResponseError`` escape
  for a malformed reply. This transport raises the exception class httpx's own transport raises
  in each case (tests/test_fakeserver.py checks them side by side), so a provider classifies
  errors the same over either, and no aiohttp exception ever reaches it.
- What remains between this and a bare aiohttp loop is httpx's request/response model (building
  the ``Request``, reading the body through its decoders), not the transport.

Not supported, on purpose: HTTP/2, proxies from the environment (nothing below the CLI reads the
environment), streaming request or response bodies. One client belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import aiohttp
import httpx

__all__ = ["ON_WIRE", "AiohttpTransport", "make_client"]

# New connections opened at once, at most. A burst of thousands of requests opens as many
# connections in one instant, and a server's accept queue holds far fewer (aiohttp's 128,
# nginx's 511, uvicorn's 2,048): a connection past it has its SYN dropped and tried again a
# second later (then 3 s, 7 s). A 6,000-request burst at a uvicorn-sized queue sent nothing
# for a second, twice (bench/README.md, "Session 27"). 128: no server's queue is shorter.
CONNECTING = 128

# Called in the task sending a request: with False as the request waits for a connection,
# with True once it has one and goes. A call's learned timeout (aiq.timed_calls) counts from
# then, not from its wait for a connection, which in a burst of thousands is seconds long
# (CONNECTING at a time): counted from the start, 607 calls of a 6,000 burst were cut
# before they went. Other transports never call it; the timeout then counts from the start.
ON_WIRE: ContextVar[Callable[[bool], None] | None] = ContextVar("aiq_on_wire", default=None)

# First match wins, so subclasses come before their bases: aiohttp's timeouts are also
# ClientConnectionErrors, and its connector errors are also ClientOSErrors.
_ERROR_MAP: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),  # a malformed status line/headers
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.ClientConnectionError, httpx.ReadError),  # a reset or close mid-exchange
    (TimeoutError, httpx.ReadTimeout),  # aiohttp's total timeout, unset here but be safe
    (aiohttp.ClientError, httpx.TransportError),
)


def _map_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    for source, target in _ERROR_MAP:
        if isinstance(exc, source):
            # aiohttp's messages name host and port at most; headers never reach them.
            message = str(exc) or type(exc).__name__
            if isinstance(exc, aiohttp.ClientConnectorError):
                message = _connect_failure(exc) or message
            return target(message, request=request)
    raise TypeError(f"not an aiohttp error: {exc!r}")  # pragma: no cover


def _connect_failure(exc: aiohttp.ClientConnectorError) -> str | None:
    """ "Cannot connect to host h:p: Connection refused": asyncio words a refusal "Connect
    call failed", which does not say why; the errno does. None for TLS errors, whose errno
    is no socket error's."""
    errno = exc.os_error.errno
    if isinstance(exc, aiohttp.ClientSSLError) or not isinstance(errno, int) or errno <= 0:
        return None
    return f"Cannot connect to host {exc.host}:{exc.port}: {os.strerror(errno)}"


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connection pool, opening at most ``CONNECTING`` connections at a time, and
    telling the sender (``ON_WIRE``) when its request has its connection."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._opening = asyncio.Semaphore(CONNECTING)

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        # (Inside aiohttp's `connect` timeout, which aiq leaves unset (pool=None); the
        # socket's own connect timeout starts once it is this one's turn.)
        async with self._opening:
            return await super()._create_connection(*args, **kwargs)

    async def connect(self, *args: Any, **kwargs: Any) -> Any:
        on_wire = ON_WIRE.get()
        if on_wire is not None:
            on_wire(False)
        connection = await super().connect(*args, **kwargs)
        if on_wire is not None:
            on_wire(True)
        return connection


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends every request through one shared aiohttp session.

    Response bodies are read whole and handed to httpx undecoded (``auto_decompress=False``):
    httpx advertised the encodings in ``Accept-Encoding``, so httpx decodes them, exactly as
    with its own transport. Per-request timeouts from httpx (``client.post(..., timeout=...)``)
    are honoured: connect → ``sock_connect``, read → ``sock_read``, pool → ``connect``
    (aiohttp's time to acquire a connection). aiohttp has no write timeout.
    """

    def __init__(self, *, max_connections: int) -> None:
        if max_connections < 1:  # aiohttp would read 0 as "no limit"
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple[Any, Any, Any], aiohttp.ClientTimeout] = {}

    def _open_session(self) -> aiohttp.ClientSession:
        # Created on first use, not in __init__: aiohttp binds a session to the running loop,
        # and make_client() may be called before there is one.
        connector = _Connector(limit=self._max_connections, limit_per_host=0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # httpx's client keeps cookies; one jar is enough
            timeout=aiohttp.ClientTimeout(total=None),
        )
        return self._session

    def _timeout(self, request: httpx.Request) -> aiohttp.ClientTimeout:
        timeout = request.extensions.get("timeout") or {}
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        cached = self._timeouts.get(key)
        if cached is None:
            # Requests carry the same few values, so building one per request is waste; the
            # bound only matters if a caller varies its timeout on every request.
            if len(self._timeouts) >= 32:
                self._timeouts.clear()
            cached = aiohttp.ClientTimeout(
                total=None, sock_connect=key[0], sock_read=key[1], connect=key[2]
            )
            self._timeouts[key] = cached
        return cached

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return the response with its body already read."""
        session = self._session or self._open_session()
        try:
            content = request.content
        except httpx.RequestNotRead:
            content = await request.aread()
        try:
            async with session.request(
                request.method,
                str(request.url),  # already percent-encoded by httpx; yarl keeps it so
                headers=request.headers.multi_items(),
                data=content or None,
                allow_redirects=False,  # httpx follows redirects itself when asked to
                timeout=self._timeout(request),
            ) as resp:
                body = await resp.read()
                status, raw_headers, reason = resp.status, resp.raw_headers, resp.reason
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _map_error(exc, request) from exc
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if reason:
            extensions["reason_phrase"] = reason.encode("ascii", "replace")
        return httpx.Response(
            status,
            headers=raw_headers,
            stream=httpx.ByteStream(body),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        """Close the aiohttp session and every pooled connection."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def make_client(
    *, max_connections: int, connect_timeout_s: float, read_timeout_s: float
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` over :class:`AiohttpTransport`; close it with ``aclose()``.

    For code that wants httpx's client API over this pool (benchmarks, scripts); aiq's own
    providers call the transport directly.

    ``max_connections`` bounds the pool (give it the worker concurrency). There is no pool
    timeout: the worker pool already bounds how many requests wait, so waiting for a free
    connection is queueing, not a failure.
    """
    return httpx.AsyncClient(
        transport=AiohttpTransport(max_connections=max_connections),
        timeout=httpx.Timeout(
            connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s, pool=None
        ),
        follow_redirects=False,
        trust_env=False,  # proxies, netrc: nothing below the CLI reads the environment
    )
