"""What goes wrong for a request, decided from the server's knobs (the package docstring's
"Refusals" and "Faults"): the refusals a request gets before any model, the permanent rejects,
and the per-attempt faults drawn for the requests the limiter admitted.

Each function takes the ``FakeServer`` whose knobs it reads and answers through its ``_reply``
and ``_note``, so a test may change a knob while the server runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import socket
import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web

from . import anthropic
from .exchange import Fault, _Exchange
from .limits import openai_429
from .replies import _BUILDERS, MODEL, _all_text, error_body, malformed_body

if TYPE_CHECKING:
    from .server import FakeServer

_Drawn = Literal["transient", "500", "503", "reset", "hang", "malformed"]
# The per-attempt faults and the knobs setting their shares, in the order they slice the draw.
_DRAWN: tuple[tuple[_Drawn, str], ...] = (
    ("transient", "transient_rate"),
    ("500", "error_500_rate"),
    ("503", "error_503_rate"),
    ("reset", "reset_rate"),
    ("hang", "hang_rate"),
    ("malformed", "malformed_rate"),
)


# -- refusals: before any model ------------------------------------------------------------------


def refused(
    server: FakeServer, request: web.Request, path: str, body: Any
) -> tuple[int, dict] | None:
    """The error a request gets before it reaches any model (auth, forced, bad URL or JSON)."""
    if path == anthropic.PATH:
        return _refused_anthropic(server, request, body)
    if (status := refusal(server, request)) is not None:
        return status, error_body(status)
    if path not in _BUILDERS:
        return 404, error_body(404, f"Unknown path {path}", code="unknown_url")
    if not isinstance(body, dict):
        return 400, error_body(400, "We could not parse the JSON body.")
    if (status := _model_status(server, body)) is not None:
        return status, error_body(status)
    return None


def _model_status(server: FakeServer, body: dict) -> int | None:
    """The status ``status_for_model`` forces on requests naming this body's model."""
    if not server.status_for_model:
        return None
    return server.status_for_model.get(body.get("model") or MODEL)


def _refused_anthropic(
    server: FakeServer, request: web.Request, body: Any
) -> tuple[int, dict] | None:
    """``refused`` for the Messages API: its auth header, version header and fields."""
    status = anthropic.refusal(request.headers, server.require_key) or server.status_for_all
    if status is not None:
        return status, anthropic.error_body(status)
    if (why := anthropic.invalid(request.headers, body)) is not None:
        return 400, anthropic.error_body(400, why)
    if (status := _model_status(server, body)) is not None:
        return status, anthropic.error_body(status)
    return None


def error_body_for(ex: _Exchange, status: int, message: str | None = None) -> dict:
    """The error body for ``status`` in the dialect of the request."""
    if ex.anthropic:
        return anthropic.error_body(status, message)
    return error_body(status, message)


def refusal(server: FakeServer, request: web.Request) -> int | None:
    """The status every request gets regardless of its body (auth, forced), if any."""
    key = server.require_key
    if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
        return 401
    return server.status_for_all


# -- rejects: permanent, by marker or by the seed ------------------------------------------------


