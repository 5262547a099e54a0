"""``aiq run FILE --dry-run``: what a file would send, cost and take, without sending anything.

Output is counted at its ceiling, ``max_tokens`` times ``n``: a bound, as a provider never
bills more (a request that sets no ``max_tokens`` has none, and is counted as ``unbounded``
rather than guessed). Prompts are estimated (``tokens.estimate``): about four characters a
token plus the chat template's few tokens a message and a request, then scaled by the ratio
of real to estimated prompt tokens the store learned from the model's replies
(``calibration``), where it has any. Neither is a bound on prompts, so the cost is called an
estimate, with its basis; the figure at the highest ratio one reply showed (``cost_usd_high``)
bounds it only as far as no prompt runs higher than every one seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import tokens
from .calibration import PromptRatio
from .inputs import KEEP_BAD_LINES, BadLine, Request
from .pricing import Price, price_for
from .records import k64


@dataclass(slots=True)
class ModelForecast:
    """The requests of one model (None: lines naming none) and their estimated tokens."""

    model: str | None
    price: Price | None
    learned: PromptRatio | None = None  # how the model's real prompts ran from the estimate
    requests: int = 0
    estimated_prompt_tokens: int = 0  # by the rule of thumb, before any learned ratio
    output_tokens: int = 0  # the ceiling: max_tokens x n
    unbounded: int = 0  # requests without max_tokens: their output is not counted

    @property
    def prompt_tokens(self) -> int:
        """The prompts' tokens: the estimate at the learned ratio, if any."""
        ratio = 1.0 if self.learned is None else self.learned.ratio
        return round(self.estimated_prompt_tokens * ratio)

    @property
    def prompt_tokens_high(self) -> int | None:
        """At the highest ratio one reply showed; None while nothing is learned."""
        if self.learned is None:
            return None
        return round(self.estimated_prompt_tokens * max(1.0, self.learned.highest))

    @property
    def cost_usd(self) -> float | None:
        """Estimated cost, None when the model has no price."""
        if self.price is None:
            return None
        return self.price.cost_usd(self.prompt_tokens, self.output_tokens)

    @property
    def cost_usd_high(self) -> float | None:
        """The cost with prompts at the highest ratio seen; None: no price, or none learned."""
        high = self.prompt_tokens_high
        if self.price is None or high is None:
            return None
        return self.price.cost_usd(high, self.output_tokens)

    @property
    def basis(self) -> str:
        """What the prompt figure stands on, in words."""
        if self.learned is None:
            return (
                f"about {tokens.CHARS_PER_TOKEN:g} characters a token plus "
                f"{tokens.PER_MESSAGE} a message and {tokens.PER_REQUEST} a request "
                f"(no replies of {self.model or '(none)'} in the store to learn from)"
            )
        n = self.learned.replies
        return (
            f"the ratio learned from {n:,} {'reply' if n == 1 else 'replies'} of "
            f"{self.model or '(none)'} (x{self.learned.ratio:.2f} the rule of thumb; "
            f"the highest one reply showed: x{self.learned.highest:.2f})"
        )

    def as_dict(self) -> dict[str, Any]:
        learned = self.learned
        return {
            "model": self.model,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_high": self.prompt_tokens_high,
            "estimated_prompt_tokens": self.estimated_prompt_tokens,
            "prompt_basis": None
            if learned is None
            else {"replies": learned.replies, "ratio": learned.ratio, "highest": learned.highest},
            "output_tokens": self.output_tokens,
            "unbounded_requests": self.unbounded,
            "cost_usd": self.cost_usd,
            "cost_usd_high": self.cost_usd_high,
            "price": None
            if self.price is None
            else {"input": self.price.input_per_m, "output": self.price.output_per_m},
        }


