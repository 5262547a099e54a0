"""The Anthropic dialect of the fake server: how ``POST /v1/messages`` is checked and answered.

``FakeServer`` serves ``/v1/messages`` beside its OpenAI routes, with the same knobs
(rate limits, faults, outages, the request log); this module holds only what Anthropic does
differently, as its API reference describes it:

- auth is ``x-api-key: <key>`` (401 ``authentication_error`` otherwise), an ``anthropic-version``
  header is required (400), and so are ``max_tokens`` and ``messages`` (400);
- a reply is a Message: ``{"id": "msg_…", "type": "message", "role": "assistant", "content":
  [{"type": "text", "text": …}], "stop_reason": "end_turn", "usage": {"input_tokens",
  "output_tokens"}}``, with the request id in the ``request-id`` header; ``system`` blocks
  marked ``cache_control`` are written to a prompt cache, then read (``account_cache``);
- errors are ``{"type": "error", "error": {"type": "rate_limit_error", "message": …}}``; an
  overloaded API answers 529 ``overloaded_error`` where OpenAI answers 503;
- rate-limit headers are ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``, the
  reset an RFC 3339 time; a 429 carries ``retry-after`` in whole seconds.

Like the rest of the fake server it imports nothing from ``aiq``: it is the oracle.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

PATH = "/v1/messages"
MODEL = "claude-sonnet-4-5"
VERSION_HEADER = "anthropic-version"
OVERLOADED = 529

# The Messages API's request fields; it rejects any other.
_PARAMS = frozenset(
    {"model", "messages", "max_tokens", "system", "temperature", "top_p", "top_k"}
    | {"stop_sequences", "metadata", "stream", "tools", "tool_choice", "thinking"}
    | {"service_tier", "container", "mcp_servers"}
)
_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use the resource."),
    404: ("not_found_error", "model: not found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    503: ("api_error", "Service unavailable"),
    OVERLOADED: ("overloaded_error", "Overloaded"),
}


def error_body(status: int, message: str | None = None) -> dict:
    """Anthropic's error body for ``status``."""
    kind, default = _ERRORS.get(status, ("api_error", "Error."))
    return {"type": "error", "error": {"type": kind, "message": message or default}}


def models_page() -> dict:
    """``GET /v1/models``: the models this fake serves, as one page of Anthropic's list."""
    models = [MODEL, "claude-haiku-4-5"]
    return {
        "data": [
            {"type": "model", "id": m, "display_name": m, "created_at": "2025-09-29T00:00:00Z"}
            for m in models
        ],
        "has_more": False,
        "first_id": models[0],
        "last_id": models[-1],
    }


def refusal(headers: Mapping[str, str], require_key: str | None) -> int | None:
    """401 when ``require_key`` is set and ``x-api-key`` is not it; else None."""
    if require_key is not None and headers.get("x-api-key") != require_key:
        return 401
    return None


def invalid(headers: Mapping[str, str], body: Any) -> str | None:
    """Why a request that passed auth is a 400 before any model sees it, or None."""
    if VERSION_HEADER not in headers:
        return f"{VERSION_HEADER}: header is required"
    if not isinstance(body, dict):
        return "There was an error parsing the body of your request."
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return "max_tokens: Field required (a positive integer)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: Field required (a non-empty array)"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
    extra = sorted(body.keys() - _PARAMS)
    if extra:  # e.g. OpenAI's n, stop or max_completion_tokens
        return f"{extra[0]}: Extra inputs are not permitted"
    return None


def system_text(body: Any) -> str:
    """The ``system`` parameter as text: a string, or the text of its blocks."""
    system = body.get("system") if isinstance(body, dict) else None
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "".join(
            b["text"] for b in system if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return ""


def message_reply(
    body: dict,
    prompt: str,
    text: str,
    input_tokens: int,
    output_tokens: int,
    stop_reason: str = "end_turn",
) -> dict:
    """A Message answering ``prompt`` with ``text``."""
    return {
        "id": "msg_" + hashlib.sha256(prompt.encode()).hexdigest()[:24],
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or MODEL,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def _cache_mark(body: Any) -> tuple[str, str] | None:
    """The ``system`` text up to its last block marked ``cache_control``, and its ttl."""
    system = body.get("system") if isinstance(body, dict) else None
    text, mark = "", None
    for block in system if isinstance(system, list) else ():
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            text += block["text"]
            if isinstance(block.get("cache_control"), dict):
                mark = (text, block["cache_control"].get("ttl", "5m"))
    return mark


def cached_tokens(body: Any, written: set[str], tokens: Callable[[str], int]) -> int:
    """The tokens of a request's prompt the cache holds already (it will read them)."""
    mark = _cache_mark(body)
    return tokens(mark[0]) if mark is not None and mark[0] in written else 0


def account_cache(
    payload: dict[str, Any], body: Any, written: set[str], tokens: Callable[[str], int]
) -> None:
    """Prompt caching, for ``system`` blocks only: the text up to the last block marked
    ``cache_control`` is written to the cache the first time (``written`` remembers it) and
    read after; either way ``input_tokens`` leaves it out, as Anthropic's usage does."""
    mark = _cache_mark(body)
    if mark is None:
        return
    prefix, ttl = mark
    n = tokens(prefix)
    usage = payload["usage"]
    usage["input_tokens"] = max(0, usage["input_tokens"] - n)
    new = prefix not in written
    written.add(prefix)
    usage["cache_creation_input_tokens"] = n if new else 0
    usage["cache_read_input_tokens"] = 0 if new else n
    usage["cache_creation"] = {
        "ephemeral_5m_input_tokens": n if new and ttl != "1h" else 0,
        "ephemeral_1h_input_tokens": n if new and ttl == "1h" else 0,
    }


def rfc3339(seconds_from_now: float, now: datetime | None = None) -> str:
    """An RFC 3339 UTC time ``seconds_from_now`` ahead, as Anthropic writes resets."""
    when = (now or datetime.now(UTC)) + timedelta(seconds=max(0.0, seconds_from_now))
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def rate_limit_headers(windows: list[tuple[str, int, int, float]]) -> dict[str, str]:
    """``anthropic-ratelimit-*`` headers from (kind, limit, remaining, reset in seconds)."""
    headers = {}
    for kind, limit, remaining, reset_s in windows:
        prefix = f"anthropic-ratelimit-{kind}-"
        headers[prefix + "limit"] = str(limit)
        headers[prefix + "remaining"] = str(remaining)
        headers[prefix + "reset"] = rfc3339(reset_s)
    return headers


def rate_limited(kind: str, limit: int | None, wait_s: float | None) -> tuple[dict, dict]:
    """The 429 body and headers for a broken ``kind`` limit (``wait_s`` None: never fits)."""
    unit = "requests" if kind == "requests" else "input tokens"
    message = (
        f"This request would exceed the rate limit for your organization of {limit} {unit} "
        "per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."
    )
    headers = {} if wait_s is None else {"retry-after": str(max(1, math.ceil(wait_s)))}
    return error_body(429, message), headers


def retry_after(seconds: float) -> dict[str, str]:
    """Anthropic's ``retry-after``: whole seconds, rounded up."""
    return {"retry-after": str(math.ceil(seconds))}
