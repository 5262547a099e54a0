"""What tokens cost: a price table per model, and the cost of a reply's usage.

The default table holds public list prices (USD per million tokens) for common models **as of
PRICES_AS_OF**, for the standard (not batch) rate, with the prompt-cache rates. Prices change
and this table may be out of date: check your provider's pricing page, and put the prices you
pay under ``prices:`` in the config, which overrides this table model by model. A model in
neither has no price: its cost is unknown (None), never 0, so a report cannot understate a bill.

A reply's prompt is priced by kind (``aiq.usage``): OpenAI's cached input at
``cached_input``, Anthropic's cache writes at ``cache_write`` (the 5-minute cache; the 1-hour
cache at twice the input price) and cache reads at ``cache_read``. A price that leaves one out
takes the default table's for the model, scaled to its own input price, else the provider's
usual rate: :data:`CACHED_INPUT`, :data:`CACHE_WRITE`, :data:`CACHE_READ` times the input price.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from .usage import Usage

PRICES_AS_OF = "2025-11"
# The providers' usual prompt-cache rates, as shares of the input price, for a model whose
# price does not say. OpenAI: cached input is half the input price on the models that first
# had prompt caching (GPT-4o, o1, o3-mini: OpenAI's prompt-caching guide, 2024-10); newer
# families are cheaper, and the table below has theirs. Anthropic: a write to the 5-minute
# cache costs 1.25x the input price, to the 1-hour cache 2x, a read 0.1x (Anthropic's
# prompt-caching docs, "Pricing"; ../shared/PROVIDERS.md).
CACHED_INPUT = 0.5
CACHE_WRITE = 1.25
CACHE_WRITE_1H = 2.0
CACHE_READ = 0.1


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million input (prompt) and output (completion) tokens, and per million prompt
    tokens of each cached kind (None: the provider's usual share of the input price)."""

    input_per_m: float
    output_per_m: float
    cached_input_per_m: float | None = None  # OpenAI: read from its prompt cache
    cache_write_per_m: float | None = None  # Anthropic: written to the 5-minute cache
    cache_read_per_m: float | None = None  # Anthropic: read from the prompt cache

    def cost_usd(self, tokens_in: float, tokens_out: float) -> float:
        """What ``tokens_in`` prompt and ``tokens_out`` completion tokens cost, at the plain
        rates (an estimate's: whether a prompt will be cached is not known before)."""
        return (tokens_in * self.input_per_m + tokens_out * self.output_per_m) / 1_000_000

    def usage_cost_usd(self, u: Usage) -> float:
        """What a reply's usage costs, each kind of prompt token at its own rate."""
        i = self.input_per_m
        cached = i * CACHED_INPUT if self.cached_input_per_m is None else self.cached_input_per_m
        write = i * CACHE_WRITE if self.cache_write_per_m is None else self.cache_write_per_m
        read = i * CACHE_READ if self.cache_read_per_m is None else self.cache_read_per_m
        prompt = (
            u.fresh_in * i
            + u.cached * cached
            + (u.cache_write - u.cache_write_1h) * write
            + u.cache_write_1h * i * CACHE_WRITE_1H
            + u.cache_read * read
        )
        return (prompt + u.tokens_out * self.output_per_m) / 1_000_000


