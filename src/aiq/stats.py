"""Where the store stands, as ``status`` and the final summary read it: the counts, the rate,
tokens and cost by model and by tier, and whether a run holds the store. Plain records, so
that readers of them need not import the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .contract import StateName
from .usage import TokenKinds

if TYPE_CHECKING:  # in annotations only: `aiq status` reads these records without them
    from .batch_records import Batch


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """Done jobs of one model (None: bodies naming none), their tokens and what they cost
    (with those of replies dead-lettered by ``--on-truncated dead``: they were billed)."""

    model: str | None
    done: int
    tokens_in: int
    tokens_out: int
    cost_usd: float | None  # of the priced jobs; None when none was priced
    unpriced: int  # done jobs whose cost is unknown (no price when done, or unusable usage)
    unusable: int = 0  # of those, replies whose usage was missing or not counts
    kinds: TokenKinds = field(default_factory=TokenKinds)  # cached and reasoning parts

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "done": self.done,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            **self.kinds.as_dict(),
            "cost_usd": self.cost_usd,
            "unpriced": self.unpriced,
            "unusable_usage": self.unusable,
        }


UNKNOWN_TIER = "unknown"  # the tier of a job done before aiq recorded tiers (0011_tiers)


@dataclass(frozen=True, slots=True)
class TierUsage:
    """Done jobs billed at one tier (``contract.Tier``, or :data:`UNKNOWN_TIER`) and what
    they cost, with billed dead ones as in :class:`ModelUsage`: cost per tier."""

    tier: str
    done: int
    cost_usd: float | None  # of the priced jobs; None when none was priced
    unpriced: int  # done jobs whose cost is unknown

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "cost_usd": self.cost_usd, "unpriced": self.unpriced}


RATE_WINDOW_S = 60.0  # status's rate: of the jobs done over the last minute at most


@dataclass(frozen=True, slots=True, kw_only=True)
class RunState:
    """Whether a run holds the store, and what its lock file says of it (lock.run_state).

    Not active with ``started_at`` and no ``ended_at``: the last run died (kill -9, a crash)
    and left its running jobs behind; the next run or resume puts them back in the queue.
    """

    active: bool
    pid: int | None = None
    host: str | None = None
    started_at: float | None = None  # when it took the lock
    sending_since: float | None = None  # when it began sending (its input read and enqueued)
    ended_at: float | None = None

    @property
    def died(self) -> bool:
        return not self.active and self.started_at is not None and self.ended_at is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "active": self.active,
            "died": self.died,
            "pid": self.pid,
            "host": self.host,
            "started_at": self.started_at,
            "sending_since": self.sending_since,
            "ended_at": self.ended_at,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    """Where the store stands, for ``status`` and the final summary."""

    total: int
    counts: dict[StateName, int]
    done_recent: int  # done in the last ``rate_window_s`` seconds
    tokens_in: int
    tokens_out: int
    oldest_queued_s: float | None
    top_errors: list[tuple[str, int]]
    models: list[ModelUsage] = field(default_factory=list)
    # Queued jobs not due yet: retries backing off, jobs waiting for their model's rate limit.
    not_due: int = 0
    rate_window_s: float = RATE_WINDOW_S
    in_flight: int = 0  # running jobs whose request has gone out; the rest are only claimed
    timeouts: int = 0  # calls that got no reply in time, in all runs: each may be billed
    truncated: int = 0  # done jobs whose reply was cut off at max_tokens (aiq.stops)
    truncated_dead: int = 0  # ... dead-lettered for it (--on-truncated dead)
    filtered: int = 0  # jobs whose reply a content filter stopped (kept as results)
    run: RunState | None = None  # None: not looked at (inside a run, which is the one)
    kinds: TokenKinds = field(default_factory=TokenKinds)  # of the tokens, cached and reasoning
    # The provider batches (--via batch): the last few and every open one, and the lines
    # they put back in the queue without costing an attempt, by reason (expired, missing...).
    batches: list[Batch] = field(default_factory=list)
    requeued: dict[str, int] = field(default_factory=dict)
    in_batches: int = 0  # running jobs the provider holds in open batches (not abandoned)
    size_bytes: int | None = None  # the store's file and -wal on disk (None: not looked at)
    tiers: list[TierUsage] = field(default_factory=list)  # done jobs and cost per tier

    @property
    def cost_usd(self) -> float | None:
        """Spent on every priced done job; None when no done job has a price."""
        costs = [m.cost_usd for m in self.models if m.cost_usd is not None]
        return sum(costs) if costs or not self.counts["done"] else None

    @property
    def unpriced(self) -> int:
        """Done jobs whose cost is unknown, left out of ``cost_usd``."""
        return sum(m.unpriced for m in self.models)

    @property
    def unusable(self) -> int:
        """Done jobs whose reply's usage was missing or not counts: tokens and cost unknown."""
        return sum(m.unusable for m in self.models)

    @property
    def active(self) -> bool:
        """Whether a run is working the store (assumed, when ``run`` was not looked at)."""
        return self.run is None or self.run.active

    @property
    def claimed(self) -> int:
        """Running jobs claimed by a live run and not sent yet (waiting for a sender or a
        rate limit); of a run that died, none: all its running jobs are abandoned."""
        # A job in a provider batch counts as in flight (its sent_at is set when planned).
        return self.counts["running"] - self.in_flight if self.active else 0

    @property
    def abandoned(self) -> int:
        """Running jobs of a run that died: back to the queue on the next run or resume
        (not those in open provider batches: resume adopts the batches)."""
        return 0 if self.active else self.counts["running"] - self.in_batches

    @property
    def remaining(self) -> int:
        return self.counts["queued"] + self.counts["running"]

    @property
    def percent_done(self) -> float:
        finished = self.counts["done"] + self.counts["dead"]
        return 100.0 * finished / self.total if self.total else 100.0

    @property
    def rate_per_s(self) -> float:
        """Jobs done per second over the last ``rate_window_s``; 0 with no run active."""
        return self.done_recent / self.rate_window_s if self.active else 0.0

    @property
    def eta_s(self) -> float | None:
        """None when unknown: no run is active, or it has done nothing lately."""
        if not self.remaining:
            return 0.0
        return self.remaining / self.rate_per_s if self.rate_per_s else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "counts": self.counts,
            "percent_done": round(self.percent_done, 2),
            "active": self.active,
            "in_flight": self.in_flight if self.active else 0,
            "claimed": self.claimed,
            "abandoned": self.abandoned,
            "rate_per_s": round(self.rate_per_s, 3),
            "rate_window_s": round(self.rate_window_s, 1),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "run": None if self.run is None else self.run.as_dict(),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            **self.kinds.as_dict(),
            "oldest_queued_s": self.oldest_queued_s,
            "not_due": self.not_due,
            "top_errors": [{"type": t, "count": n} for t, n in self.top_errors],
            "timeouts": self.timeouts,
            "truncated": self.truncated + self.truncated_dead,
            "truncated_dead": self.truncated_dead,
            "content_filtered": self.filtered,
            "cost_usd": self.cost_usd,
            "unpriced": self.unpriced,
            "unusable_usage": self.unusable,
            "models": [m.as_dict() for m in self.models],
            "tiers": {t.tier: t.as_dict() for t in self.tiers},
            "batches": [b.as_dict() for b in self.batches],
            "requeued": self.requeued,
            "in_batches": self.in_batches,
            "size_bytes": self.size_bytes,
        }
