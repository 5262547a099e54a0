"""A real OpenAI-compatible HTTP server on 127.0.0.1 that enforces rate limits and injects faults.

From a sync pytest test::

    with FakeServer(transient_rate=0.2) as server:
        run_aiq("--base-url", server.base_url, ...)
        assert server.count_for("hello") == 1

As a process, for benchmarks (prints ``READY <port>`` once it listens, serves until killed)::

    python tests/fakeserver.py --port 0 --latency 0 [--rpm 6000 --limit-window 1 ...]

It deliberately imports nothing from ``aiq``: it is the oracle aiq is tested against, so a bug in
aiq's own reply builders (``aiq.providers.simulated``) must not be able to agree with itself here.
``tests/test_fakeserver.py`` pins both to the same truth, the official ``openai`` response types.

It also serves Anthropic's Messages API at ``POST /v1/messages`` (``tests/fake_anthropic.py``),
with every knob below: its auth is ``x-api-key``, its errors, request id and rate-limit headers
are Anthropic's, and an overload (``error_503_rate``, an outage) is its 529 ``overloaded_error``.

Behaviour knobs are plain attributes, read on every request, so a test may change them while the
server runs (e.g. set ``reject_marker = None`` and replay the dead letters). With every knob at its
default the server answers every well-formed request 200 at once.

Refusals, whatever the request says:

- ``outage_until`` (a ``time.monotonic()`` value; or call ``start_outage(seconds)``): until then
  every request, ``/v1/models`` too, gets 503 (or, with ``outage_fault="reset"``, a reset). The
  provider is down, so these count against no rate limit.
- ``require_key``: 401 unless ``Authorization: Bearer <require_key>`` (``x-api-key:
  <require_key>`` on ``/v1/messages``).
- ``status_for_all``: answer every request with this status and OpenAI's error body for it
  (401 bad key, 403, 404 unknown model, 429 quota, 500, 503).
- ``status_for_model``: ``{model: status}``: answer every request naming that model with this
  status (and the dialect's error body), after any latency; other models are served as usual.
  A gateway in front of several deployments (LiteLLM's router, OpenRouter, a vLLM per model
  behind one URL) fails this way when one model's deployment is down: its calls get 500s while
  the others' succeed on the same endpoint (PROVIDERS.md: "an always-failing model").

Rate limits, as OpenAI enforces them (see ``_RateLimiter``):

- ``rpm``, ``tpm``: requests and tokens per minute (None: unlimited). A request costs its prompt
  tokens, estimated as the reply's ``usage`` counts them, plus ``max_completion_tokens`` (or
  ``max_tokens``) times ``n``: :func:`request_tokens`. One over the limit gets 429 with OpenAI's
  message and ``retry-after`` / ``retry-after-ms``, and is not counted. Every reply to a POST
  carries the ``x-ratelimit-*`` headers of the limits that are set (none when none are).
- ``limit_window_s``: 60 enforces per minute; 1 enforces ``rpm / 60`` and ``tpm / 60`` per second,
  as providers may (choose limits divisible by 60 then). The window slides: no span of
  ``limit_window_s`` seconds ever admits more than the limit.

Rate limits as a given provider or gateway counts them (``tests/fake_limits.py``):

- ``limit_mode``: a ``fake_limits.Mode`` (OpenAI's bucket, per-second enforcement, LiteLLM's
  calendar minutes, Azure's 10-second windows, Groq's per-day requests, Anthropic's buckets, no
  headers at all, another client on the key). It admits or refuses each request with that
  provider's 429 and writes its headers, in place of ``rpm`` / ``tpm`` (which must then be
  unset). ``limit_clock`` is its clock (``time.time``; a test may pass a fake one). A mode with
  ``slots`` serves that many requests at once (their ``latency_s``); the rest queue.
  ``max_in_flight`` is the most requests held at once so far, queued or served (counted while
  ``latency_s`` or ``slots`` is set).

Faults, for the requests the limiter admitted:

- ``reject_marker``: a request whose text contains it gets a permanent 400.
- ``cut_off_marker``, ``thinking_marker``, ``filter_marker``: a request whose text contains one
  gets a 200 that stopped short, in the shape of its API (:func:`stopped_short`): cut off at
  ``max_tokens`` (chat and completions ``finish_reason: "length"``, Responses ``status:
  "incomplete"`` for ``max_output_tokens``, Anthropic ``stop_reason: "max_tokens"``); a
  reasoning model's whole budget spent thinking (the same, with empty content and every
  completion token a reasoning token); stopped by a content filter (``"content_filter"``,
  Anthropic's ``"refusal"``). Billed as providers bill them: the tokens generated.
- ``reject_rate``: the share of prompts that always get a permanent 400 (drawn from the seed and
  the prompt, so a retry gets it again; :meth:`FakeServer.would_reject` tells which).
- ``transient_rate``: the share of attempts answered 500 or 429 (+ ``retry-after`` from
  ``retry_after_s``; this 429 does not come from the limiter).
- ``error_500_rate``, ``error_503_rate``: the share answered 500 / 503 with OpenAI's bodies.
- ``reset_rate``: the share whose TCP connection is reset, without a byte of reply.
- ``hang_rate``: the share answered only after ``hang_s`` more seconds (past a client's timeout).
- ``malformed_rate``: the share answered 200 with a body cut off mid-JSON, or a JSON object that
  lacks ``choices`` (``data`` for embeddings).

The per-attempt shares are slices of one draw, in that order, so they exclude one another and add
up: ``error_500_rate=0.05, reset_rate=0.02`` fails 7% of attempts. The draw hashes the seed, the
request body and how often that body reached this point before, so a run is reproducible and a
retried request gets a fresh draw.

Usage, as the providers report it (the usage objects of OpenAI's Chat Completions and
Responses API references and Anthropic's Messages API reference; ../shared/PROVIDERS.md):

- ``cached_tokens``: this many of each prompt's tokens (at most all of them) were read from
  OpenAI's prompt cache: ``usage.prompt_tokens_details.cached_tokens`` (Responses:
  ``input_tokens_details``), still counted in ``prompt_tokens``, billed at the cached-input
  price. (OpenAI caches prompts of 1,024 tokens or more, in steps of 128; a fixed figure keeps
  a test's arithmetic plain.) Anthropic's prompt cache is emulated from ``cache_control``
  marks instead (``fake_anthropic.account_cache``): ``cache_creation_input_tokens`` on the
  first request with a marked prefix, ``cache_read_input_tokens`` after, both left out of
  ``input_tokens``.
- ``reasoning_tokens``: each chat, responses or Anthropic reply spent this many tokens
  reasoning before its text: added to ``completion_tokens`` (``output_tokens``) and reported
  in ``completion_tokens_details.reasoning_tokens`` (Responses: ``output_tokens_details``;
  Anthropic: ``output_tokens_details.thinking_tokens``), billed as output, not in the text.
- ``usage_patches``: ``{marker: {field: value}}``; a reply whose request text holds a marker
  has those fields of its ``usage`` set to those values, whatever they are (a negative count,
  a float, a string, null: a broken or hostile server; ``""`` marks every request).

- ``chat_template``: ``(per_message, per_request)`` tokens a chat template adds to each chat
  completion's ``prompt_tokens``, as a real server counts the prompt it formats, not only its
  text; None: the text alone. ``GEMMA3_TEMPLATE`` is Gemma 3's under llama.cpp: ``<bos>`` once,
  ``<start_of_turn>user\n … <end_of_turn>\n`` around each message (5 tokens) and the reply
  primed with ``<start_of_turn>model\n`` (3): 9 for one message, as the issue measured
  (Google's "Gemma formatting and system instructions", ai.google.dev/gemma/docs/core/
  prompt-structure; its control tokens are single tokens in the tokenizer). OpenAI's cookbook
  counts 3 and 3 for its chat models ("How to count tokens with tiktoken",
  openai/openai-cookbook examples/How_to_count_tokens_with_tiktoken.ipynb).
- ``reply_tokens``: an Anthropic reply's text is this many tokens long (cut off at the
  request's ``max_tokens``, ``stop_reason: "max_tokens"``), for output-token limits; None: a
  short sentence.
- ``latency_s``: seconds slept before answering (no sleep at all when 0, for throughput). Outages
  and rate-limit 429s are answered at once, as a gateway in front of the model would.
- ``max_parallel``: serve that many requests at once and queue the rest, as a llama.cpp server
  with that many slots does (set at start).
- ``record``: keep the request log (``requests``); off for benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import math
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

import fake_anthropic as anthropic
import fake_limits
import orjson
from aiohttp import web

MODEL = "gpt-4o-mini"
GEMMA3_TEMPLATE = (5, 4)  # chat_template: tokens a message, tokens a request (see above)
OPENAI_TEMPLATE = (3, 3)
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


_CHAT_PATHS = ("/chat/completions", anthropic.PATH)


def prompt_of(path: str, body: Any) -> str:
    """The prompt a request is about: the last user message (chat, Anthropic's messages),
    ``prompt`` or ``input``."""
    if not isinstance(body, dict):
        return ""
    if path.endswith(_CHAT_PATHS):
        messages = body.get("messages")
        if isinstance(messages, list):
            for message in reversed(messages):
                if isinstance(message, dict) and message.get("role") == "user":
                    return _content_text(message.get("content"))
        return ""
    if path.endswith("/embeddings"):
        return _as_text(body.get("input"))
    if path.endswith("/responses"):
        return _response_input(body.get("input"))
    return _as_text(body.get("prompt"))


def _response_input(value: Any) -> str:
    """A /v1/responses ``input``: a string, or input items (messages) with their content."""
    if isinstance(value, list):
        return "\n".join(
            _content_text(item.get("content")) for item in value if isinstance(item, dict)
        )
    return value if isinstance(value, str) else ""


def _all_text(path: str, body: Any) -> str:
    """Every piece of text in the request, so a reject marker in a system message counts too."""
    if path.endswith(_CHAT_PATHS) and isinstance(body, dict):
        messages = body.get("messages")
        if isinstance(messages, list):
            texts = [_content_text(m.get("content")) for m in messages if isinstance(m, dict)]
            if path == anthropic.PATH and (system := anthropic.system_text(body)):
                texts.insert(0, system)
            return "\n".join(texts)
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


def responses_reply(body: dict, prompt: str) -> dict:
    """A Response (the Responses API) answering ``prompt``."""
    text = reply_text(prompt)
    usage = _usage(prompt, text)
    return {
        "id": _response_id("resp_", prompt),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model") or MODEL,
        "output": [
            {
                "type": "message",
                "id": _response_id("msg_", prompt),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def message_reply(body: dict, prompt: str, reply_tokens: int | None = None) -> dict:
    """An Anthropic Message answering ``prompt``, its usage counted as OpenAI's is; with
    ``reply_tokens``, its text that many tokens long, cut off at ``max_tokens``."""
    text = reply_text(prompt)
    stop_reason = "end_turn"
    if reply_tokens is not None:
        max_tokens = _count(body.get("max_tokens")) or reply_tokens
        if reply_tokens > max_tokens:
            reply_tokens, stop_reason = max_tokens, "max_tokens"
        text = (text + " " + "word" * reply_tokens)[: 4 * reply_tokens]
    prompt_tokens = _tokens(_all_text(anthropic.PATH, body))
    return anthropic.message_reply(
        body, prompt, text, prompt_tokens, _tokens(text), stop_reason=stop_reason
    )


def _add_template(usage: dict, body: Any, per_message: int, per_request: int) -> None:
    """The ``chat_template`` knob: the formatted prompt's markers, counted in prompt_tokens."""
    messages = body.get("messages") if isinstance(body, dict) else None
    n = sum(isinstance(m, dict) for m in messages) if isinstance(messages, list) else 0
    extra = per_message * n + per_request
    usage["prompt_tokens"] += extra
    usage["total_tokens"] += extra


def _cache_and_reason(path: str, usage: dict, cached: int, reasoning: int) -> None:
    """The ``cached_tokens`` and ``reasoning_tokens`` knobs, in each API's usage shape."""
    responses = path.endswith("/responses")
    if cached and path.endswith(("/chat/completions", "/completions", "/responses")):
        whole = usage["input_tokens" if responses else "prompt_tokens"]
        details = "input_tokens_details" if responses else "prompt_tokens_details"
        usage[details] = {**usage.get(details, {}), "cached_tokens": min(cached, whole)}
    if reasoning and path.endswith(("/chat/completions", "/responses", anthropic.PATH)):
        out = "completion_tokens" if path.endswith("/chat/completions") else "output_tokens"
        usage[out] += reasoning
        if "total_tokens" in usage:
            usage["total_tokens"] += reasoning
        if path == anthropic.PATH:
            usage["output_tokens_details"] = {"thinking_tokens": reasoning}
        elif responses:
            usage["output_tokens_details"] = {"reasoning_tokens": reasoning}
        else:
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}