# USD per 1M tokens, list prices as of PRICES_AS_OF from the providers' pricing pages; may be
# outdated. OpenAI's: (input, output, cached input; None where the model has no prompt cache).
# The cached-input column was checked against third-party copies of OpenAI's page (2026-12),
# not the page itself: unverified.
_OPENAI: dict[str, tuple[float, float, float | None]] = {
    "gpt-5": (1.25, 10.00, 0.125),
    "gpt-5-mini": (0.25, 2.00, 0.025),
    "gpt-5-nano": (0.05, 0.40, 0.005),
    "gpt-4.1": (2.00, 8.00, 0.50),
    "gpt-4.1-mini": (0.40, 1.60, 0.10),
    "gpt-4.1-nano": (0.10, 0.40, 0.025),
    "gpt-4o": (2.50, 10.00, 1.25),
    "gpt-4o-mini": (0.15, 0.60, 0.075),
    "o3": (2.00, 8.00, 0.50),
    "o3-mini": (1.10, 4.40, 0.55),
    "o4-mini": (1.10, 4.40, 0.275),
    "gpt-3.5-turbo": (0.50, 1.50, None),
    "gpt-3.5-turbo-instruct": (1.50, 2.00, None),
    "text-embedding-3-small": (0.02, 0.0, None),
    "text-embedding-3-large": (0.13, 0.0, None),
    "aiq-simulated": (0.0, 0.0, 0.0),  # --provider simulated: sends nothing, costs nothing
}
# Anthropic's: (input, output); the cache rates are Anthropic's multiples of the input price.
_CLAUDE: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.00, 25.00),
    "claude-opus-4-1": (15.00, 75.00),
    "claude-opus-4": (15.00, 75.00),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-haiku": (0.25, 1.25),
}
DEFAULT_PRICES: dict[str, Price] = {
    **{name: Price(i, o, cached_input_per_m=c) for name, (i, o, c) in _OPENAI.items()},
    **{
        name: Price(i, o, cache_write_per_m=i * CACHE_WRITE, cache_read_per_m=i * CACHE_READ)
        for name, (i, o) in _CLAUDE.items()
    },
}

# A dated snapshot is priced as its family: gpt-4o-2024-08-06, claude-sonnet-4-5-20250929,
# claude-3-5-haiku-latest. Only these suffixes: "o3-pro" is not "o3", and costs ten times more.
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def price_table(overrides: Mapping[str, Price] | None = None) -> dict[str, Price]:
    """The defaults with the config's prices over them. A config price without a cache rate
    takes the default table's for its model, as the same share of its own input price: a
    discount on input (a negotiated price) is then one on cached input too."""
    table = dict(DEFAULT_PRICES)
    for model, price in (overrides or {}).items():
        default = price_for(model, DEFAULT_PRICES)
        table[model] = price if default is None else _cache_rates_from(default, price)
    return table


def _cache_rates_from(default: Price, price: Price) -> Price:
    share = price.input_per_m / default.input_per_m if default.input_per_m else 0.0

    def rate(own: float | None, theirs: float | None) -> float | None:
        return own if own is not None or theirs is None else theirs * share

    return replace(
        price,
        cached_input_per_m=rate(price.cached_input_per_m, default.cached_input_per_m),
        cache_write_per_m=rate(price.cache_write_per_m, default.cache_write_per_m),
        cache_read_per_m=rate(price.cache_read_per_m, default.cache_read_per_m),
    )


def price_for(model: str | None, table: Mapping[str, Price]) -> Price | None:
    """The price of ``model`` (exact name, else its family without a date suffix), or None."""
    if model is None:
        return None
    if (price := table.get(model)) is not None:
        return price
    family = _SNAPSHOT.sub("", model)
    return table.get(family) if family != model else None


_CACHE_KEYS = ("cached_input", "cache_write", "cache_read")  # optional, in Price's order


def parse_prices(raw: object) -> dict[str, Price]:
    """The config's ``prices:`` mapping, ``{model: {input: X, output: Y}}`` with optional
    ``cached_input``, ``cache_write`` and ``cache_read``, validated.

    Raises ValueError saying what is wrong (the caller adds how to write it).
    """
    if not isinstance(raw, Mapping):
        raise ValueError("it is not a mapping of models")
    out: dict[str, Price] = {}
    for model, entry in raw.items():
        if (
            not isinstance(entry, Mapping)
            or not {"input", "output"} <= set(entry)
            or not set(entry) <= {"input", "output", *_CACHE_KEYS}
        ):
            raise ValueError(
                f"{model}: {entry!r} is not {{input: USD, output: USD}} (and optionally "
                f"{', '.join(_CACHE_KEYS)})"
            )
        for name, v in entry.items():
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < math.inf:
                raise ValueError(f"{model}: {name} must be a number, 0 or more (not {v!r})")
        cache = (entry.get(k) for k in _CACHE_KEYS)
        out[str(model)] = Price(
            float(entry["input"]), float(entry["output"]),
            *(None if v is None else float(v) for v in cache),
        )  # fmt: skip
    return out
