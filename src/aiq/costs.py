"""What a run spends: each reply priced as it comes in, and the ``--max-cost`` cap kept.

The cap counts what the store has spent in every run so far, what this run has spent, and the
estimated cost of what is in flight. A job is admitted only if its estimate fits under the cap
beside those; one that does not fit waits while others are in flight (they usually cost less
than estimated, which frees room), and when nothing is in flight and it still does not fit, the
run stops. So a run stops within about one job's cost of the cap.

A job's estimate is its prompt (``tokens.estimate``, scaled by how far the replies so far
exceeded such estimates) at the input price, plus its output ceiling (``max_tokens`` x ``n``)
at the output price; a request without ``max_tokens`` is counted at the mean output of the
replies so far. Set ``max_tokens`` for a tight cap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from . import tokens
from .pricing import Price, price_for
from .usage import Usage


@dataclass(slots=True)
class Charge:
    """One job's model, price and estimated cost while it is admitted."""

    model: str | None
    price: Price | None
    prompt_tokens: int = 0  # estimated, before scaling
    estimate_usd: float = 0.0
    held: bool = False  # its estimate counts against the cap until settled or released


class CostMeter:
    """Prices replies; with ``cap_usd``, admits jobs only while the cap allows them."""

    def __init__(
        self,
        prices: Mapping[str, Price],
        *,
        cap_usd: float | None = None,
        spent_usd: float = 0.0,
    ) -> None:
        self._prices = prices
        # Per model: its price_for, in a Charge that jobs share when there is nothing to hold.
        self._plain: dict[str | None, Charge] = {}
        self.cap_usd = cap_usd
        self.spent_usd = spent_usd  # by the store before this run, plus this run's replies
        self.reached = False  # the cap stopped the run
        self.unpriced_model: str | None = None  # a job the cap could not judge, if any
        self._held_usd = 0.0
        self._held = 0  # jobs admitted and not settled (the float sum may keep a residue)
        self._changed = asyncio.Event()
        # For the estimates: how the replies' usage compared with what was estimated.
        self._est_in = self._real_in = self._replies = self._real_out = 0

    def charge(
        self, body: bytes, model: str | None, cost: tokens.TokenCost | None = None
    ) -> Charge:
        """The price of a request body for ``model``, and (under a cap) its estimated cost;
        ``cost`` is the body's token estimate, if the caller has made it already."""
        plain = self._plain.get(model)
        if plain is None:
            plain = self._plain[model] = Charge(model, price_for(model, self._prices))
        if self.cap_usd is None or plain.price is None:
            return plain  # nothing to estimate or hold: one shared Charge per model
        if cost is None:
            cost = tokens.estimate(body)
        ratio = max(1.0, self._real_in / self._est_in) if self._est_in else 1.0
        out = cost.reserved or (self._real_out / self._replies if self._replies else 0)
        return Charge(
            model,
            plain.price,
            cost.prompt,
            plain.price.cost_usd(round(cost.prompt * ratio), round(out)),
        )

    async def admit(self, charge: Charge) -> bool:
        """Wait until the job fits under the cap; False if it never will (the run stops)."""
        if self.cap_usd is None:
            return True
        if charge.price is None:
            self.unpriced_model = charge.model or "(none)"
            return self._stop()
        while self.spent_usd + self._held_usd + charge.estimate_usd > self.cap_usd:
            if self.reached or not self._held:
                return self._stop()
            await self._changed.wait()
        charge.held = True
        self._held += 1
        self._held_usd += charge.estimate_usd
        return True

    def settle(self, charge: Charge, usage: Usage | None, tier: str | None = None) -> float | None:
        """A reply came: its cost at the ``tier`` that served it, now counted as spent. None:
        no price for its model, or its usage was missing or unusable (``Reply.usage``). Such a
        reply's cost is unknown, but
        not nothing: under a cap its estimate is counted as spent instead, so a reply that
        claims to have cost less (or nothing) never makes room for more."""
        self.release(charge)
        if usage is None:
            self.spent_usd += charge.estimate_usd
            return None
        self._est_in += charge.prompt_tokens
        self._real_in += usage.tokens_in if charge.prompt_tokens else 0
        self._replies += 1
        self._real_out += usage.tokens_out
        if charge.price is None:
            return None
        cost = charge.price.tier_cost_usd(usage, tier)
        self.spent_usd += cost
        return cost

    def release(self, charge: Charge) -> None:
        """The job's estimate no longer counts (settled, failed, or never sent)."""
        if charge.held:
            charge.held = False
            self._held -= 1
            self._held_usd = self._held_usd - charge.estimate_usd if self._held else 0.0
            self._wake()

    def _stop(self) -> bool:
        self.reached = True
        self._wake()  # the other senders waiting here stop too
        return False

    def _wake(self) -> None:
        # Waiters hold the old event: setting it wakes them all; later waiters get a new one.
        self._changed.set()
        self._changed = asyncio.Event()
