"""One request: as the server decides how to answer it (``_Exchange``) and as its log keeps it
(``LoggedRequest``, what tests read from ``FakeServer.requests``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from . import anthropic
from .modes import Cost

Fault = Literal["500", "503", "reset", "hang", "malformed", "rate_limit", "reject", "outage"]


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it. The Authorization value is never kept.

    ``received`` (monotonic) is when it arrived and the rate limiter judged it; ``monotonic`` and
    ``wall`` are when the server settled it: answered, reset, or began to hang. ``status`` is 0
    when the client got no reply: a reset, or a hang whose client was gone by the time it ended
    (a hang the client waited out shows the status it finally got). ``tokens`` is the request's
    TPM cost (:func:`request_tokens`); ``counted`` says it passed the rate limiter, so it counts
    against the windows; ``fault`` names what the server did to it, None for a plain answer.
    ``admitted_at`` is the ``limit_clock`` reading at which a ``limit_mode`` admitted it (None
    without a mode, or when refused): the time the mode's windows count it at.
    """

    monotonic: float
    wall: float
    method: str
    path: str
    body: Any  # parsed JSON, or None when the body was not JSON
    prompt: str
    status: int
    had_authorization: bool
    tokens: int = 0
    fault: Fault | None = None
    received: float = 0.0
    counted: bool = False
    had_api_key: bool = False  # an x-api-key header (Anthropic's auth); its value is never kept
    anthropic_version: str | None = None
    admitted_at: float | None = None

    @classmethod
    def of(cls, ex: _Exchange, status: int) -> LoggedRequest:
        """``ex`` as the log keeps it, settled now with ``status``."""
        request = ex.request
        return cls(
            monotonic=time.monotonic(),
            wall=time.time(),
            method=request.method,
            path=request.path,
            body=ex.body,
            prompt=ex.prompt,
            status=status,
            had_authorization="Authorization" in request.headers,
            had_api_key="x-api-key" in request.headers,
            anthropic_version=request.headers.get(anthropic.VERSION_HEADER),
            tokens=ex.tokens,
            fault=ex.fault,
            received=ex.received,
            counted=ex.counted,
            admitted_at=ex.admitted_at,
        )


def most_in_window(events: list[tuple[float, int]], window_s: float) -> int:
    """The largest total of ``(at, amount)`` events (sorted by ``at``) within any ``window_s``
    seconds."""
    best = total = start = 0
    for admitted, amount in events:
        total += amount
        # The same half-open window, and the same float expression, the limiter uses.
        while events[start][0] <= admitted - window_s:
            total -= events[start][1]
            start += 1
        best = max(best, total)
    return best


@dataclass(slots=True)
class _Exchange:
    """What the handler knows about one request while it decides how to answer."""

    request: web.Request
    raw: bytes
    body: Any
    prompt: str
    received: float
    tokens: int = 0
    counted: bool = False
    fault: Fault | None = None
    anthropic: bool = False  # a Messages API request: checked and answered Anthropic's way
    admitted_at: float | None = None
    cost: Cost | None = None  # what a limit mode admitted it at
    limit_headers: dict[str, str] | None = None  # a mode's headers as of its arrival
