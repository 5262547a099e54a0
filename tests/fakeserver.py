"""A real OpenAI-compatible HTTP server on 127.0.0.1, for tests and benchmarks.

From a sync pytest test::

    with FakeServer(transient_rate=0.2) as server:
        run_aiq("--base-url", server.base_url, ...)
        assert server.count_for("hello") == 1

As a process, for benchmarks (prints ``READY <port>`` once it listens, serves until killed)::

    python tests/fakeserver.py --port 0 --latency 0

It deliberately imports nothing from ``aiq``: it is the oracle aiq is tested against, so a bug in
aiq's own reply builders (``aiq.providers.simulated``) must not be able to agree with itself here.
``tests/test_fakeserver.py`` pins both to the same truth, the official ``openai`` response types.

Behaviour knobs are plain attributes, read on every request, so a test may change them while the
server runs (e.g. set ``reject_marker = None`` and replay the dead letters):

- ``reject_marker``: a request whose text contains it gets 400 ``invalid_request_error``.
- ``transient_rate``: the fraction of requests answered 500 or 429 (+ ``retry-after``). The draw
  hashes the seed, the request body and how often that body was seen before, so a run is
  reproducible and a retried request gets a fresh draw.
- ``latency_s``: seconds slept before answering (no sleep at all when 0, for throughput).
- ``status_for_all``: answer every request with this status and OpenAI's error body for it
  (401 bad key, 403, 404 unknown model, 429 quota, 500, 503).
- ``require_key``: 401 unless ``Authorization: Bearer <require_key>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

MODEL = "gpt-4o-mini"
EMBEDDING_DIM = 8

# OpenAI's error bodies for the statuses a test can force with ``status_for_all``.
_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("invalid_request_error", "Invalid request.", None),
    401: (
        "invalid_request_error",
        "Incorrect API key provided. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "invalid_api_key",
    ),
    403: ("invalid_request_error", "You are not allowed to use this model.", None),
    404: (
        "invalid_request_error",
        "The model does not exist or you do not have access to it.",
        "model_not_found",
    ),
    429: (
        "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
        "insufficient_quota",
    ),
    500: ("server_error", "The server had an error while processing your request.", None),
    503: ("server_error", "The engine is currently overloaded, please try again later.", None),
}


def error_body(status: int, message: str | None = None, *, code: str | None = None) -> dict:
    """OpenAI's error body ``{"error": {message, type, param, code}}`` for ``status``."""
    err_type, default_message, default_code = _ERRORS.get(status, ("api_error", "Error.", None))
    return {
        "error": {
            "message": message or default_message,
            "type": err_type,
            "param": None,
            "code": code or default_code,
        }
    }


