"""What a request will count against a tokens-per-minute limit, estimated before it is sent.

Providers charge a request at admission as its prompt tokens plus ``max_tokens`` times ``n``
(the completion it may produce), then run it. The prompt part is estimated from the text with
the usual rule of thumb, about four characters per token; the limiter corrects that estimate
from the ``usage`` of the replies (``limiter.RateLimiter.settle``), so no tokenizer is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

_CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True, slots=True)
class TokenCost:
    """A request's estimated prompt tokens, and the completion tokens it reserves."""

    prompt: int
    reserved: int

    @property
    def total(self) -> int:
        return self.prompt + self.reserved


NO_COST = TokenCost(0, 0)


def estimate(body: bytes) -> TokenCost:
    """The token cost of a request body (any endpoint aiq sends; unknown shapes cost 0)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return TokenCost(0, 0)
    if not isinstance(obj, dict):
        return TokenCost(0, 0)
    chars = sum(len(text) for text in _texts(obj))
    prompt = math.ceil(chars / _CHARS_PER_TOKEN) if chars else 0
    out = _count(obj.get("max_completion_tokens"))
    if out is None:
        out = _count(obj.get("max_output_tokens"))  # /v1/responses
    if out is None:
        out = _count(obj.get("max_tokens")) or 0
    return TokenCost(prompt, out * (_count(obj.get("n")) or 1))


def _texts(obj: dict[str, Any]) -> list[str]:
    texts: list[str] = []
    for message in obj.get("messages") or ():
        if isinstance(message, dict):
            _collect(message.get("content"), texts)
    for field in ("system", "prompt", "input", "instructions"):
        _collect(obj.get(field), texts)
    return texts


def _collect(value: Any, texts: list[str]) -> None:
    """Strings, lists of strings, and typed content parts (``{"type": "text", "text": …}``)."""
    if isinstance(value, str):
        texts.append(value)
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif "content" in part:  # /v1/responses input items
                    _collect(part["content"], texts)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