def would_reject(server: FakeServer, prompt: str) -> bool:
    """Whether a request for ``prompt`` gets the permanent 400, from the marker or the rate."""
    marker = server.reject_marker
    if marker is not None and marker in prompt:
        return True
    rate = server.reject_rate
    if rate <= 0:
        return False
    digest = hashlib.sha256(b"%d:reject:" % server.seed + prompt.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def rejects(server: FakeServer, path: str, body: dict, prompt: str) -> bool:
    marker = server.reject_marker
    if marker is not None and marker in _all_text(path, body):
        return True
    return server.reject_rate > 0 and would_reject(server, prompt)


# -- per-attempt faults --------------------------------------------------------------------------


def draw(server: FakeServer, raw: bytes) -> tuple[_Drawn, bytes] | None:
    """The per-attempt fault this attempt draws, if any, and the digest it was drawn from."""
    rates = (
        server.transient_rate,
        server.error_500_rate,
        server.error_503_rate,
        server.reset_rate,
        server.hang_rate,
        server.malformed_rate,
    )
    if not any(rates):  # the usual case, and a benchmark's: no hashing, no lock
        return None
    with server._lock:
        nth = server._seen[raw]
        server._seen[raw] += 1
    digest = hashlib.sha256(b"%d:%d:" % (server.seed, nth) + raw).digest()
    value = int.from_bytes(digest[:8], "big") / 2**64
    edge = 0.0
    for (kind, _), rate in zip(_DRAWN, rates, strict=True):
        edge += rate
        if value < edge:
            return kind, digest
    return None


async def inject(
    server: FakeServer, ex: _Exchange, path: str, kind: _Drawn, digest: bytes
) -> web.Response:
    """Answer with the fault ``kind`` drawn for this attempt."""
    if kind == "transient":  # exactly as before the other faults existed
        if not digest[8] & 1:
            ex.fault = "500"
            return server._reply(ex, 500, error_body_for(ex, 500))
        ex.fault = "rate_limit"
        if ex.anthropic:
            headers = anthropic.retry_after(server.retry_after_s)
            return server._reply(ex, 429, anthropic.error_body(429), headers)
        payload = error_body(429, "Rate limit reached for requests.", code="rate_limit_exceeded")
        payload["error"]["type"] = "requests"
        retry_after = {
            "retry-after": str(math.ceil(server.retry_after_s)),
            "retry-after-ms": str(round(server.retry_after_s * 1000)),
        }
        return server._reply(ex, 429, payload, retry_after)
    ex.fault = kind
    if kind == "reset":
        return reset(server, ex, "reset")
    if kind == "500" or kind == "503":
        # Anthropic says "overloaded" with a 529 where OpenAI sends a 503.
        status = anthropic.OVERLOADED if ex.anthropic and kind == "503" else int(kind)
        return server._reply(ex, status, error_body_for(ex, status))
    payload = server._build(path, ex.body, ex.prompt, ex.cost)
    if kind == "malformed":
        return server._reply(ex, 200, malformed_body(payload, truncate=bool(digest[9] & 1)))
    return await _hang(server, ex, payload)


async def _hang(server: FakeServer, ex: _Exchange, payload: dict) -> web.Response:
    """Say nothing for ``hang_s``, then answer if the client is still waiting."""
    ex.fault = "hang"
    # Logged now: a client that timed out must find its request in the log at once.
    index = server._note(ex, 0)
    await asyncio.sleep(server.hang_s)
    transport = ex.request.transport
    if index is not None and transport is not None and not transport.is_closing():
        with server._lock:
            server._log[index] = replace(server._log[index], status=200)
    # To a client that is gone, aiohttp fails to write this and drops it as a disconnect.
    return server._reply(ex, 200, payload, note=False)


def reset(server: FakeServer, ex: _Exchange, fault: Fault) -> web.Response:
    """Reset the connection: the client gets no reply at all, and a connection error."""
    ex.fault = fault
    server._note(ex, 0)
    transport = ex.request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Linger 0 makes the close send RST: a reset, not a polite end of stream.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    # aiohttp cannot write this to the aborted transport and drops it as a client disconnect.
    return web.Response(status=500)


def outage(server: FakeServer, ex: _Exchange) -> web.Response:
    if server.outage_fault == "reset":
        return reset(server, ex, "outage")
    ex.fault = "outage"
    status = anthropic.OVERLOADED if ex.anthropic else 503
    return server._reply(ex, status, error_body_for(ex, status))


def rate_limited(
    server: FakeServer, ex: _Exchange, kind: str, wait_s: float | None
) -> web.Response:
    """429 with OpenAI's message for the ``kind`` of limit broken and the wait it needs."""
    ex.fault = "rate_limit"
    limit = server.rpm if kind == "requests" else server.tpm
    if ex.anthropic:
        return server._reply(ex, 429, *anthropic.rate_limited(kind, limit, wait_s))
    model = (ex.body.get("model") if isinstance(ex.body, dict) else None) or MODEL
    payload, retry = openai_429(
        kind,
        limit=limit,
        used=server._limiter.minute.used(kind),
        model=model,
        requested=1 if kind == "requests" else ex.tokens,
        wait_s=wait_s,
    )
    return server._reply(ex, 429, payload, retry)
