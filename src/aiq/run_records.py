"""What a run reports: its live ``Progress``, the ``Export`` of each input file's outputs,
what a batch run did (``BatchRun``) and the ``RunSummary`` at its end.

Plain records beside :mod:`aiq.records` (what the store hands out), so that the views (the
progress display, the metrics file, the text report) and the CLI can read a run's figures
without importing the worker or the runner that produce them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .contract import TIERS, OnTruncated, StopReason
from .errors import FatalProviderError, Interrupted, LimitReached
from .records import EnqueueCounts
from .stats import UNKNOWN_TIER, Stats, TierUsage
from .usage import TokenKinds

__all__ = ["AttemptEvent", "BatchRun", "Export", "Progress", "RunSummary", "TierSpend"]


@dataclass(slots=True, kw_only=True)
class BatchRun:
    """What one batch run did: batches submitted and collected, lines by fate."""

    submitted: list[int] = field(default_factory=list)  # batch ids created by this run
    submitted_lines: int = 0
    collected: list[int] = field(default_factory=list)  # batch ids ingested by this run
    open: int = 0  # batches still with the provider when the run ended
    requeued: dict[str, int] = field(default_factory=dict)
    detached: bool = False
    switched_online: bool = False  # --via auto: the deadline called for online (aiq.auto_run)

    def as_dict(self) -> dict[str, Any]:
        return {
            "submitted": self.submitted,
            "submitted_lines": self.submitted_lines,
            "collected": self.collected,
            "open": self.open,
            "requeued": self.requeued,
            "detached": self.detached,
            "switched_online": self.switched_online,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptEvent:
    """What one attempt of a job came to (aiq.joblog), for a log: ``event`` is done, retry
    (again in ``wait_s``), dead, or requeued (put back as the run stopped, attempts kept).
    ``attempt`` counts this call as the job's next attempt; a call that costs none (a 429)
    leaves the number for the next one too."""

    at: float  # wall clock
    event: str
    custom_id: str | None  # the first input line naming the job, None: none does now
    job_id: int
    attempt: int
    status: int | None = None  # the HTTP status, None: no reply (timeout, connection)
    request_id: str | None = None  # the provider's, when its reply named one
    error_type: str | None = None  # a failure's, or how a done reply stopped short
    message: str | None = None  # the provider's message (the key cut out, as stored)
    wait_s: float | None = None  # a retry's wait before it is due again
    latency_s: float | None = None
    model: str | None = None


@dataclass(slots=True)
class TierSpend:
    """A run's replies billed at one tier, as they are counted."""

    done: int = 0
    cost_usd: float = 0.0  # of the priced ones
    priced: int = 0
    unpriced: int = 0  # done, and of unknown cost

    def add(self, other: TierSpend) -> None:
        self.done += other.done
        self.cost_usd += other.cost_usd
        self.priced += other.priced
        self.unpriced += other.unpriced


