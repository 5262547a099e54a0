"""What a reply says it used: its ``usage`` read into token counts by kind, each checked.

The kinds are the ones providers bill apart (../shared/PROVIDERS.md, "Usage and cost fields"):

- OpenAI: ``prompt_tokens`` (``input_tokens`` on /v1/responses) counts the whole prompt, and
  ``prompt_tokens_details.cached_tokens`` (``input_tokens_details``) is the part of it read from
  the prompt cache, billed at the cached-input price; ``completion_tokens`` counts every token
  generated, and ``completion_tokens_details.reasoning_tokens`` (``output_tokens_details``) the
  part spent reasoning, billed as output though it is not in the text.
- Anthropic: ``input_tokens`` leaves the cached part of the prompt out; that is in
  ``cache_creation_input_tokens`` (written to the cache: 1.25x the input price, 2x for the
  1-hour cache, split in ``cache_creation``) and ``cache_read_input_tokens`` (0.1x);
  ``output_tokens_details.thinking_tokens`` is the part of ``output_tokens`` spent thinking.

``tokens_in`` is every prompt token the model read, cached or not, for both providers, so it
means the same whatever the provider: the cached kinds are parts of it, ``reasoning`` is part
of ``tokens_out``.

A reply is trusted only as far as its figures are counts: a total (prompt or output tokens)
that is missing, negative, a float, a string, a bool or null, a part that is any of those but
missing or null, or cached parts that add up to more than the prompt, makes the whole usage
unusable (None). Its cost is then unknown, never a figure that could lower a total. A part
that is null counts as none: both providers' API types declare the parts optional (nullable),
and vLLM sends ``prompt_tokens_details: null``. The reasoning part is only shown, never
priced apart, so one larger than the output is cut to it (Anthropic calls its thinking count
approximate) rather than costing the reply its cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Larger than any reply's real count (a million-token context is 2**20) and small enough to
# stay exact as a float and fit SQLite's 64-bit integers: a count beyond it is no count.
MAX_COUNT = 2**53


@dataclass(frozen=True, slots=True)
class Usage:
    """One reply's tokens by kind. The kinds after ``tokens_out`` are parts of the first two."""

    tokens_in: int  # every prompt token: fresh, cached, written to the cache
    tokens_out: int  # every generated token, reasoning included
    cached: int = 0  # OpenAI: of tokens_in, read from the prompt cache (cached input price)
    cache_write: int = 0  # Anthropic: of tokens_in, written to the prompt cache
    cache_write_1h: int = 0  # of cache_write, to the 1-hour cache (2x the input price)
    cache_read: int = 0  # Anthropic: of tokens_in, read from the prompt cache
    reasoning: int = 0  # of tokens_out, spent reasoning (billed as output, not in the text)

    @property
    def fresh_in(self) -> int:
        """The prompt tokens at the plain input price."""
        return self.tokens_in - self.cached - self.cache_write - self.cache_read


class _Unusable(Exception):
    """A figure that is not a count: the whole usage is unusable."""


def openai_usage(usage: object) -> Usage | None:
    """An OpenAI (or OpenAI-compatible) reply's usage; None when it is missing or unusable.

    Only the prompt figure is required: an embedding has no completion, and a missing detail
    (``prompt_tokens_details: null``, as vLLM sends) is none of that kind.
    """
    if not isinstance(usage, Mapping):
        return None
    try:
        # /v1/responses names them input and output tokens; the rest prompt and completion.
        chat = "prompt_tokens" in usage
        tokens_in = _count(usage, "prompt_tokens" if chat else "input_tokens", required=True)
        tokens_out = _count(usage, "completion_tokens" if chat else "output_tokens")
        ins = _details(usage, "prompt_tokens_details" if chat else "input_tokens_details")
        outs = _details(usage, "completion_tokens_details" if chat else "output_tokens_details")
        cached, reasoning = _part(ins, "cached_tokens"), _part(outs, "reasoning_tokens")
    except _Unusable:
        return None
    if cached > tokens_in:
        return None  # priced apart from the rest, it would take the rest below zero
    return Usage(tokens_in, tokens_out, cached=cached, reasoning=min(reasoning, tokens_out))


def anthropic_usage(usage: object) -> Usage | None:
    """An Anthropic Message's usage; None when it is missing or unusable."""
    if not isinstance(usage, Mapping):
        return None
    try:
        fresh = _count(usage, "input_tokens", required=True)
        written = _part(usage, "cache_creation_input_tokens")
        read = _part(usage, "cache_read_input_tokens")
        tokens_out = _count(usage, "output_tokens")
        hour = _part(_details(usage, "cache_creation"), "ephemeral_1h_input_tokens")
        thinking = _part(_details(usage, "output_tokens_details"), "thinking_tokens")
    except _Unusable:
        return None
    total = fresh + written + read
    if hour > written or total >= MAX_COUNT:
        return None
    return Usage(
        total,
        tokens_out,
        cache_write=written,
        cache_write_1h=hour,
        cache_read=read,
        reasoning=min(thinking, tokens_out),
    )


def _count(usage: Mapping[str, Any], name: str, *, required: bool = False) -> int:
    """The count ``usage[name]``; 0 when absent (unless ``required``)."""
    if name not in usage:
        if required:
            raise _Unusable(name)
        return 0
    value = usage[name]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_COUNT:
        raise _Unusable(name)
    return value


def _part(usage: Mapping[str, Any], name: str) -> int:
    """A part's count ``usage[name]``; 0 when absent or null."""
    return 0 if usage.get(name) is None else _count(usage, name)


def _details(usage: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A details object; absent or null is one with nothing in it, anything else unusable."""
    value = usage.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _Unusable(name)
    return value


@dataclass(slots=True)
class TokenKinds:
    """The cached and reasoning parts of many replies' tokens, summed."""

    cached: int = 0
    cache_write: int = 0
    cache_read: int = 0
    reasoning: int = 0

    def add(self, u: Usage | TokenKinds) -> None:
        self.cached += u.cached
        self.cache_write += u.cache_write
        self.cache_read += u.cache_read
        self.reasoning += u.reasoning

    def as_dict(self) -> dict[str, int]:
        """As ``--json`` names them, beside ``tokens_in`` and ``tokens_out``."""
        return {
            "tokens_cached": self.cached,
            "tokens_cache_write": self.cache_write,
            "tokens_cache_read": self.cache_read,
            "tokens_reasoning": self.reasoning,
        }
