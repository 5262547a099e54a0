"""The defaults a line can take from the config and flags, and how they are counted.

``inputs`` applies them to each line; a ``Request`` records which it took as ``APPLIED_*``
bits, so `add` and `--dry-run` can say how many lines took each.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import astuple, dataclass


@dataclass(frozen=True, slots=True)
class Defaults:
    """Body defaults from config and flags, applied to lines that leave them out, and the
    priority (``--priority``) of lines that name none: not part of the body."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    system: str | None = None
    priority: int | None = None

    def __bool__(self) -> bool:
        """Whether any body default is set (the priority is not one: nothing to count)."""
        return any(v is not None for v in astuple(self)[:4])


# What a line's ``priority`` may be: a bound a human will not reach, well inside SQLite's
# 64-bit integers (a larger JSON number would not bind).
PRIORITY_MIN, PRIORITY_MAX = -1_000_000_000, 1_000_000_000
PRIORITY_RANGE = f"a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}"


# Which defaults a line took (Request.applied), as bits, for `add` and `--dry-run` to count.
APPLIED_MODEL = 1
APPLIED_MAX_TOKENS = 2
APPLIED_MAX_COMPLETION_TOKENS = 4  # the config's max_tokens, for a reasoning model
APPLIED_TEMPERATURE = 8
APPLIED_SYSTEM = 16
WITHHELD_TEMPERATURE = 32  # the config's temperature, not added: a reasoning model refuses it
DEFAULT_NAMES = {
    APPLIED_MODEL: "model",
    APPLIED_MAX_TOKENS: "max_tokens",
    APPLIED_MAX_COMPLETION_TOKENS: "max_tokens (as max_completion_tokens)",
    APPLIED_TEMPERATURE: "temperature",
    APPLIED_SYSTEM: "system",
    WITHHELD_TEMPERATURE: "temperature withheld",
}


def count_defaults(masks: Sequence[int]) -> dict[str, int]:
    """Lines per default (DEFAULT_NAMES), from ``masks[bits]``: lines that took those bits."""
    counts = dict.fromkeys(DEFAULT_NAMES.values(), 0)
    for bits, lines in enumerate(masks):
        for bit, name in DEFAULT_NAMES.items():
            if bits & bit:
                counts[name] += lines
    return {name: n for name, n in counts.items() if n}


MASKS = 64  # the distinct values of Request.applied


def is_reasoning_model(model: str) -> bool:
    """Whether ``model`` is one of OpenAI's reasoning models (o1, o3, o4-mini, gpt-5 …).

    They reject ``max_tokens`` (they take ``max_completion_tokens``, which counts the reasoning
    tokens too) and any ``temperature`` but the default, unless told ``reasoning_effort:
    "none"`` (gpt-5.1 on). ``gpt-5-chat-*`` is not one. A gateway's ``openai/`` prefix and a
    fine-tune's ``ft:`` are looked through.
    """
    return _REASONING.match(model.rsplit("/", 1)[-1].removeprefix("ft:")) is not None


_REASONING = re.compile(r"(?:o[1-9][0-9]*(?:-|$)|gpt-5(?!-chat)|codex-mini)")
