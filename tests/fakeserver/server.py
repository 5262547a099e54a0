"""The fake server itself: an aiohttp app in a background thread with its own event loop, that
reads its knobs on every request and answers through the package's replies, limits, modes and
faults (the knobs are described in the package docstring, ``fakeserver/__init__.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

import orjson
from aiohttp import web

from . import anthropic, faults
from .batches import Batches
from .exchange import LoggedRequest, _Exchange, most_in_window
from .limits import _RateLimiter
from .message_batches import MessageBatches
from .modes import Cost, Mode
from .replies import (
    _BUILDERS,
    MODEL,
    Stop,
    _add_template,
    _all_text,
    _cache_and_reason,
    _count,
    _tokens,
    error_body,
    message_reply,
    models_page,
    prompt_of,
    reply_text,
    request_tokens,
    stop_for,
    stopped_short,
)

BACKLOG = 2048  # uvicorn's default (uvicorn/config.py, Config(backlog=2048); `--backlog`)


class FakeServer:
    """An OpenAI-compatible server in a background thread with its own event loop.

    Use it as a context manager; ``base_url`` ends in ``/v1`` like ``OPENAI_BASE_URL``. The knobs
    are described in the package docstring (``fakeserver/__init__.py``).
    """

    def __init__(
        self,
        *,
        reject_marker: str | None = "FAIL_PERMANENT",
        cut_off_marker: str | None = "CUT_OFF",
        thinking_marker: str | None = "THINKS_TOO_LONG",
        filter_marker: str | None = "FILTER_ME",
        transient_rate: float = 0.0,
        latency_s: float = 0.0,
        status_for_all: int | None = None,
        status_for_model: dict[str, int] | None = None,
        require_key: str | None = None,
        retry_after_s: float = 0.0,
        seed: int = 0,
        port: int = 0,
        record: bool = True,
        rpm: int | None = None,
        tpm: int | None = None,
        limit_window_s: float = 60.0,
        reject_rate: float = 0.0,
        error_500_rate: float = 0.0,
        error_503_rate: float = 0.0,
        reset_rate: float = 0.0,
        hang_rate: float = 0.0,
        hang_s: float = 30.0,
        malformed_rate: float = 0.0,
        outage_until: float | None = None,
        outage_fault: Literal["503", "reset"] = "503",
        max_parallel: int | None = None,
        limit_mode: Mode | None = None,
        limit_clock: Callable[[], float] = time.time,
        cached_tokens: int = 0,
        reasoning_tokens: int = 0,
        usage_patches: dict[str, dict[str, Any]] | None = None,
        reply_tokens: int | None = None,
        chat_template: tuple[int, int] | None = None,
    ) -> None:
        self.reject_marker = reject_marker
        self.cut_off_marker = cut_off_marker
        self.thinking_marker = thinking_marker
        self.filter_marker = filter_marker
        self.transient_rate = transient_rate
        self.latency_s = latency_s
        self.status_for_all = status_for_all
        self.status_for_model = dict(status_for_model or {})
        self.require_key = require_key
        self.retry_after_s = retry_after_s
        self.seed = seed
        self.port = port
        self.rpm = rpm
        self.tpm = tpm
        self.limit_window_s = limit_window_s
        self.reject_rate = reject_rate
        self.error_500_rate = error_500_rate
        self.error_503_rate = error_503_rate
        self.reset_rate = reset_rate
        self.hang_rate = hang_rate
        self.hang_s = hang_s
        self.malformed_rate = malformed_rate
        self.outage_until = outage_until
        self.outage_fault = outage_fault
        self.max_parallel = max_parallel
        self.limit_mode = limit_mode
        self.limit_clock = limit_clock
        self.cached_tokens = cached_tokens
        self.reasoning_tokens = reasoning_tokens
        self.usage_patches = usage_patches or {}
        self.reply_tokens = reply_tokens
        self.chat_template = chat_template
        self.max_in_flight = 0
        self._in_flight = 0
        self._check_knobs()
        self._record = record
        self._lock = threading.Lock()
        self._log: list[LoggedRequest] = []
        self._cached: set[str] = set()  # Anthropic prompt-cache prefixes written so far
        self._seen: Counter[bytes] = Counter()  # body -> times drawn for, so retries redraw
        self._limiter = _RateLimiter()
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.batches = Batches(self)  # the Files and Batches API, with its own knobs
        self.message_batches = MessageBatches(self)  # Anthropic's Message Batches, likewise

    def _check_knobs(self) -> None:
        """Refuse settings that would make a test silently meaningless."""
        for name in ("reject_rate", *(knob for _, knob in faults._DRAWN)):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if not 0.0 < self.limit_window_s <= 60.0:
            raise ValueError("limit_window_s must be within (0, 60]")
        for name in ("rpm", "tpm"):
            limit = getattr(self, name)
            if limit is not None and limit * self.limit_window_s / 60 < 1:
                raise ValueError(f"{name} allows less than one per {self.limit_window_s} s window")
        if self.limit_mode is not None and (self.rpm is not None or self.tpm is not None):
            raise ValueError("with a limit_mode, set its limits on the mode, not rpm / tpm")
        if self.outage_fault not in ("503", "reset"):
            raise ValueError('outage_fault must be "503" or "reset"')

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeServer:
        """Start serving in a daemon thread; return once the port is bound."""
        self._thread = threading.Thread(target=self._thread_main, name="fakeserver", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=10) or self._error is not None:
            raise RuntimeError("fake server failed to start") from self._error
        return self

    def stop(self) -> None:
        """Stop serving and join the thread. Requests still hanging are abandoned, not answered."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self.serve())
        except BaseException as exc:  # surfaced by start() instead of dying silently
            self._error = exc
            self._ready.set()

    async def serve(self, on_ready: Callable[[int], object] | None = None) -> None:
        """Serve until :meth:`stop` (or cancellation); ``on_ready(port)`` once listening."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        slots = self.limit_mode.slots if self.limit_mode is not None else None
        slots = slots or self.max_parallel
        self._slots = asyncio.Semaphore(slots) if slots else None
        app = web.Application(client_max_size=1024**3)  # batch input files of up to 200 MB
        self.batches.routes(app)  # before the catch-all POST
        self.message_batches.routes(app)
        app.router.add_post("/v1/{endpoint:.*}", self._handle_post)
        app.router.add_get("/v1/models", self._handle_models)
        # No access log: it costs more than the handler at benchmark rates. A short shutdown
        # timeout: a test ending while a slow request is still sleeping must not wait on it.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        try:
            # The accept queue of the servers modelled: uvicorn's default backlog (vLLM's and
            # LiteLLM proxy's server), not aiohttp's 128. At 128, 400 connections opened at once
            # overflowed it whenever the accept loop lagged (a bench process with earlier rows'
            # garbage): the SYNs dropped were sent again after Linux's 1 s, a straggling tail.
            site = web.TCPSite(runner, "127.0.0.1", self.port, backlog=BACKLOG)
            await site.start()
            self.port = runner.addresses[0][1]
            if on_ready is not None:
                on_ready(self.port)
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    # -- what tests read and control ---------------------------------------------------------

    @property
    def requests(self) -> list[LoggedRequest]:
        """A snapshot of every request settled so far, in that order."""
        with self._lock:
            return list(self._log)

    def count_for(self, prompt: str) -> int:
        """How many requests (any status, resets and hangs too) carried ``prompt``."""
        with self._lock:
            return sum(1 for r in self._log if r.prompt == prompt)

    @staticmethod
    def reply_text(prompt: str) -> str:
        """The text a successful completion for ``prompt`` holds."""
        return reply_text(prompt)

    def would_reject(self, prompt: str) -> bool:
        """Whether a request for ``prompt`` gets the permanent 400, from the marker or the rate.

        (The marker is also looked for in other messages, e.g. a system prompt, which this
        cannot see.)
        """
        return faults.would_reject(self, prompt)

    def start_outage(self, seconds: float) -> None:
        """Be down for the next ``seconds``: see ``outage_until``; set it to None to end early."""
        self.outage_until = time.monotonic() + seconds

    def max_accepted_in_window(self, window_s: float) -> int:
        """The most requests the rate limiter admitted within any ``window_s`` seconds, from the
        log (so only with ``record``). With no limits set, every request that reached the model
        counts."""
        return self._max_in_window(window_s, lambda r: 1)

    def max_tokens_in_window(self, window_s: float) -> int:
        """The most tokens (:func:`request_tokens`) admitted within any ``window_s`` seconds."""
        return self._max_in_window(window_s, lambda r: r.tokens)

    def _max_in_window(self, window_s: float, weight: Callable[[LoggedRequest], int]) -> int:
        with self._lock:
            events = sorted((r.received, weight(r)) for r in self._log if r.counted)
        return most_in_window(events, window_s)

    # -- handlers ----------------------------------------------------------------------------

    async def _handle_post(self, request: web.Request) -> web.StreamResponse:
        """Answer one POST: outage, refusals, rate limit, latency, then the request's fate."""
        raw = await request.read()
        path = request.path
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        ex = _Exchange(request, raw, body, prompt_of(path, body), time.monotonic())
        ex.anthropic = path == anthropic.PATH
        mode = self.limit_mode
        if self._record or self.tpm is not None or mode is not None:  # a benchmark skips the count
            ex.tokens = request_tokens(path, body)
        if (until := self.outage_until) is not None and ex.received < until:
            return faults.outage(self, ex)
        refused = faults.refused(self, request, path, body)
        if refused is None:
            if mode is not None:
                cost = Cost(
                    tokens=ex.tokens,
                    input_tokens=_tokens(_all_text(path, body)),
                    model=(body.get("model") if isinstance(body, dict) else None) or MODEL,
                    cached_tokens=anthropic.cached_tokens(body, self._cached, _tokens),
                    max_tokens=(_count(body.get("max_tokens")) or 0) if ex.anthropic else 0,
                )
                now = self.limit_clock()
                if (no := mode.admit(now, cost)) is not None:
                    ex.fault = "rate_limit"
                    return self._reply(ex, 429, no.payload, no.headers)
                ex.admitted_at, ex.cost = now, cost
                if mode.reports_at_arrival:
                    ex.limit_headers = mode.headers(now)
            elif self.rpm is not None or self.tpm is not None:
                verdict = self._limiter.judge(
                    ex.received,
                    rpm=self.rpm,
                    tpm=self.tpm,
                    window_s=float(self.limit_window_s),
                    tokens=ex.tokens,
                )
                if verdict is not None:
                    return faults.rate_limited(self, ex, *verdict)
            ex.counted = True
        if mode is None or ex.admitted_at is None:
            return await self._answer(ex, path, body, refused)
        try:
            return await self._answer(ex, path, body, refused)
        finally:
            mode.release(self.limit_clock())  # (a parallel limit counts it done)

    async def _answer(
        self, ex: _Exchange, path: str, body: Any, refused: tuple[int, dict] | None
    ) -> web.StreamResponse:
        """The request's fate once it passed the limits: latency, then its reply or fault."""
        if self.latency_s > 0 or self._slots is not None:
            await self._serve(self.latency_s)
        if refused is not None:
            return self._reply(ex, *refused)
        if faults.rejects(self, path, body, ex.prompt):
            ex.fault = "reject"
            return self._reply(
                ex, 400, faults.error_body_for(ex, 400, "The request was rejected as invalid.")
            )
        drawn = faults.draw(self, ex.raw)
        if drawn is None:
            return self._reply(ex, 200, self._build(path, body, ex.prompt, ex.cost))
        return await faults.inject(self, ex, path, *drawn)

    def batch_reply(self, path: str, body: Any, prompt: str) -> tuple[int, dict]:
        """A batch line's response: the status and body an online call would get, by the
        same markers (a permanent 400 for the reject marker), without faults or limits."""
        if isinstance(body, dict) and faults.rejects(self, path, body, prompt):
            return 400, error_body(400, "The request was rejected as invalid.")
        return 200, self._build(path, body, prompt)

    async def _serve(self, seconds: float) -> None:
        """The model's work on one request: ``seconds``, in one of the mode's slots if any.
        ``max_in_flight`` counts the requests held at once, queued for a slot or served."""
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            async with self._slots or contextlib.nullcontext():
                await asyncio.sleep(seconds)
        finally:
            self._in_flight -= 1

    def _build(self, path: str, body: Any, prompt: str, cost: Cost | None = None) -> dict:
        """The 200 reply to a request; an Anthropic one with its prompt-cache usage. A limit
        mode that counts after the call (generated tokens) is told its usage."""
        if path == anthropic.PATH:
            payload = message_reply(body, prompt, self.reply_tokens)
        else:
            payload = _BUILDERS[path](body, prompt)
        if (stop := self._stop_for(path, body)) is not None:
            stopped_short(path, body, payload, stop)
        if path == anthropic.PATH:
            anthropic.account_cache(payload, body, self._cached, _tokens)
        usage = payload.get("usage")
        if isinstance(usage, dict):
            if self.chat_template is not None and path.endswith("/chat/completions"):
                _add_template(usage, body, *self.chat_template)
            _cache_and_reason(path, usage, self.cached_tokens, self.reasoning_tokens)
            text = _all_text(path, body)
            for marker, fields in self.usage_patches.items():
                if marker in text:
                    usage.update(fields)
        if self.limit_mode is not None:
            self.limit_mode.settle(self.limit_clock(), payload.get("usage") or {}, cost)
        return payload

    def _stop_for(self, path: str, body: Any) -> Stop | None:
        """How the reply to this request stops short, by the markers in its text, if at all."""
        markers: tuple[tuple[Stop, str | None], ...] = (
            ("cut_off", self.cut_off_marker),
            ("thinking", self.thinking_marker),
            ("filter", self.filter_marker),
        )
        return stop_for(markers, path, body)

    # -- replies and the log -----------------------------------------------------------------

    def _reply(
        self,
        ex: _Exchange,
        status: int,
        payload: dict | bytes,
        extra_headers: dict[str, str] | None = None,
        *,
        note: bool = True,
    ) -> web.Response:
        """The JSON reply, with the request id and any rate-limit headers; logged unless told."""
        request_id = "req_" + hashlib.sha256(ex.raw).hexdigest()[:24]
        headers = {"request-id" if ex.anthropic else "x-request-id": request_id}
        if extra_headers:
            headers.update(extra_headers)
        if self.limit_mode is not None:
            headers.update(ex.limit_headers or self.limit_mode.headers(self.limit_clock()))
        elif self.rpm is not None or self.tpm is not None:
            now = time.monotonic()
            if ex.anthropic:
                windows = self._limiter.windows(now, rpm=self.rpm, tpm=self.tpm)
                headers.update(anthropic.rate_limit_headers(windows))
            else:
                headers.update(self._limiter.headers(now, rpm=self.rpm, tpm=self.tpm))
        if note:
            self._note(ex, status)
        return web.Response(
            body=payload if isinstance(payload, bytes) else orjson.dumps(payload),
            status=status,
            headers=headers,
            content_type="application/json",
        )

    async def _handle_models(self, request: web.Request) -> web.Response:
        ex = _Exchange(request, b"", None, "", time.monotonic())
        ex.anthropic = anthropic.VERSION_HEADER in request.headers  # Anthropic's list
        if (until := self.outage_until) is not None and ex.received < until:
            return faults.outage(self, ex)
        if ex.anthropic:
            status = anthropic.refusal(request.headers, self.require_key) or self.status_for_all
            payload: dict = anthropic.error_body(status) if status else anthropic.models_page()
            self._note(ex, status or 200)
            return web.json_response(payload, status=status or 200)
        status = faults.refusal(self, request)
        if status is not None:
            payload = error_body(status)
        else:
            status, payload = 200, models_page()
        self._note(ex, status)
        return web.json_response(payload, status=status)

    def _note(self, ex: _Exchange, status: int) -> int | None:
        """Log ``ex`` settled with ``status``; its index in the log, or None when not recording."""
        if not self._record:
            return None
        entry = LoggedRequest.of(ex, status)
        with self._lock:
            self._log.append(entry)
            return len(self._log) - 1