@dataclass(slots=True)
class Forecast:
    """What ``aiq run FILE`` would send: requests, tokens and cost per model, and the ETA."""

    path: str
    rpm: int | None
    tpm: int | None
    model_limits: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    valid: int = 0  # valid lines
    duplicates: int = 0  # valid lines whose request an earlier line already makes
    done_before: int = 0  # requests the store has done already: not sent again
    dead_before: int = 0  # requests dead in the store: not sent before `aiq replay-dead`
    store_note: str | None = None  # why the store was not consulted, if it was not
    invalid: int = 0  # invalid lines
    bad_lines: list[BadLine] = field(default_factory=list)  # the first KEEP_BAD_LINES
    models: dict[str | None, ModelForecast] = field(default_factory=dict)
    # Valid lines per default they took ({"model": 12, ...}); None when the config sets none.
    defaults: dict[str, int] | None = None

    @property
    def requests(self) -> int:
        """Requests that would be sent."""
        return sum(m.requests for m in self.models.values())

    @property
    def tokens(self) -> int:
        """Tokens they would book against a tokens-per-minute limit."""
        return sum(m.prompt_tokens + m.output_tokens for m in self.models.values())

    @property
    def cost_usd(self) -> float | None:
        """Estimated total; None when no model sent to has a price (see ``unpriced``)."""
        costs = [c for m in self.models.values() if (c := m.cost_usd) is not None]
        return sum(costs) if costs or not self.requests else None

    def tier_cost_usd(self, tier: str) -> float | None:
        """The estimated total sent another way (``batch``, ``flex``): each model's cost at
        its share for that tier (aiq.pricing); None as for :attr:`cost_usd`."""
        costs = [
            c * m.price.tier_share(tier)
            for m in self.models.values()
            if (c := m.cost_usd) is not None and m.price is not None
        ]
        return sum(costs) if costs or not self.requests else None

    @property
    def cost_usd_high(self) -> float | None:
        """The total with every model's prompts at the highest ratio one of its replies
        showed; None unless every priced model sent to has learned one."""
        priced = [m for m in self.models.values() if m.requests and m.price is not None]
        highs = [m.cost_usd_high for m in priced]
        if not priced or any(h is None for h in highs):
            return None
        return sum(h for h in highs if h is not None)

    @property
    def unpriced(self) -> list[str | None]:
        """Models with requests but no price: the total leaves them out."""
        return [m.model for m in self.models.values() if m.requests and m.price is None]

    def limits_of(self, model: str | None) -> tuple[int | None, int | None]:
        """(rpm, tpm) of a model: its own from ``model_limits``, else the run's."""
        return self.model_limits.get(model or "", (self.rpm, self.tpm))

    def _times(self, m: ModelForecast) -> dict[str, float]:
        """Seconds each of the model's limits needs for its requests."""
        rpm, tpm = self.limits_of(m.model)
        times = {}
        if rpm:
            times["rpm"] = m.requests / rpm * 60
        if tpm:
            times["tpm"] = (m.prompt_tokens + m.output_tokens) / tpm * 60
        return times

    @property
    def eta_s(self) -> float | None:
        """The least time the configured limits allow; None when no limit is set. Providers
        limit each model on its own, so models go side by side: the slowest sets the time."""
        times = [t for m in self.models.values() for t in self._times(m).values()]
        return max(times) if times else None

    @property
    def bottleneck(self) -> str | None:
        """Which limit sets the ETA: "rpm" or "tpm"."""
        slowest = [(t, kind) for m in self.models.values() for kind, t in self._times(m).items()]
        return max(slowest)[1] if slowest else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "input": self.path,
            "valid": self.valid,
            "invalid": self.invalid,
            "duplicates": self.duplicates,
            "done_before": self.done_before,
            "dead_before": self.dead_before,
            "store_note": self.store_note,
            "requests": self.requests,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "cost_usd_high": self.cost_usd_high,
            "cost_usd_by_via": {
                "online": self.cost_usd,
                "flex": self.tier_cost_usd("flex"),
                "batch": self.tier_cost_usd("batch"),
            },
            "unpriced_models": self.unpriced,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "bottleneck": self.bottleneck,
            "models": [m.as_dict() for m in self.models.values()],
            "bad_lines": [str(b) for b in self.bad_lines],
            "defaults_applied": self.defaults,
        }


class Forecaster:
    """Counts a file's lines into a Forecast; the caller subtracts what the store has done.

    ``default_output`` is the output ceiling of a request without one, where the provider
    fills it in (Anthropic requires max_tokens; aiq sends the config's default).
    """

    def __init__(
        self,
        forecast: Forecast,
        prices: Mapping[str, Price],
        *,
        default_output: int = 0,
        learned: Mapping[str | None, PromptRatio] | None = None,
    ) -> None:
        self.forecast = forecast
        self._prices = prices
        self._learned = learned or {}
        self._default_output = default_output
        self._seen: set[int] = set()  # job keys (first 8 bytes) already counted

    def add(self, lines: Iterable[Request | BadLine]) -> list[tuple[int, Request]]:
        """Count lines; returns the new distinct requests by short key, for ``count``."""
        f = self.forecast
        fresh: list[tuple[int, Request]] = []
        for line in lines:
            if isinstance(line, BadLine):
                f.invalid += 1
                if len(f.bad_lines) < KEEP_BAD_LINES:
                    f.bad_lines.append(line)
                continue
            f.valid += 1
            k = k64(line.key)
            if k in self._seen:
                f.duplicates += 1
                continue
            self._seen.add(k)
            fresh.append((k, line))
        return fresh

    def count(self, requests: Iterable[Request]) -> None:
        """Add requests that would be sent to their model's figures."""
        for req in requests:
            try:
                model = orjson.loads(req.body).get("model")
            except (orjson.JSONDecodeError, AttributeError):
                model = None
            model = model if isinstance(model, str) else None
            m = self.forecast.models.get(model)
            if m is None:
                m = self.forecast.models[model] = ModelForecast(
                    model, price_for(model, self._prices), self._learned.get(model)
                )
            cost = tokens.estimate(req.body, endpoint=req.endpoint)
            reserved = cost.reserved or self._default_output
            m.requests += 1
            m.estimated_prompt_tokens += cost.prompt
            m.output_tokens += reserved
            m.unbounded += not reserved
