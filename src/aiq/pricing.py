"""What tokens cost: a price table per model, and the cost of a reply's usage.

The default table holds public list prices (USD per million tokens) for common models **as of
PRICES_AS_OF**, for the standard (not batch, not cached) rate. Prices change and this table
may be out of date: check your provider's pricing page, and put the prices you pay under
``prices:`` in the config, which overrides this table model by model. A model in neither has
no price: its cost is unknown (None), never 0, so a report cannot understate a bill.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

PRICES_AS_OF = "2025-11"


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million input (prompt) and output (completion) tokens."""

    input_per_m: float
    output_per_m: float

    def cost_usd(self, tokens_in: float, tokens_out: float) -> float:
        """What ``tokens_in`` prompt and ``tokens_out`` completion tokens cost."""
        return (tokens_in * self.input_per_m + tokens_out * self.output_per_m) / 1_000_000


# (input, output) USD per 1M tokens, list prices as of PRICES_AS_OF; may be outdated.
DEFAULT_PRICES: dict[str, Price] = {
    name: Price(i, o)
    for name, (i, o) in {
        "gpt-5": (1.25, 10.00),
        "gpt-5-mini": (0.25, 2.00),
        "gpt-5-nano": (0.05, 0.40),
        "gpt-4.1": (2.00, 8.00),
        "gpt-4.1-mini": (0.40, 1.60),
        "gpt-4.1-nano": (0.10, 0.40),
        "gpt-4o": (2.50, 10.00),
        "gpt-4o-mini": (0.15, 0.60),
        "o3": (2.00, 8.00),
        "o3-mini": (1.10, 4.40),
        "o4-mini": (1.10, 4.40),
        "gpt-3.5-turbo": (0.50, 1.50),
        "gpt-3.5-turbo-instruct": (1.50, 2.00),
        "text-embedding-3-small": (0.02, 0.0),
        "text-embedding-3-large": (0.13, 0.0),
        "claude-opus-4-5": (5.00, 25.00),
        "claude-opus-4-1": (15.00, 75.00),
        "claude-opus-4": (15.00, 75.00),
        "claude-sonnet-4-5": (3.00, 15.00),
        "claude-sonnet-4": (3.00, 15.00),
        "claude-3-7-sonnet": (3.00, 15.00),
        "claude-haiku-4-5": (1.00, 5.00),
        "claude-3-5-haiku": (0.80, 4.00),
        "claude-3-haiku": (0.25, 1.25),
        "aiq-simulated": (0.0, 0.0),  # --provider simulated: sends nothing, costs nothing
    }.items()
}

# A dated snapshot is priced as its family: gpt-4o-2024-08-06, claude-sonnet-4-5-20250929,
# claude-3-5-haiku-latest. Only these suffixes: "o3-pro" is not "o3", and costs ten times more.
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def price_table(overrides: Mapping[str, Price] | None = None) -> dict[str, Price]:
    """The defaults with the config's prices over them."""
    return {**DEFAULT_PRICES, **(overrides or {})}


def price_for(model: str | None, table: Mapping[str, Price]) -> Price | None:
    """The price of ``model`` (exact name, else its family without a date suffix), or None."""
    if model is None:
        return None
    if (price := table.get(model)) is not None:
        return price
    family = _SNAPSHOT.sub("", model)
    return table.get(family) if family != model else None


def parse_prices(raw: object) -> dict[str, Price]:
    """The config's ``prices:`` mapping, ``{model: {input: X, output: Y}}``, validated.

    Raises ValueError saying what is wrong (the caller adds how to write it).
    """
    if not isinstance(raw, Mapping):
        raise ValueError("it is not a mapping of models")
    out: dict[str, Price] = {}
    for model, entry in raw.items():
        if not isinstance(entry, Mapping) or set(entry) != {"input", "output"}:
            raise ValueError(f"{model}: {entry!r} is not {{input: USD, output: USD}}")
        values = [entry["input"], entry["output"]]
        if not all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf
            for v in values
        ):
            raise ValueError(f"{model}: input and output must be numbers, 0 or more")
        out[str(model)] = Price(float(values[0]), float(values[1]))
    return out
