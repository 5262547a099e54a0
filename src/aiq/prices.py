"""The price table in force, row by row: aiq's dated defaults with the config's ``prices:`` over
them, where each row came from, and whether a default is old enough to check again.

``aiq prices`` prints it and ``aiq check`` judges the models a run would use by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

from .pricing import (
    DEFAULT_CHECKS,
    DEFAULT_PRICES,
    PRICE_MAX_AGE_DAYS,
    Price,
    PriceCheck,
    price_table,
    priced_as,
)

DEFAULT, CONFIG = "default", "config"


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One model's price in force: ``source`` is DEFAULT (aiq's table, with its ``check``) or
    CONFIG (the config's ``prices:``, which aiq cannot date: it is what the user says they pay)."""

    model: str
    price: Price
    source: str
    check: PriceCheck | None = None

    def stale(self, today: date) -> bool:
        """A default checked longer than PRICE_MAX_AGE_DAYS before ``today``; never a config's."""
        return self.check is not None and self.check.stale(today)

    def as_dict(self, today: date) -> dict[str, Any]:
        p, c = self.price, self.check
        return {
            "model": self.model,
            "input": p.input_per_m,
            "output": p.output_per_m,
            "cached_input": p.cached_input_per_m,
            "cache_write": p.cache_write_per_m,
            "cache_read": p.cache_read_per_m,
            "source": self.source,
            "checked": None if c is None or c.checked is None else c.checked.isoformat(),
            "where": None if c is None else c.where,
            "confirmed": None if c is None else c.confirmed,
            "age_days": None if c is None else c.age_days(today),
            "stale": self.stale(today),
        }


def prices_in_force(overrides: Mapping[str, Price] | None = None) -> list[PriceRow]:
    """Every priced model: the defaults in their table's order, a config price in place of a
    default it overrides, then the config's other models by name."""
    overrides = overrides or {}
    table = price_table(overrides)
    rows = [row_for(model, table, overrides) for model in DEFAULT_PRICES]
    rows += [row_for(m, table, overrides) for m in sorted(overrides) if m not in DEFAULT_PRICES]
    return [r for r in rows if r is not None]


def row_for(
    model: str | None, table: Mapping[str, Price], overrides: Mapping[str, Price]
) -> PriceRow | None:
    """The row ``model`` is priced by (its own, or its family's for a dated snapshot), named
    for ``model``; None when it has no price. ``table`` is ``price_table(overrides)``."""
    name = priced_as(model, table)
    if model is None or name is None:
        return None
    if name in overrides:
        return PriceRow(model, table[name], CONFIG)
    return PriceRow(model, table[name], DEFAULT, DEFAULT_CHECKS[name])


def table_lines(rows: list[PriceRow], today: date) -> list[str]:
    """``aiq prices`` as text: one line a model, USD per 1M tokens, then how to change one."""
    width = max((len(r.model) for r in rows), default=5)
    head = f"{'model':<{width}}  {'input':>8} {'output':>8} {'cached':>8} {'c.write':>8} "
    lines = [head + f"{'c.read':>8}  source"]
    for r in rows:
        p = r.price
        figures = (p.input_per_m, p.output_per_m, p.cached_input_per_m, p.cache_write_per_m)
        cells = " ".join(_usd(v) for v in (*figures, p.cache_read_per_m))
        lines.append(f"{r.model:<{width}}  {cells}  {_source(r, today)}")
    lines += [
        "USD per 1M tokens (standard rate); cached: OpenAI's cached input, c.write / c.read: "
        "Anthropic's 5-minute cache write and cache read; -: the provider's usual share of input",
        f"a default checked over {PRICE_MAX_AGE_DAYS} days ago may be out of date: set the prices "
        "you pay under `prices:` in the config, {MODEL: {input: USD, output: USD}}; "
        "`aiq prices --json` has each default's source",
    ]
    return lines


def _usd(value: float | None) -> str:
    return f"{'-' if value is None else f'{value:g}':>8}"


def _source(r: PriceRow, today: date) -> str:
    if r.check is None:
        over = " (over aiq's default)" if r.model in DEFAULT_PRICES else ""
        return f"config{over}"
    if r.check.checked is None:
        return f"default ({r.check.where})"
    how = "checked" if r.check.confirmed else "unverified, written"
    age = f", {r.check.age_days(today)} days ago: check it" if r.stale(today) else ""
    return f"default, {how} {r.check.checked.isoformat()}{age}"