@dataclass(slots=True)
class Progress:
    """Live counters of one run; every figure here is already committed to the store."""

    total: int = 0  # jobs in the store
    done: int = 0  # done in the store (including earlier runs)
    dead: int = 0
    done_now: int = 0  # finished by this run
    dead_now: int = 0
    retries: int = 0
    in_flight: int = 0
    max_in_flight: int = 0  # the most in flight at once in this run
    concurrency: int = 0  # senders allowed now (--concurrency auto changes it)
    # What holds --concurrency auto below what the limits (or the server) would take, when not
    # the provider: "max_concurrency 256", the open-files limit, memory. None: nothing.
    held_by: str | None = None
    outage_s: float = 0.0  # how long the provider has been down (0: it is up)
    last_error: str = ""  # the provider's last outage-like error (server, timeout, connection)
    timeouts: int = 0  # calls that got no reply in time: the provider may still bill them
    truncated: int = 0  # replies cut off at max_tokens (done or, --on-truncated dead, dead)
    filtered: int = 0  # replies stopped by a content filter (kept as results)
    limits: str | None = None  # the limits in force (aiq.waits), None: none known
    waiting: str | None = None  # what the run waits for, when it waits (aiq.waits)
    tokens_in: int = 0
    tokens_out: int = 0
    kinds: TokenKinds = field(default_factory=TokenKinds)  # of the tokens, cached and reasoning
    cost_usd: float = 0.0  # of the replies with a price
    unpriced: int = 0  # replies of unknown cost: no price for the model, or unusable usage
    unusable: int = 0  # of those, replies whose usage was missing or not counts
    tiers: dict[str, TierSpend] = field(default_factory=dict)  # the replies per billed tier
    started_at: float = field(default_factory=time.monotonic)

    def billed(self, tier: str | None, cost_usd: float | None, *, done: bool = True) -> None:
        """Count a reply at the tier it was billed at (``done``: its job is done; else dead
        for a stop, billed all the same). The run's own totals are the caller's to add."""
        spend = self.tiers.get(tier or UNKNOWN_TIER)
        if spend is None:
            spend = self.tiers[tier or UNKNOWN_TIER] = TierSpend()
        spend.done += done
        if cost_usd is None:
            spend.unpriced += done
        else:
            spend.priced += 1
            spend.cost_usd += cost_usd

    def tier_usage(self) -> list[TierUsage]:
        """The run's replies per tier, dearest tier first, as ``Stats.tiers``."""
        return [
            TierUsage(tier, s.done, s.cost_usd if s.priced else None, s.unpriced)
            for tier in (*TIERS, UNKNOWN_TIER)
            if (s := self.tiers.get(tier)) is not None
        ]

    def absorb(self, earlier: Progress) -> None:
        """Add what an ``earlier`` part of the same run did (``--via auto``: its batches
        before going online), so the summary is of the whole run; the store's counts are
        this one's, read later."""
        for name in (
            "done_now", "dead_now", "retries", "timeouts", "truncated", "filtered",
            "tokens_in", "tokens_out", "cost_usd", "unpriced", "unusable",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(earlier, name))
        self.kinds.add(earlier.kinds)
        for tier, spend in earlier.tiers.items():
            self.tiers.setdefault(tier, TierSpend()).add(spend)
        self.max_in_flight = max(self.max_in_flight, earlier.max_in_flight)
        self.started_at = min(self.started_at, earlier.started_at)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at

    @property
    def rate_per_s(self) -> float:
        """Jobs finished per second by this run."""
        elapsed = self.elapsed_s
        return self.done_now / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        remaining = self.total - self.done - self.dead
        if remaining <= 0:
            return 0.0
        rate = self.rate_per_s
        return remaining / rate if rate > 0 else None


@dataclass(frozen=True, slots=True)
class Export:
    """What one export wrote for one input file."""

    source: str
    results_path: str
    dead_path: str
    results: int
    dead: int
    written: bool = True  # False: the files were already what the store holds
    # Lines a prune left to the old files that they did not hold (moved, cut, or a new input
    # file asking for a request pruned from another's): in no file now.
    pruned_lost: int = 0


@dataclass(slots=True, kw_only=True)
class RunSummary:
    """What a run or resume did, and where its outputs are."""

    added: EnqueueCounts | None
    progress: Progress
    stats: Stats
    exports: list[Export] = field(default_factory=list)
    # None (ran to the end), "interrupted", "limit" (--max-runtime), "budget" (--max-cost),
    # "fatal"
    stopped: StopReason | None = None
    duration_s: float = 0.0
    on_truncated: OnTruncated = "keep"  # what the run did with replies cut off at max_tokens
    batch: BatchRun | None = None  # what a run --via batch submitted and collected
    fatal: Exception | None = None  # the error that stopped a run --via batch, if one did

    @property
    def exit_code(self) -> int:
        """0 all done, 1 some dead, 4 fatal, 5 a user limit, 130 interrupted (DESIGN.md);
        6 invalid input lines skipped, 7 an empty input file. Input that was skipped comes
        before dead jobs: dead letters are in a file, skipped lines in none."""
        if self.stopped == "fatal":
            return FatalProviderError.exit_code
        if self.stopped in ("limit", "budget"):
            return LimitReached.exit_code
        if self.stopped == "interrupted":
            return Interrupted.exit_code
        if self.added is not None and self.added.exit_code:
            return self.added.exit_code
        return 1 if any(e.dead for e in self.exports) else 0
