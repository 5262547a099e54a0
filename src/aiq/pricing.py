"""What tokens cost: a price table per model, and the cost of a reply's usage.

The default table holds public list prices (USD per million tokens) for common models, for the
standard (not batch) rate, with the prompt-cache rates; each is dated with where and when it
was checked (:data:`DEFAULT_CHECKS`; ``aiq check`` warns of one older than
:data:`PRICE_MAX_AGE_DAYS`). Prices change and this table may be out of date: check your
provider's pricing page, and put the prices you pay under ``prices:`` in the config, which
overrides this table model by model. A model in
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
from datetime import date

from .usage import Usage

PRICE_MAX_AGE_DAYS = 180  # a default price checked longer ago than this may be out of date
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


# What a tier's tokens cost against the list price, unless a model's price says otherwise
# (``batch_share``, ``flex_share``): a batch is half (OpenAI's Batch guide: "50% cost
# discount"; Anthropic's Message Batches: "50% of standard API prices"), and OpenAI prices
# flex "at Batch API rates" (its flex-processing guide). A priority tier costs more, by a
# table per model not kept here: priced at the list price.
TIER_SHARE = {"batch": 0.5, "flex": 0.5}


@dataclass(frozen=True, slots=True)
class PriceCheck:
    """When a default price was last checked against its source (None: it has no list price
    to check, as the simulated provider's), and the source: a URL, or why there is none.
    ``confirmed`` is False for a figure no source confirmed: ``checked`` is then the date it
    was written down."""

    checked: date | None
    where: str
    confirmed: bool = True

    def age_days(self, today: date) -> int | None:
        """Days since the check, on ``today``; None for a price with nothing to check."""
        return None if self.checked is None else (today - self.checked).days

    def stale(self, today: date, max_age_days: int = PRICE_MAX_AGE_DAYS) -> bool:
        """Whether the check is older than ``max_age_days`` on ``today``."""
        age = self.age_days(today)
        return age is not None and age > max_age_days


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million input (prompt) and output (completion) tokens, and per million prompt
    tokens of each cached kind (None: the provider's usual share of the input price)."""

    input_per_m: float
    output_per_m: float
    cached_input_per_m: float | None = None  # OpenAI: read from its prompt cache
    cache_write_per_m: float | None = None  # Anthropic: written to the 5-minute cache
    cache_read_per_m: float | None = None  # Anthropic: read from the prompt cache
    batch_share: float | None = None  # of these prices, in a batch (None: TIER_SHARE's)
    flex_share: float | None = None  # ...at the flex tier

    def cost_usd(self, tokens_in: float, tokens_out: float) -> float:
        """What ``tokens_in`` prompt and ``tokens_out`` completion tokens cost, at the plain
        rates (an estimate's: whether a prompt will be cached is not known before)."""
        return (tokens_in * self.input_per_m + tokens_out * self.output_per_m) / 1_000_000

    def tier_cost_usd(self, u: Usage, tier: str | None) -> float:
        """What a reply's usage costs at the tier that served it (``batch``: a provider's
        batch engine): at the model's share for it, else :data:`TIER_SHARE`'s, any other tier
        at the list price."""
        return self.usage_cost_usd(u) * self.tier_share(tier)

    def tier_share(self, tier: str | None) -> float:
        """What ``tier`` costs against these prices."""
        own = {"batch": self.batch_share, "flex": self.flex_share}.get(tier or "")
        return own if own is not None else TIER_SHARE.get(tier or "", 1.0)

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


# Where and when each default price was checked. A check read the figures off the stored copy
# of the provider's own page that the team's search tool holds (its crawl date is not known;
# the newest Anthropic copy lists models released in 2026), on the date given. A figure no
# provider page could confirm is kept, dated when it was written down (from memory, 2025-11),
# and says so: dropping it would leave the model's cost unknown, and --max-cost would refuse
# to run it, where third-party copies of the providers' pages agree with the figure. Being
# older than PRICE_MAX_AGE_DAYS, such a price makes ``aiq check`` warn until it is checked.
_UNCHECKED_ON = date(2025, 11, 1)
_CHECKED_ON = date(2026, 12, 1)
_ANTHROPIC_PAGE = "https://platform.claude.com/docs/en/docs/about-claude/pricing"


def _openai_page(model: str) -> str:
    return f"https://developers.openai.com/api/docs/models/{model}"


_UNVERIFIED = PriceCheck(
    _UNCHECKED_ON,
    "from memory; no stored copy of an OpenAI page confirmed it, third-party copies agree",
    confirmed=False,
)

# USD per 1M tokens, standard (not batch) list prices. OpenAI's: (input, output, cached input;
# None where the model has no prompt cache), and the check.
_OPENAI: dict[str, tuple[float, float, float | None, PriceCheck]] = {
    "gpt-5": (1.25, 10.00, 0.125, _UNVERIFIED),
    "gpt-5-mini": (0.25, 2.00, 0.025, PriceCheck(_CHECKED_ON, _openai_page("gpt-5-mini"))),
    "gpt-5-nano": (0.05, 0.40, 0.005, PriceCheck(_CHECKED_ON, _openai_page("gpt-5-nano"))),
    "gpt-4.1": (2.00, 8.00, 0.50, _UNVERIFIED),
    "gpt-4.1-mini": (0.40, 1.60, 0.10, _UNVERIFIED),
    "gpt-4.1-nano": (0.10, 0.40, 0.025, _UNVERIFIED),
    "gpt-4o": (2.50, 10.00, 1.25, _UNVERIFIED),
    "gpt-4o-mini": (0.15, 0.60, 0.075, _UNVERIFIED),
    "o3": (2.00, 8.00, 0.50, _UNVERIFIED),
    "o3-mini": (1.10, 4.40, 0.55, _UNVERIFIED),
    "o4-mini": (1.10, 4.40, 0.275, _UNVERIFIED),
    "gpt-3.5-turbo": (0.50, 1.50, None, _UNVERIFIED),
    "gpt-3.5-turbo-instruct": (1.50, 2.00, None, _UNVERIFIED),
    "text-embedding-3-small": (0.02, 0.0, None, _UNVERIFIED),
    "text-embedding-3-large": (0.13, 0.0, None, _UNVERIFIED),
    # --provider simulated: sends nothing, costs nothing; no list price, so never out of date.
    "aiq-simulated": (0.0, 0.0, 0.0, PriceCheck(None, "aiq's simulated provider")),
}
# Anthropic's: (input, output, 5-minute cache write, cache read), all from its pricing page
# ("Model pricing"), checked _CHECKED_ON; the 1-hour cache write is 2x input on every row.
# Haiku 3's cache rates are not the usual multiples (1.2x and 0.12x), hence each row's own.
_CLAUDE: dict[str, tuple[float, float, float, float]] = {
    "claude-opus-4-5": (5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-1": (15.00, 75.00, 18.75, 1.50),
    "claude-opus-4": (15.00, 75.00, 18.75, 1.50),
    "claude-sonnet-4-5": (3.00, 15.00, 3.75, 0.30),
    "claude-sonnet-4": (3.00, 15.00, 3.75, 0.30),
    "claude-3-7-sonnet": (3.00, 15.00, 3.75, 0.30),
    "claude-haiku-4-5": (1.00, 5.00, 1.25, 0.10),
    "claude-3-5-haiku": (0.80, 4.00, 1.00, 0.08),
    "claude-3-haiku": (0.25, 1.25, 0.30, 0.03),
}
DEFAULT_PRICES: dict[str, Price] = {
    **{name: Price(i, o, cached_input_per_m=c) for name, (i, o, c, _) in _OPENAI.items()},
    **{
        name: Price(i, o, cache_write_per_m=w, cache_read_per_m=r)
        for name, (i, o, w, r) in _CLAUDE.items()
    },
}
# Each default price's check: when, and against what.
DEFAULT_CHECKS: dict[str, PriceCheck] = {
    **{name: row[3] for name, row in _OPENAI.items()},
    **{name: PriceCheck(_CHECKED_ON, _ANTHROPIC_PAGE) for name in _CLAUDE},
}
# The oldest check of any default price, as a month.
PRICES_AS_OF = min(c.checked for c in DEFAULT_CHECKS.values() if c.checked).strftime("%Y-%m")

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
    name = priced_as(model, table)
    return None if name is None else table[name]


def priced_as(model: str | None, table: Mapping[str, object]) -> str | None:
    """The name ``model`` is priced under in ``table``: its own, else its family's, or None."""
    if model is None:
        return None
    if model in table:
        return model
    family = _SNAPSHOT.sub("", model)
    return family if family != model and family in table else None


_CACHE_KEYS = ("cached_input", "cache_write", "cache_read")  # optional, in Price's order
_SHARE_KEYS = ("batch_share", "flex_share")  # optional, Price's own names


def parse_prices(raw: object) -> dict[str, Price]:
    """The config's ``prices:`` mapping, ``{model: {input: X, output: Y}}`` with optional
    ``cached_input``, ``cache_write`` and ``cache_read``, and the shares of those prices a
    batch and the flex tier cost (``batch_share``, ``flex_share``: above 0, at most 1),
    validated.

    Raises ValueError saying what is wrong (the caller adds how to write it).
    """
    if not isinstance(raw, Mapping):
        raise ValueError("it is not a mapping of models")
    out: dict[str, Price] = {}
    for model, entry in raw.items():
        if (
            not isinstance(entry, Mapping)
            or not {"input", "output"} <= set(entry)
            or not set(entry) <= {"input", "output", *_CACHE_KEYS, *_SHARE_KEYS}
        ):
            raise ValueError(
                f"{model}: {entry!r} is not {{input: USD, output: USD}} (and optionally "
                f"{', '.join((*_CACHE_KEYS, *_SHARE_KEYS))})"
            )
        for name, v in entry.items():
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < math.inf:
                raise ValueError(f"{model}: {name} must be a number, 0 or more (not {v!r})")
            if name in _SHARE_KEYS and not 0 < v <= 1:
                raise ValueError(
                    f"{model}: {name} is a share of the list price, above 0 and at most 1 "
                    f"(0.5 for half), not {v!r}"
                )
        cache = (entry.get(k) for k in _CACHE_KEYS)
        shares = {k: float(entry[k]) for k in _SHARE_KEYS if k in entry}
        out[str(model)] = Price(
            float(entry["input"]), float(entry["output"]),
            *(None if v is None else float(v) for v in cache), **shares,
        )  # fmt: skip
    return out