def reply_text(prompt: str) -> str:
    """The completion text the server gives for ``prompt``: deterministic and distinct."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return f"Fake reply {digest} to a prompt of {len(prompt)} characters."


def _tokens(text: str) -> int:
    # The usual rule of thumb, ~4 characters per token; the exact figure does not matter.
    return max(1, math.ceil(len(text) / 4))


def _content_text(content: Any) -> str:
    """The text of a chat message's content: a string, or a list of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _as_text(value: Any) -> str:
    """A completions ``prompt`` or embeddings ``input``: a string or a list of strings."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(v for v in value if isinstance(v, str))
    return ""


def prompt_of(path: str, body: Any) -> str:
    """The prompt a request is about: the last user message (chat), ``prompt`` or ``input``."""
    if not isinstance(body, dict):
        return ""
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if isinstance(messages, list):
            for message in reversed(messages):
                if isinstance(message, dict) and message.get("role") == "user":
                    return _content_text(message.get("content"))
        return ""
    if path.endswith("/embeddings"):
        return _as_text(body.get("input"))
    return _as_text(body.get("prompt"))


def _all_text(path: str, body: Any) -> str:
    """Every piece of text in the request, so a reject marker in a system message counts too."""
    if path.endswith("/chat/completions") and isinstance(body, dict):
        messages = body.get("messages")
        if isinstance(messages, list):
            return "\n".join(
                _content_text(m.get("content")) for m in messages if isinstance(m, dict)
            )
    return prompt_of(path, body)


def _usage(prompt: str, completion: str | None) -> dict:
    prompt_tokens = _tokens(prompt)
    completion_tokens = _tokens(completion) if completion is not None else 0
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens}
    if completion is not None:
        usage["completion_tokens"] = completion_tokens
    return usage


def _response_id(prefix: str, prompt: str) -> str:
    return prefix + hashlib.sha256(prompt.encode()).hexdigest()[:24]


def chat_reply(body: dict, prompt: str) -> dict:
    """A ChatCompletion answering ``prompt``."""
    text = reply_text(prompt)
    return {
        "id": _response_id("chatcmpl-", prompt),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(_all_text("/chat/completions", body), text),
        "system_fingerprint": "fp_fake",
    }


def completion_reply(body: dict, prompt: str) -> dict:
    """A (legacy) Completion answering ``prompt``."""
    text = reply_text(prompt)
    return {
        "id": _response_id("cmpl-", prompt),
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model") or "gpt-3.5-turbo-instruct",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
        "usage": _usage(prompt, text),
    }


def embedding_reply(body: dict, prompt: str) -> dict:
    """A CreateEmbeddingResponse: one short deterministic vector per input."""
    raw = body.get("input")
    inputs = raw if isinstance(raw, list) else [raw]
    data = []
    for i, item in enumerate(inputs):
        digest = hashlib.sha256(str(item).encode()).digest()
        vector = [round(b / 255 - 0.5, 6) for b in digest[:EMBEDDING_DIM]]
        data.append({"object": "embedding", "index": i, "embedding": vector})
    return {
        "object": "list",
        "data": data,
        "model": body.get("model") or "text-embedding-3-small",
        "usage": _usage(prompt, None),
    }


_BUILDERS = {
    "/v1/chat/completions": chat_reply,
    "/v1/completions": completion_reply,
    "/v1/embeddings": embedding_reply,
}


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it. The Authorization value is never kept."""

    monotonic: float
    wall: float
    method: str
    path: str
    body: Any  # parsed JSON, or None when the body was not JSON
    prompt: str
    status: int
    had_authorization: bool