_BUILDERS = {
    "/v1/chat/completions": chat_reply,
    "/v1/completions": completion_reply,
    "/v1/embeddings": embedding_reply,
    "/v1/responses": responses_reply,
    anthropic.PATH: message_reply,
}


Stop = Literal["cut_off", "thinking", "filter"]
_UNBOUNDED_OUTPUT = 64  # tokens a cut-off reply generated when the request names no max_tokens


def stopped_short(path: str, body: Any, payload: dict, stop: Stop) -> None:
    """Make ``payload`` (a 200 reply to ``body`` at ``path``) one that stopped short, as the
    API at ``path`` says so (see the module docstring). A cut-off reply generated exactly the
    request's ``max_tokens`` (``max_completion_tokens``, ``max_output_tokens``)."""
    limit = None
    for name in ("max_completion_tokens", "max_output_tokens", "max_tokens"):
        limit = limit if limit is not None else _count(body.get(name))
    out = limit or _UNBOUNDED_OUTPUT
    filtered = stop == "filter"
    if path == anthropic.PATH:
        payload["stop_reason"] = "refusal" if filtered else "max_tokens"
        if stop == "thinking":  # extended thinking that used the whole budget
            payload["content"] = [{"type": "thinking", "thinking": "Hmm, " * out, "signature": "x"}]
        if not filtered:
            payload["usage"]["output_tokens"] = out
        return
    usage = payload["usage"]
    if path.endswith("/responses"):
        payload["status"] = "incomplete"
        payload["incomplete_details"] = {
            "reason": "content_filter" if filtered else "max_output_tokens"
        }
        if stop == "thinking":
            payload["output"] = [{"type": "reasoning", "id": "rs_fake", "summary": []}]
            usage["output_tokens_details"]["reasoning_tokens"] = out
        if not filtered:
            usage["total_tokens"] += out - usage["output_tokens"]
            usage["output_tokens"] = out
        return
    choice = payload["choices"][0]
    choice["finish_reason"] = "content_filter" if filtered else "length"
    if not filtered:
        usage["total_tokens"] += out - usage["completion_tokens"]
        usage["completion_tokens"] = out
    if stop == "thinking":
        if "message" in choice:
            choice["message"]["content"] = ""
        else:
            choice["text"] = ""
        usage["completion_tokens_details"] = {"reasoning_tokens": out}


