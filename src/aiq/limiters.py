"""One rate limiter per model, with what they allow together.

Providers limit each model on its own and report each model's limits in its own replies'
headers, so a run keeps a :class:`~aiq.limiter.RateLimiter` per model; concurrency sizing
(:mod:`aiq.concurrency`) asks them together how fast and how many at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .budget import HEADROOM
from .limiter import RateLimiter


class Limiters:
    """One RateLimiter per model: providers limit each model on its own, and report each
    model's limits in its own replies' headers. A model named in ``per_model`` gets those
    limits; any other gets ``rpm`` / ``tpm``; unlimited ones may learn theirs from headers."""

    def __init__(
        self,
        *,
        rpm: float | None = None,
        tpm: float | None = None,
        per_model: Mapping[str, tuple[float | None, float | None]] | None = None,
        make: Callable[[float | None, float | None], RateLimiter] | None = None,
    ) -> None:
        self._default = (rpm, tpm)
        self._per_model = dict(per_model or {})
        self._make = make or (lambda r, t: RateLimiter(rpm=r, tpm=t))
        self._by_model: dict[str | None, RateLimiter] = {}
        # Whether more than one limiter is in use: then a sender need not wait for one.
        self.several = False
        # The run's queue for each limiter: how many more jobs wait to go (the worker's).
        self.backlog: Callable[[], float] | None = None

    @classmethod
    def shared(cls, limiter: RateLimiter) -> Limiters:
        """Every model under one limiter (tests, and callers that pass their own)."""
        limiters = cls()
        limiters._make = lambda r, t: limiter
        return limiters

    def for_model(self, model: str | None) -> RateLimiter:
        limiter = self._by_model.get(model)
        if limiter is None:
            rpm, tpm = self._per_model.get(model or "", self._default)
            limiter = self._by_model[model] = self._make(rpm, tpm)
            limiter.backlog = limiter.backlog or self.backlog
            self.several = len({id(lim) for lim in self._by_model.values()}) > 1
        return limiter

    def requests_per_s(self) -> float | None:
        """The pace all models' limits allow together (None while none is known)."""
        rates = [r for lim in set(self._by_model.values()) if (r := lim.requests_per_s())]
        if rates:
            return sum(rates)
        # Before any reply: what the configured request limits say.
        configured = [r for r, _ in (self._default, *self._per_model.values()) if r]
        return max(configured) * HEADROOM / 60.0 if configured else None

    @property
    def bursting(self) -> bool:
        """Whether some model's limiter may send some of its provider's window at once
        (before any, a configured request limit: taken for a bucket full at the start)."""
        if not self._by_model:
            return any(r for r, _ in (self._default, *self._per_model.values()))
        return any(lim.bursting for lim in self._by_model.values())

    def burst_size(self) -> float:
        """How many requests all models' windows let go at once now."""
        if not self._by_model:  # a presumed bucket's first opening, and the next
            return 2.0 if self.bursting else 0.0
        return sum(lim.burst_size() for lim in set(self._by_model.values()))

    @property
    def unpaced(self) -> bool:
        """Whether some model in use has no known request rate: it can keep any number of
        senders busy, whatever the others' limits allow."""
        return any(lim.requests_per_s() is None for lim in self._by_model.values())

    def in_use(self) -> dict[str | None, RateLimiter]:
        """The limiter of each model sent to so far."""
        return dict(self._by_model)

    def configured(self, model: str | None) -> tuple[float | None, float | None]:
        """The (rpm, tpm) the settings give ``model``, before anything the provider says."""
        return self._per_model.get(model or "", self._default)

    @property
    def any_limit(self) -> bool:
        """Whether any limit is known, configured or learned."""
        if any(r or t for r, t in (self._default, *self._per_model.values())):
            return True
        return any(
            lim.limits.rpm or lim.limits.tpm or lim.limits.itpm or lim.limits.otpm
            for lim in self._by_model.values()
        )