class FakeServer:
    """An OpenAI-compatible server in a background thread with its own event loop.

    Use it as a context manager; ``base_url`` ends in ``/v1`` like ``OPENAI_BASE_URL``.
    """

    def __init__(
        self,
        *,
        reject_marker: str | None = "FAIL_PERMANENT",
        transient_rate: float = 0.0,
        latency_s: float = 0.0,
        status_for_all: int | None = None,
        require_key: str | None = None,
        retry_after_s: float = 0.0,
        seed: int = 0,
        port: int = 0,
        record: bool = True,
    ) -> None:
        self.reject_marker = reject_marker
        self.transient_rate = transient_rate
        self.latency_s = latency_s
        self.status_for_all = status_for_all
        self.require_key = require_key
        self.retry_after_s = retry_after_s
        self.seed = seed
        self.port = port
        self._record = record
        self._lock = threading.Lock()
        self._log: list[LoggedRequest] = []
        self._seen: Counter[bytes] = Counter()  # body -> times seen, so retries redraw
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

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
        """Stop serving and join the thread."""
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

    async def serve(self, on_ready: Any = None) -> None:
        """Serve until :meth:`stop` (or cancellation); ``on_ready(port)`` once listening."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/{endpoint:.*}", self._handle_post)
        app.router.add_get("/v1/models", self._handle_models)
        # No access log: it costs more than the handler at benchmark rates. A short shutdown
        # timeout: a test ending while a slow request is still sleeping must not wait on it.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", self.port)
            await site.start()
            self.port = runner.addresses[0][1]
            if on_ready is not None:
                on_ready(self.port)
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    # -- what tests read ---------------------------------------------------------------------

    @property
    def requests(self) -> list[LoggedRequest]:
        """A snapshot of every request answered so far, oldest first."""
        with self._lock:
            return list(self._log)

    def count_for(self, prompt: str) -> int:
        """How many requests (any status) carried ``prompt``."""
        with self._lock:
            return sum(1 for r in self._log if r.prompt == prompt)

    @staticmethod
    def reply_text(prompt: str) -> str:
        """The text a successful completion for ``prompt`` holds."""
        return reply_text(prompt)

    # -- handlers ----------------------------------------------------------------------------

    def _refusal(self, request: web.Request) -> int | None:
        """The status every request gets regardless of its body (auth, forced), if any."""
        key = self.require_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return 401
        return self.status_for_all

    def _transient(self, raw: bytes) -> int | None:
        """500 or 429 for a ``transient_rate`` share of requests, else None."""
        rate = self.transient_rate
        if rate <= 0:
            return None
        with self._lock:
            nth = self._seen[raw]
            self._seen[raw] += 1
        digest = hashlib.sha256(b"%d:%d:" % (self.seed, nth) + raw).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        if draw >= rate:
            return None
        return 429 if digest[8] & 1 else 500

    async def _handle_post(self, request: web.Request) -> web.Response:
        raw = await request.read()
        path = request.path
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        prompt = prompt_of(path, body)
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)

        status = self._refusal(request)
        headers = {"x-request-id": "req_" + hashlib.sha256(raw).hexdigest()[:24]}
        builder = _BUILDERS.get(path)
        if status is not None:
            payload = error_body(status)
        elif builder is None:
            status, payload = 404, error_body(404, f"Unknown path {path}", code="unknown_url")
        elif not isinstance(body, dict):
            status, payload = 400, error_body(400, "We could not parse the JSON body.")
        elif self.reject_marker is not None and self.reject_marker in _all_text(path, body):
            status, payload = 400, error_body(400, "The request was rejected as invalid.")
        elif (status := self._transient(raw)) is not None:
            if status == 429:
                headers["retry-after"] = str(math.ceil(self.retry_after_s))
                headers["retry-after-ms"] = str(round(self.retry_after_s * 1000))
                payload = error_body(
                    429, "Rate limit reached for requests.", code="rate_limit_exceeded"
                )
                payload["error"]["type"] = "requests"
            else:
                payload = error_body(500)
        else:
            status, payload = 200, builder(body, prompt)

        self._log_request(request, body, prompt, status)
        return web.Response(
            body=orjson.dumps(payload),
            status=status,
            headers=headers,
            content_type="application/json",
        )

    async def _handle_models(self, request: web.Request) -> web.Response:
        status = self._refusal(request)
        if status is not None:
            payload: dict = error_body(status)
        else:
            status = 200
            models = [MODEL, "gpt-3.5-turbo-instruct", "text-embedding-3-small"]
            payload = {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 1700000000, "owned_by": "fake"}
                    for m in models
                ],
            }
        self._log_request(request, None, "", status)
        return web.json_response(payload, status=status)

    def _log_request(self, request: web.Request, body: Any, prompt: str, status: int) -> None:
        if not self._record:
            return
        entry = LoggedRequest(
            monotonic=time.monotonic(),
            wall=time.time(),
            method=request.method,
            path=request.path,
            body=body,
            prompt=prompt,
            status=status,
            had_authorization="Authorization" in request.headers,
        )
        with self._lock:
            self._log.append(entry)


def main(argv: list[str] | None = None) -> None:
    """Serve until killed; print ``READY <port>`` on stdout once listening."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--transient-rate", type=float, default=0.0)
    parser.add_argument("--require-key", default=None)
    args = parser.parse_args(argv)
    server = FakeServer(
        port=args.port,
        latency_s=args.latency,
        transient_rate=args.transient_rate,
        require_key=args.require_key,
        record=False,  # a benchmark sends millions of requests; nobody reads the log
    )

    def ready(port: int) -> None:
        print(f"READY {port}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a person stops it
        asyncio.run(server.serve(on_ready=ready))


if __name__ == "__main__":
    main()