ORGANIZATION = "org-fake"
_RATE_LIMIT_HELP = "Visit https://platform.openai.com/account/rate-limits to learn more."


def request_tokens(path: str, body: Any) -> int:
    """The tokens a request counts against TPM: prompt tokens plus ``max_tokens`` times ``n``.

    That is how OpenAI counts a request before it runs. The prompt tokens are estimated exactly as
    the reply's ``usage.prompt_tokens`` is, so a client can settle its estimate against the reply.
    ``max_completion_tokens`` wins over the older ``max_tokens``; with neither, nothing is added.
    """
    if not isinstance(body, dict):
        return 0
    reserved = _count(body.get("max_completion_tokens"))
    if reserved is None:
        reserved = _count(body.get("max_tokens")) or 0
    return _tokens(_all_text(path, body)) + reserved * (_count(body.get("n")) or 1)


def _count(value: Any) -> int | None:
    """``value`` if it is a whole number of things (not a bool, not negative), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


openai_duration = fake_limits.openai_duration


def malformed_body(payload: dict, *, truncate: bool) -> bytes:
    """A 200 body no client can use: ``payload`` cut off mid-JSON, or without its ``choices``
    (``data`` for embeddings, ``content`` for an Anthropic Message)."""
    if truncate:
        encoded = orjson.dumps(payload)
        return encoded[: len(encoded) // 2]  # an object without its closing brace never parses
    lost = ("choices", "data", "content", "output")
    return orjson.dumps({k: v for k, v in payload.items() if k not in lost})


class _Window:
    """The requests admitted in the last ``span_s`` seconds, with their token total.

    Each request enters once and leaves once, so keeping the total costs O(1) per request.
    The window is half-open: a request admitted at ``t`` counts while ``now - span_s < t``.
    """

    __slots__ = ("events", "span_s", "tokens")

    def __init__(self, span_s: float, events: Iterable[tuple[float, int]] = ()) -> None:
        self.span_s = span_s
        self.events: deque[tuple[float, int]] = deque(events)  # (admitted at, tokens), oldest first
        self.tokens = sum(cost for _, cost in self.events)

    def expire(self, now: float) -> None:
        """Forget the requests that left the window by ``now``."""
        horizon = now - self.span_s
        events = self.events
        while events and events[0][0] <= horizon:
            self.tokens -= events.popleft()[1]

    def add(self, now: float, tokens: int) -> None:
        """Count one request of ``tokens`` admitted at ``now``."""
        self.events.append((now, tokens))
        self.tokens += tokens

    def used(self, kind: str) -> int:
        """Requests or tokens in the window."""
        return len(self.events) if kind == "requests" else self.tokens

    def fits(self, kind: str, *, limit: float, cost: int) -> bool:
        """Whether ``cost`` more requests or tokens (``kind``) fit under ``limit`` now."""
        return self.used(kind) + cost <= limit

    def wait_to_fit(self, now: float, kind: str, *, limit: float, cost: int) -> float | None:
        """Seconds from ``now`` until ``cost`` more requests or tokens (``kind``) fit under
        ``limit``, or None if they never can."""
        if cost > limit:
            return None
        used, wait = self.used(kind), 0.0
        for admitted, tokens in self.events:  # oldest first, the order in which they leave
            if used + cost <= limit:
                break
            used -= 1 if kind == "requests" else tokens
            wait = admitted + self.span_s - now
        return wait

    def reset_in(self, now: float) -> float:
        """Seconds until the window is empty again: OpenAI's "resets to its initial state"."""
        return self.events[-1][0] + self.span_s - now if self.events else 0.0


