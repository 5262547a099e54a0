"""The simulated provider: an OpenAI-compatible API inside the process, for demos and benchmarks.

``aiq run --provider simulated`` sends through :class:`SimulatedTransport` instead of the network,
so the README demo needs no key and no connection, yet exercises everything a real run does:
latency, transient 429/500 errors that succeed on retry, and permanent 400s that dead-letter.

Replies have OpenAI's exact shapes (ChatCompletion, Completion, CreateEmbeddingResponse and the
error body); ``tests/test_fakeserver.py`` validates them against the official ``openai`` types.
Reply text is a deterministic function of the prompt, so a re-run gives the same results.

The pure builders (:func:`chat_completion`, :func:`completion`, :func:`embeddings`,
:func:`error_body`) live here and not in a module shared with the test suite's fake server on
purpose: that server is the independent oracle aiq is tested against, and a shared builder would
let one bug agree with itself on both sides. Both are pinned to the official types instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from typing import Any

import httpx
import orjson

__all__ = [
    "PERMANENT_FAILURE_MARKER",
    "SimulatedTransport",
    "chat_completion",
    "completion",
    "embeddings",
    "error_body",
    "reply_text",
]

PERMANENT_FAILURE_MARKER = "FAIL_PERMANENT"
"""A prompt containing this gets a 400 ``invalid_request_error``: it dead-letters, by design."""

_EMBEDDING_DIM = 16
_CHARS_PER_TOKEN = 4  # the usual rule of thumb for English; estimates, not billing


# -- pure reply builders ----------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """A token count from text length: never zero for a non-empty request."""
    return max(1, math.ceil(len(text) / _CHARS_PER_TOKEN))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _content_text(content: Any) -> str:
    """A chat message's content: a string, or a list of typed parts of which text counts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _texts(value: Any) -> list[str]:
    """A completions ``prompt`` or embeddings ``input``: a string or a list of them."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v if isinstance(v, str) else orjson.dumps(v).decode() for v in value]
    return []


def _messages_text(body: dict) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    return "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))


def _last_user_text(body: dict) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return _content_text(message.get("content"))
    return ""


def reply_text(prompt: str, *, max_tokens: int | None = None) -> tuple[str, str]:
    """The simulated answer to ``prompt`` and its finish reason (``stop`` or ``length``)."""
    snippet = " ".join(prompt.split())
    if len(snippet) > 48:
        snippet = snippet[:47].rstrip() + "…"
    text = f"Simulated answer {_digest(prompt)[:8]} to: {snippet}"
    if max_tokens is not None and max_tokens > 0 and estimate_tokens(text) > max_tokens:
        return text[: max_tokens * _CHARS_PER_TOKEN], "length"
    return text, "stop"


def _max_tokens(body: dict) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) else None


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(body: dict) -> dict:
    """A ChatCompletion answering the last user message of a chat request ``body``."""
    prompt = _last_user_text(body)
    text, finish = reply_text(prompt, max_tokens=_max_tokens(body))
    return {
        "id": "chatcmpl-sim" + _digest(prompt)[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model") or "simulated"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": _usage(estimate_tokens(_messages_text(body)), estimate_tokens(text)),
        "system_fingerprint": "fp_simulated",
    }


def completion(body: dict) -> dict:
    """A (legacy) Completion: one choice per prompt in ``body["prompt"]``."""
    prompts = _texts(body.get("prompt")) or [""]
    choices, completion_tokens = [], 0
    for index, prompt in enumerate(prompts):
        text, finish = reply_text(prompt, max_tokens=_max_tokens(body))
        completion_tokens += estimate_tokens(text)
        choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish})
    return {
        "id": "cmpl-sim" + _digest("\n".join(prompts))[:24],
        "object": "text_completion",
        "created": int(time.time()),
        "model": str(body.get("model") or "simulated"),
        "choices": choices,
        "usage": _usage(estimate_tokens("\n".join(prompts)), completion_tokens),
    }


def embeddings(body: dict) -> dict:
    """A CreateEmbeddingResponse: one deterministic unit vector per input."""
    inputs = _texts(body.get("input"))
    dims = body.get("dimensions")
    dims = dims if isinstance(dims, int) and 0 < dims <= 64 else _EMBEDDING_DIM
    data = []
    for index, text in enumerate(inputs):
        raw = hashlib.shake_256(text.encode()).digest(dims)
        vector = [b / 255 - 0.5 for b in raw]
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        data.append(
            {"object": "embedding", "index": index, "embedding": [v / norm for v in vector]}
        )
    prompt_tokens = sum(estimate_tokens(t) for t in inputs)
    return {
        "object": "list",
        "data": data,
        "model": str(body.get("model") or "simulated-embedding"),
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _input_field(path: str) -> str:
    return "prompt" if path.endswith("/completions") else "input"


def _request_text(path: str, body: dict) -> str:
    if path.endswith("/chat/completions"):
        return _messages_text(body)
    return "\n".join(_texts(body.get(_input_field(path))))


# -- the transport ----------------------------------------------------------------------------

_BUILDERS = (
    ("/chat/completions", chat_completion),  # before /completions, which it also ends with
    ("/completions", completion),
    ("/embeddings", embeddings),
)


class SimulatedTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` that answers like OpenAI's API, without a network.

    Each request sleeps ``latency_s`` (jittered 0.5x-1.5x, deterministically per request). A
    ``transient_error_rate`` share of attempts fail with 429 (with ``retry-after-ms``) or 500. The
    draw hashes ``seed``, the request body and how often that body has failed in a row, so a run is
    reproducible, and a retry of a failed request gets a fresh draw: it usually succeeds, which is
    what the demo should show. A prompt containing ``FAIL_PERMANENT`` always gets a 400.
    """

    def __init__(
        self, *, latency_s: float = 0.05, transient_error_rate: float = 0.05, seed: int = 0
    ) -> None:
        if latency_s < 0 or not 0 <= transient_error_rate <= 1:
            raise ValueError("latency_s must be >= 0 and transient_error_rate in [0, 1]")
        self.latency_s = latency_s
        self.transient_error_rate = transient_error_rate
        self.seed = seed
        # Failures in a row per request body. Only failing bodies are kept, and a success drops
        # its entry, so memory stays proportional to the requests currently being retried.
        self._failures: dict[bytes, int] = {}
        self._requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Answer ``request`` as the OpenAI API would."""
        raw = await request.aread()
        self._requests += 1
        key = hashlib.blake2b(raw, digest_size=16).digest()
        failures = self._failures.get(key, 0)
        draw = hashlib.blake2b(b"%d:%d:" % (self.seed, failures) + key, digest_size=16).digest()
        if self.latency_s > 0:
            jitter = 0.5 + draw[8] / 255
            await asyncio.sleep(self.latency_s * jitter)

        status, payload, headers = self._answer(request, raw, draw)
        if status in (429, 500):
            self._failures[key] = failures + 1
        elif failures:
            del self._failures[key]
        content = orjson.dumps(payload)
        headers["x-request-id"] = f"req_sim{draw.hex()[:20]}{self._requests:x}"
        headers["content-type"] = "application/json"
        headers["content-length"] = str(len(content))
        # A stream, not content=: the client then reads and closes it like a network reply, so
        # response.elapsed works as it does over AiohttpTransport.
        return httpx.Response(
            status, headers=headers, stream=httpx.ByteStream(content), request=request
        )

    def _answer(
        self, request: httpx.Request, raw: bytes, draw: bytes
    ) -> tuple[int, dict, dict[str, str]]:
        path = request.url.path
        if request.method == "GET" and path.endswith("/models"):
            models = [{"id": "simulated", "object": "model", "created": 0, "owned_by": "aiq"}]
            return 200, {"object": "list", "data": models}, {}
        builder = next((b for suffix, b in _BUILDERS if path.endswith(suffix)), None)
        if request.method != "POST" or builder is None:
            message = f"Unknown request URL: {request.method} {path}."
            return 404, error_body(message, type="invalid_request_error", code="unknown_url"), {}
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            message = "We could not parse the JSON body of your request."
            return 400, error_body(message, type="invalid_request_error"), {}
        if PERMANENT_FAILURE_MARKER in _request_text(path, body):
            message = (
                f"Invalid prompt: it contains {PERMANENT_FAILURE_MARKER}, "
                "which the simulated provider always rejects."
            )
            param = "messages" if path.endswith("/chat/completions") else _input_field(path)
            payload = error_body(
                message, type="invalid_request_error", code="invalid_prompt", param=param
            )
            return 400, payload, {}
        if int.from_bytes(draw[:8], "big") / 2**64 < self.transient_error_rate:
            if draw[9] & 1:
                retry_ms = 20 + draw[10] % 200
                message = (
                    "Rate limit reached for requests (simulated). "
                    f"Please try again in {retry_ms}ms."
                )
                payload = error_body(message, type="requests", code="rate_limit_exceeded")
                return 429, payload, {"retry-after-ms": str(retry_ms)}
            message = "The server had an error while processing your request. Sorry about that!"
            return 500, error_body(message, type="server_error"), {}
        return 200, builder(body), {}
