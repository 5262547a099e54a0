"""The 200 replies of every API the fake server speaks, and how a request's text and tokens are
read from its body (see the package docstring's "Usage" for the knobs that shape them).

The builders follow the official response types (``openai``'s ChatCompletion, Completion,
CreateEmbeddingResponse, Response; Anthropic's Message in ``anthropic.py``):
``tests/test_fakeserver.py`` validates them against the ``openai`` package.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Literal

import orjson

from . import anthropic

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


def served_tier(body: dict) -> str:
    """The tier a reply says served it: the one asked for (flex, priority), else ``default``
    (OpenAI's API reference: the reply's ``service_tier`` is the processing type used,
    which need not be the one in the request; ``auto`` resolves to ``default`` here)."""
    asked = body.get("service_tier")
    return asked if asked in ("flex", "priority") else "default"


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
        "service_tier": served_tier(body),
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
        "service_tier": served_tier(body),
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
    API at ``path`` says so (see the package docstring). A cut-off reply generated exactly the
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


def malformed_body(payload: dict, *, truncate: bool) -> bytes:
    """A 200 body no client can use: ``payload`` cut off mid-JSON, or without its ``choices``
    (``data`` for embeddings, ``content`` for an Anthropic Message)."""
    if truncate:
        encoded = orjson.dumps(payload)
        return encoded[: len(encoded) // 2]  # an object without its closing brace never parses
    lost = ("choices", "data", "content", "output")
    return orjson.dumps({k: v for k, v in payload.items() if k not in lost})


def stop_for(markers: tuple[tuple[Stop, str | None], ...], path: str, body: Any) -> Stop | None:
    """How the reply to this request stops short, by the ``(kind, marker)`` found first in its
    text, if at all (embeddings never stop short)."""
    if path.endswith("/embeddings") or not any(m for _, m in markers):
        return None
    text = _all_text(path, body)
    return next((kind for kind, m in markers if m is not None and m in text), None)


def models_page() -> dict:
    """OpenAI's ``GET /v1/models`` list: the models the builders answer for by default."""
    models = [MODEL, "gpt-3.5-turbo-instruct", "text-embedding-3-small"]
    return {
        "object": "list",
        "data": [
            {"id": m, "object": "model", "created": 1700000000, "owned_by": "fake"} for m in models
        ],
    }