class _RateLimiter:
    """OpenAI's two limits, requests and tokens per minute, over sliding windows.

    The headers always speak per minute, like OpenAI's, so a minute window is kept; when the
    limit is enforced over a shorter window (per second, say) a second window does that.
    Only the server's loop touches it, so it needs no lock.
    """

    def __init__(self) -> None:
        self.minute = _Window(60.0)
        self.enforced = self.minute

    def judge(
        self, now: float, *, rpm: int | None, tpm: int | None, window_s: float, tokens: int
    ) -> tuple[str, float | None] | None:
        """Admit and count a request of ``tokens`` arriving at ``now``, returning None; or, when
        it does not fit, leave the windows as they were and return the limit it broke
        (``"requests"`` or ``"tokens"``) and the seconds until it fits (None: it never will)."""
        enforced = self._windows(now, window_s)
        scale = enforced.span_s / 60.0
        limits = [
            (kind, limit * scale, cost)
            for kind, limit, cost in (("requests", rpm, 1), ("tokens", tpm, tokens))
            if limit is not None
        ]
        if all(enforced.fits(kind, limit=limit, cost=cost) for kind, limit, cost in limits):
            self.minute.add(now, tokens)
            if enforced is not self.minute:
                enforced.add(now, tokens)
            return None
        waits = {
            kind: enforced.wait_to_fit(now, kind, limit=limit, cost=cost)
            for kind, limit, cost in limits
        }
        # Blame the limit that can never be met, else the one that takes longer to free up.
        blame = {kind: math.inf if wait is None else wait for kind, wait in waits.items()}
        kind = max(blame, key=blame.__getitem__)
        return kind, waits[kind]

    def windows(
        self, now: float, *, rpm: int | None, tpm: int | None
    ) -> list[tuple[str, int, int, float]]:
        """(kind, limit, remaining, seconds to reset) of the limits that are set, over the last
        minute. ``reset`` is the time until the window is empty, so ``remaining`` is back at
        the limit."""
        minute = self.minute
        minute.expire(now)
        reset = minute.reset_in(now)
        return [
            (kind, limit, max(0, limit - minute.used(kind)), reset)
            for kind, limit in (("requests", rpm), ("tokens", tpm))
            if limit is not None
        ]

    def headers(self, now: float, *, rpm: int | None, tpm: int | None) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for the limits that are set (see ``windows``)."""
        headers = {}
        for kind, limit, remaining, reset in self.windows(now, rpm=rpm, tpm=tpm):
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(remaining)
            headers[f"x-ratelimit-reset-{kind}"] = openai_duration(reset)
        return headers

    def _windows(self, now: float, window_s: float) -> _Window:
        """Bring both windows up to ``now``; return the enforced one."""
        self.minute.expire(now)
        if window_s == 60.0:
            self.enforced = self.minute
        elif self.enforced.span_s != window_s:
            # A new span starts from the last minute's requests, so none is forgotten.
            recent = [e for e in self.minute.events if e[0] > now - window_s]
            self.enforced = _Window(window_s, recent)
        self.enforced.expire(now)
        return self.enforced


Fault = Literal["500", "503", "reset", "hang", "malformed", "rate_limit", "reject", "outage"]

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
    cost: fake_limits.Cost | None = None  # what a limit mode admitted it at


class FakeServer:
    """An OpenAI-compatible server in a background thread with its own event loop.

    Use it as a context manager; ``base_url`` ends in ``/v1`` like ``OPENAI_BASE_URL``. The knobs
    are described in the module docstring.
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
        limit_mode: fake_limits.Mode | None = None,
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

    def _check_knobs(self) -> None:
        """Refuse settings that would make a test silently meaningless."""
        for name in ("reject_rate", *(knob for _, knob in _DRAWN)):
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
        marker = self.reject_marker
        if marker is not None and marker in prompt:
            return True
        rate = self.reject_rate
        if rate <= 0:
            return False
        digest = hashlib.sha256(b"%d:reject:" % self.seed + prompt.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < rate

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
        best = total = start = 0
        for admitted, amount in events:
            total += amount
            # The same half-open window, and the same float expression, the limiter uses.
            while events[start][0] <= admitted - window_s:
                total -= events[start][1]
                start += 1
            best = max(best, total)
        return best

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
            return self._outage(ex)
        refused = self._refused(request, path, body)
        if refused is None:
            if mode is not None:
                cost = fake_limits.Cost(
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
            elif self.rpm is not None or self.tpm is not None:
                verdict = self._limiter.judge(
                    ex.received,
                    rpm=self.rpm,
                    tpm=self.tpm,
                    window_s=float(self.limit_window_s),
                    tokens=ex.tokens,
                )
                if verdict is not None:
                    return self._rate_limited(ex, *verdict)
            ex.counted = True
        if self.latency_s > 0 or self._slots is not None:
            await self._serve(self.latency_s)
        if refused is not None:
            return self._reply(ex, *refused)
        if self._rejects(path, body, ex.prompt):
            ex.fault = "reject"
            return self._reply(
                ex, 400, self._error_body(ex, 400, "The request was rejected as invalid.")
            )
        drawn = self._draw(raw)
        if drawn is None:
            return self._reply(ex, 200, self._build(path, body, ex.prompt, ex.cost))
        return await self._inject(ex, path, *drawn)

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

    def _build(
        self, path: str, body: Any, prompt: str, cost: fake_limits.Cost | None = None
    ) -> dict:
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
        markers = (
            ("cut_off", self.cut_off_marker),
            ("thinking", self.thinking_marker),
            ("filter", self.filter_marker),
        )
        if path.endswith("/embeddings") or not any(m for _, m in markers):
            return None
        text = _all_text(path, body)
        return next((kind for kind, m in markers if m is not None and m in text), None)

    def _refused(self, request: web.Request, path: str, body: Any) -> tuple[int, dict] | None:
        """The error a request gets before it reaches any model (auth, forced, bad URL or JSON)."""
        if path == anthropic.PATH:
            return self._refused_anthropic(request, body)
        if (status := self._refusal(request)) is not None:
            return status, error_body(status)
        if path not in _BUILDERS:
            return 404, error_body(404, f"Unknown path {path}", code="unknown_url")
        if not isinstance(body, dict):
            return 400, error_body(400, "We could not parse the JSON body.")
        if (status := self._model_status(body)) is not None:
            return status, error_body(status)
        return None

    def _model_status(self, body: dict) -> int | None:
        """The status ``status_for_model`` forces on requests naming this body's model."""
        if not self.status_for_model:
            return None
        return self.status_for_model.get(body.get("model") or MODEL)

    def _refused_anthropic(self, request: web.Request, body: Any) -> tuple[int, dict] | None:
        """``_refused`` for the Messages API: its auth header, version header and fields."""
        status = anthropic.refusal(request.headers, self.require_key) or self.status_for_all
        if status is not None:
            return status, anthropic.error_body(status)
        if (why := anthropic.invalid(request.headers, body)) is not None:
            return 400, anthropic.error_body(400, why)
        if (status := self._model_status(body)) is not None:
            return status, anthropic.error_body(status)
        return None

    @staticmethod
    def _error_body(ex: _Exchange, status: int, message: str | None = None) -> dict:
        """The error body for ``status`` in the dialect of the request."""
        if ex.anthropic:
            return anthropic.error_body(status, message)
        return error_body(status, message)

    def _refusal(self, request: web.Request) -> int | None:
        """The status every request gets regardless of its body (auth, forced), if any."""
        key = self.require_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return 401
        return self.status_for_all

    def _rejects(self, path: str, body: dict, prompt: str) -> bool:
        marker = self.reject_marker
        if marker is not None and marker in _all_text(path, body):
            return True
        return self.reject_rate > 0 and self.would_reject(prompt)

    def _draw(self, raw: bytes) -> tuple[_Drawn, bytes] | None:
        """The per-attempt fault this attempt draws, if any, and the digest it was drawn from."""
        rates = (
            self.transient_rate,
            self.error_500_rate,
            self.error_503_rate,
            self.reset_rate,
            self.hang_rate,
            self.malformed_rate,
        )
        if not any(rates):  # the usual case, and a benchmark's: no hashing, no lock
            return None
        with self._lock:
            nth = self._seen[raw]
            self._seen[raw] += 1
        digest = hashlib.sha256(b"%d:%d:" % (self.seed, nth) + raw).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        edge = 0.0
        for (kind, _), rate in zip(_DRAWN, rates, strict=True):
            edge += rate
            if draw < edge:
                return kind, digest
        return None

    async def _inject(self, ex: _Exchange, path: str, kind: _Drawn, digest: bytes) -> web.Response:
        """Answer with the fault ``kind`` drawn for this attempt."""
        if kind == "transient":  # exactly as before the other faults existed
            if not digest[8] & 1:
                ex.fault = "500"
                return self._reply(ex, 500, self._error_body(ex, 500))
            ex.fault = "rate_limit"
            if ex.anthropic:
                headers = anthropic.retry_after(self.retry_after_s)
                return self._reply(ex, 429, anthropic.error_body(429), headers)
            payload = error_body(
                429, "Rate limit reached for requests.", code="rate_limit_exceeded"
            )
            payload["error"]["type"] = "requests"
            retry_after = {
                "retry-after": str(math.ceil(self.retry_after_s)),
                "retry-after-ms": str(round(self.retry_after_s * 1000)),
            }
            return self._reply(ex, 429, payload, retry_after)
        ex.fault = kind
        if kind == "reset":
            return self._reset(ex, "reset")
        if kind == "500" or kind == "503":
            # Anthropic says "overloaded" with a 529 where OpenAI sends a 503.
            status = anthropic.OVERLOADED if ex.anthropic and kind == "503" else int(kind)
            return self._reply(ex, status, self._error_body(ex, status))
        payload = self._build(path, ex.body, ex.prompt, ex.cost)
        if kind == "malformed":
            return self._reply(ex, 200, malformed_body(payload, truncate=bool(digest[9] & 1)))
        return await self._hang(ex, payload)

    async def _hang(self, ex: _Exchange, payload: dict) -> web.Response:
        """Say nothing for ``hang_s``, then answer if the client is still waiting."""
        ex.fault = "hang"
        # Logged now: a client that timed out must find its request in the log at once.
        index = self._note(ex, 0)
        await asyncio.sleep(self.hang_s)
        transport = ex.request.transport
        if index is not None and transport is not None and not transport.is_closing():
            with self._lock:
                self._log[index] = replace(self._log[index], status=200)
        # To a client that is gone, aiohttp fails to write this and drops it as a disconnect.
        return self._reply(ex, 200, payload, note=False)

    def _reset(self, ex: _Exchange, fault: Fault) -> web.Response:
        """Reset the connection: the client gets no reply at all, and a connection error."""
        ex.fault = fault
        self._note(ex, 0)
        transport = ex.request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                # Linger 0 makes the close send RST: a reset, not a polite end of stream.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        # aiohttp cannot write this to the aborted transport and drops it as a client disconnect.
        return web.Response(status=500)

    def _outage(self, ex: _Exchange) -> web.Response:
        if self.outage_fault == "reset":
            return self._reset(ex, "outage")
        ex.fault = "outage"
        status = anthropic.OVERLOADED if ex.anthropic else 503
        return self._reply(ex, status, self._error_body(ex, status))

    def _rate_limited(self, ex: _Exchange, kind: str, wait_s: float | None) -> web.Response:
        """429 with OpenAI's message for the ``kind`` of limit broken and the wait it needs."""
        ex.fault = "rate_limit"
        limit = self.rpm if kind == "requests" else self.tpm
        if ex.anthropic:
            return self._reply(ex, 429, *anthropic.rate_limited(kind, limit, wait_s))
        model = (ex.body.get("model") if isinstance(ex.body, dict) else None) or MODEL
        requested = 1 if kind == "requests" else ex.tokens
        where = f"for {model} in organization {ORGANIZATION} on {_PER_MINUTE[kind]}: Limit {limit}"
        if wait_s is None:  # it alone is over the limit: no wait helps, and OpenAI names none
            retry: dict[str, str] = {}
            message = (
                f"Request too large {where}, Requested {requested}. The input or output tokens "
                f"must be reduced in order to run successfully. {_RATE_LIMIT_HELP}"
            )
        else:
            retry = self._retry_after(wait_s)
            message = (
                f"Rate limit reached {where}, Used {self._limiter.minute.used(kind)}, Requested "
                f"{requested}. Please try again in "
                f"{openai_duration(int(retry['retry-after-ms']) / 1000)}. {_RATE_LIMIT_HELP}"
            )
        payload = error_body(429, message, code="rate_limit_exceeded")
        payload["error"]["type"] = kind
        return self._reply(ex, 429, payload, retry)

    @staticmethod
    def _retry_after(seconds: float) -> dict[str, str]:
        """Both of OpenAI's forms, rounded up so that a client waiting exactly that long fits."""
        ms = max(1, math.ceil(seconds * 1000))
        return {"retry-after": str(math.ceil(ms / 1000)), "retry-after-ms": str(ms)}

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
            headers.update(self.limit_mode.headers(self.limit_clock()))
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
            return self._outage(ex)
        if ex.anthropic:
            status = anthropic.refusal(request.headers, self.require_key) or self.status_for_all
            payload = anthropic.error_body(status) if status else anthropic.models_page()
            self._note(ex, status or 200)
            return web.json_response(payload, status=status or 200)
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
        self._note(ex, status)
        return web.json_response(payload, status=status)

    def _note(self, ex: _Exchange, status: int) -> int | None:
        """Log ``ex`` settled with ``status``; its index in the log, or None when not recording."""
        if not self._record:
            return None
        request = ex.request
        entry = LoggedRequest(
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
        with self._lock:
            self._log.append(entry)
            return len(self._log) - 1


_PER_MINUTE = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}


def main(argv: list[str] | None = None) -> None:
    """Serve until killed; print ``READY <port>`` on stdout once listening."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--transient-rate", type=float, default=0.0)
    parser.add_argument("--require-key", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rpm", type=int, default=None, help="requests per minute")
    parser.add_argument("--tpm", type=int, default=None, help="tokens per minute")
    parser.add_argument(
        "--limit-window", type=float, default=60.0, help="seconds; 1 enforces per second"
    )
    parser.add_argument(
        "--limit-mode",
        choices=sorted(fake_limits.MODES),
        default=None,
        help="count --rpm/--tpm as this provider does (tests/fake_limits.py)",
    )
    parser.add_argument("--rpd", type=int, default=None, help="requests per day (groq)")
    parser.add_argument("--slots", type=int, default=None, help="served at once (headerless)")
    rates = ["reject_rate", *(knob for kind, knob in _DRAWN if kind != "transient")]
    for knob in rates:
        parser.add_argument("--" + knob.replace("_", "-"), type=float, default=0.0)
    parser.add_argument("--hang", type=float, default=30.0, help="seconds a hang lasts")
    args = parser.parse_args(argv)
    mode = None
    if args.limit_mode is not None:
        mode = fake_limits.build(
            args.limit_mode, rpm=args.rpm, tpm=args.tpm, rpd=args.rpd, slots=args.slots
        )
        args.rpm = args.tpm = None
    server = FakeServer(
        port=args.port,
        latency_s=args.latency,
        transient_rate=args.transient_rate,
        require_key=args.require_key,
        seed=args.seed,
        rpm=args.rpm,
        tpm=args.tpm,
        limit_window_s=args.limit_window,
        hang_s=args.hang,
        limit_mode=mode,
        record=False,  # a benchmark sends millions of requests; nobody reads the log
        **{knob: getattr(args, knob) for knob in rates},
    )

    def ready(port: int) -> None:
        print(f"READY {port}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a person stops it
        asyncio.run(server.serve(on_ready=ready))


if __name__ == "__main__":
    main()
