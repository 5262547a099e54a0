"""What the store hands out and takes in: job states, sources, claimed jobs, outcomes, counts
and stats. Plain records, so that readers of them need not import the store."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from .inputs import BadLine

QUEUED, RUNNING, DONE, DEAD = 0, 1, 2, 3
STATE_NAMES = ("queued", "running", "done", "dead")


def k64(key: bytes) -> int:
    """The job's short unique id: the first 8 bytes of its key as a signed 64-bit integer."""
    return int(_K64.unpack_from(key)[0])


_K64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class Source:
    """An input file known to the store, with the output paths it exports to."""

    id: int
    path: str
    out_path: str
    dead_path: str


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed job: what the worker sends."""

    id: int
    endpoint: str
    body: bytes
    attempts: int
    first_attempt_at: float | None
    model: str | None = None
    due_at: float = 0.0  # when it came due; 0: never put back (by a retry or a rate limit)


@dataclass(slots=True)
class Outcome:
    """What became of one attempt; the worker builds it, the store records it in a batch."""

    job_id: int
    state: int  # DONE, QUEUED (retry later) or DEAD
    attempts: int
    started_at: float
    finished_at: float | None = None
    next_at: float = 0.0
    status_code: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    request_id: str | None = None
    response: bytes | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    latency_s: float | None = None
    model: str | None = None  # as the body named it; for cost per model
    cost_usd: float | None = None  # None: the model has no price


@dataclass(slots=True)
class EnqueueCounts:
    """What ``add`` did: lines new to the store, already known, re-pointed, invalid."""

    new: int = 0
    known: int = 0
    changed: int = 0
    invalid: int = 0
    jobs_added: int = 0  # distinct new requests that will be sent
    valid: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)  # the first KEEP_BAD_LINES
    # Valid lines of the file per default they took ({"model": 12, ...}; inputs.count_defaults),
    # when the lines came from read_requests.
    defaults: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """Done jobs of one model (None: bodies naming none), their tokens and what they cost."""

    model: str | None
    done: int
    tokens_in: int
    tokens_out: int
    cost_usd: float | None  # of the priced jobs; None when none was priced
    unpriced: int  # done jobs whose cost is unknown (no price for the model when done)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "done": self.done,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": self.cost_usd,
            "unpriced": self.unpriced,
        }


@dataclass(frozen=True, slots=True)
class Stats:
    """Where the store stands, for ``status`` and the final summary."""

    total: int
    counts: dict[str, int]
    done_last_minute: int
    tokens_in: int
    tokens_out: int
    oldest_queued_s: float | None
    top_errors: list[tuple[str, int]]
    models: list[ModelUsage] = field(default_factory=list)
    # Queued jobs not due yet: retries backing off, jobs waiting for their model's rate limit.
    not_due: int = 0

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
    def remaining(self) -> int:
        return self.counts["queued"] + self.counts["running"]

    @property
    def percent_done(self) -> float:
        finished = self.counts["done"] + self.counts["dead"]
        return 100.0 * finished / self.total if self.total else 100.0

    @property
    def rate_per_s(self) -> float:
        return self.done_last_minute / 60.0

    @property
    def eta_s(self) -> float | None:
        if not self.remaining:
            return 0.0
        return self.remaining / self.rate_per_s if self.rate_per_s else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "counts": self.counts,
            "percent_done": round(self.percent_done, 2),
            "rate_per_s": round(self.rate_per_s, 3),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "oldest_queued_s": self.oldest_queued_s,
            "not_due": self.not_due,
            "top_errors": [{"type": t, "count": n} for t, n in self.top_errors],
            "cost_usd": self.cost_usd,
            "unpriced": self.unpriced,
            "models": [m.as_dict() for m in self.models],
        }
