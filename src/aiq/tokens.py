"""What a request will count against a tokens-per-minute limit, estimated before it is sent.

Providers charge a request at admission as its prompt tokens plus ``max_tokens`` times ``n``
(the completion it may produce), then run it. The prompt part is estimated from the text with
the usual rule of thumb, about four characters per token; the limiter corrects that estimate
from the ``usage`` of the replies (``limiter.RateLimiter.settle``), so no tokenizer is needed.

A chat model reads more than the text: its chat template wraps each message in a few tokens
of role and turn markers, and primes the reply with a few more. OpenAI's cookbook counts 3 a
message and 3 a request for its chat models ("How to count tokens with tiktoken",
openai/openai-cookbook examples/How_to_count_tokens_with_tiktoken.ipynb,
``num_tokens_from_messages``); Gemma 3 under llama.cpp took 9 for one message. For a short
prompt that is most of the count. ``estimate(body, endpoint=...)`` adds it (the forecast's
figure); the limiter's bookings leave it out, as it learns its own ratio from replies in-run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

CHARS_PER_TOKEN = 4.0
# The chat template's tokens (OpenAI's cookbook, above): around each message, and the reply's
# priming once a request. Endpoints without a template (completions, embeddings) add none.
PER_MESSAGE = 3
PER_REQUEST = 3
_TEMPLATED = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


@dataclass(slots=True)
class LearnedRatio:
    """The ratio of real tokens to estimated ones, averaged over recent replies (the
    limiter's correction of :func:`estimate`'s prompt figure, and its tokens per request)."""

    ratio: float = 1.0
    samples: int = 0

    def update(self, estimated: int, actual: int) -> None:
        if estimated <= 0 or actual <= 0:
            return
        self.samples += 1
        weight = max(0.05, 1.0 / self.samples)  # a plain mean first, then a moving average
        self.ratio += weight * (actual / estimated - self.ratio)


@dataclass(frozen=True, slots=True)
class TokenCost:
    """A request's estimated prompt tokens, and the completion tokens it reserves."""

    prompt: int
    reserved: int

    @property
    def total(self) -> int:
        return self.prompt + self.reserved


NO_COST = TokenCost(0, 0)


def estimate(body: bytes, *, endpoint: str | None = None) -> TokenCost:
    """The token cost of a request body (any endpoint aiq sends; unknown shapes cost 0); with
    the ``endpoint`` it goes to, the prompt includes its chat template's overhead."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return TokenCost(0, 0)
    if not isinstance(obj, dict):
        return TokenCost(0, 0)
    chars = sum(len(text) for text in _texts(obj))
    prompt = math.ceil(chars / CHARS_PER_TOKEN) if chars else 0
    if endpoint is not None and endpoint.endswith(_TEMPLATED):
        prompt += PER_MESSAGE * _messages(obj) + PER_REQUEST
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


def _messages(obj: dict[str, Any]) -> int:
    """How many turns a chat template wraps: the messages, a system prompt given apart
    (Anthropic's ``system``, Responses' ``instructions``), a Responses ``input``."""
    messages = obj.get("messages")
    n = sum(isinstance(m, dict) for m in messages) if isinstance(messages, list) else 0
    n += sum(bool(obj.get(field)) for field in ("system", "instructions"))
    value = obj.get("input")
    if isinstance(value, str):
        n += 1
    elif isinstance(value, list):
        n += sum(isinstance(item, dict) for item in value) or 1
    return n


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
