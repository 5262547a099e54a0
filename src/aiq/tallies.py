"""Counts kept as jobs change, and where the store stands (``Stats``) read from them.

The ``tallies`` table (migrations 0008_tallies, 0011_tiers) holds, per (state, model,
error_type, tier), how many jobs there are and their sums. Triggers on the jobs keep them as
rows change or go, in the statement's own transaction: a crash cannot leave them out of step
with the jobs, and no write path (nor a hand-made fix with sqlite3) can forget them. A
claim, a release, a deferral and a sent mark change no tally (queued and running share one
tally state): the trigger's WHEN skips them. New rows are counted by ``add_queued``, once an
add's batch: an insert trigger took the inserts 35-55% longer (bench/tally_cost.py has the
figures, and the explicit updates measured against the triggers).

What a tally cannot hold is read from an index: the running jobs (a run's claimed few), the
jobs done in the last minute, queued jobs not due yet, and the oldest queued job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from .contract import TIERS, StateName
from .records import DEAD, DONE, QUEUED, RUNNING, STATE_NAMES
from .stats import RATE_WINDOW_S, UNKNOWN_TIER, ModelUsage, Stats, TierUsage
from .stops import CONTENT_FILTER, TRUNCATED
from .usage import TokenKinds

if TYPE_CHECKING:
    import aiosqlite  # `aiq status` reads over aiq.blocking, without it

_STOPS = (TRUNCATED, CONTENT_FILTER)  # error types of a done job: how its reply stopped short
UNFINISHED = QUEUED  # a tally's state for queued and running jobs both
_TIER_ORDER = (*TIERS, UNKNOWN_TIER)  # status lists the tiers so, dearest first


def _tier_rank(tier: str) -> tuple[int, str]:
    # (A tier no aiq writes, set by hand in the store, comes last rather than not at all.)
    return (_TIER_ORDER.index(tier) if tier in _TIER_ORDER else len(_TIER_ORDER), tier)


class Tally(NamedTuple):
    """One row of ``tallies``: the jobs of one (state, model, error_type, tier) and their
    sums."""

    state: int  # QUEUED stands for queued and running (UNFINISHED)
    model: str | None
    error_type: str | None
    tier: str | None  # contract.Tier that billed the reply; None: no reply, or not recorded
    jobs: int
    usable: int  # jobs whose tokens are known
    priced: int  # jobs whose cost is known
    cost_usd: float
    timeouts: int
    tokens_in: int
    tokens_out: int
    kinds: TokenKinds

    @property
    def cost(self) -> float | None:
        """The priced jobs' cost; None when none was priced."""
        return self.cost_usd if self.priced else None


# A tally's figures, in Tally's order after its key.
_FIGURES = (
    "jobs", "usable", "priced", "cost_usd", "timeouts", "tokens_in", "tokens_out",
    "tokens_cached", "tokens_cache_write", "tokens_cache_read", "tokens_reasoning",
)  # fmt: skip
TALLY_COLUMNS = f"state, model, error_type, tier, {', '.join(_FIGURES)}"
# Adds a row's figures to its tally (the key's unique index is the conflict target).
_UPSERT = (
    "ON CONFLICT (state, ifnull(model, x'00'), ifnull(error_type, x'00'), ifnull(tier, x'00')) "
    "DO UPDATE SET "
    f"{', '.join(f'{c} = {c} + excluded.{c}' for c in _FIGURES)}"
)


async def add_queued(db: aiosqlite.Connection, jobs: int) -> None:
    """Count ``jobs`` new jobs, queued with nothing recorded yet (an add's), in the caller's
    transaction."""
    await db.execute(
        f"INSERT INTO tallies (state, model, error_type, {', '.join(_FIGURES)}) "
        f"VALUES ({UNFINISHED}, NULL, NULL, ?, {', '.join(['0'] * (len(_FIGURES) - 1))}) {_UPSERT}",
        (jobs,),
    )


async def tallies(db: aiosqlite.Connection) -> list[Tally]:
    """The kept tallies of jobs that exist (a tally that fell to no job is left out)."""
    rows = await db.execute_fetchall(
        f"SELECT {TALLY_COLUMNS} FROM tallies WHERE jobs > 0 "
        "ORDER BY state, model, error_type, tier"
    )
    return [Tally._make((*r[:11], TokenKinds(*r[11:]))) for r in rows]


async def job_counts(db: aiosqlite.Connection) -> tuple[int, int]:
    """(jobs, jobs not done), from the tallies."""
    ((total, unfinished),) = await db.execute_fetchall(
        "SELECT coalesce(sum(jobs), 0), coalesce(sum(CASE WHEN state != ? THEN jobs END), 0) "
        "FROM tallies",
        (DONE,),
    )
    return int(total), int(unfinished)


async def dead_error_types(db: aiosqlite.Connection) -> dict[str, int]:
    """Dead jobs by the type of their last error, most first (``?``: a job without one)."""
    rows = await db.execute_fetchall(
        "SELECT coalesce(error_type, '?') AS t, sum(jobs) AS n FROM tallies WHERE state = ? "
        "GROUP BY t HAVING n > 0 ORDER BY n DESC, t",
        (DEAD,),
    )
    return {t: n for t, n in rows}


async def read_stats(db: aiosqlite.Connection, *, now: float, since: float | None) -> Stats:
    """Counts by state, the recent rate, tokens, oldest waiting age and top errors; see
    ``JobStore.stats``. A few rows and four index ranges: no scan of the jobs."""
    window_s = RATE_WINDOW_S if since is None else min(RATE_WINDOW_S, now - since)
    window_s = max(1.0, window_s)  # a run a moment old: no rate from a handful of jobs
    sums = _Sums()
    for tally in await tallies(db):
        sums.add(tally)
    ((running, in_flight),) = await db.execute_fetchall(  # ranges of the (state, next_at) index
        "SELECT count(*), count(sent_at) FROM jobs WHERE state = ?", (RUNNING,)
    )
    ((recent,),) = await db.execute_fetchall(  # a done job's next_at is when it finished
        "SELECT count(*) FROM jobs WHERE state = ? AND next_at > ?", (DONE, now - window_s)
    )
    ((not_due,),) = await db.execute_fetchall(
        "SELECT count(*) FROM jobs WHERE state = ? AND next_at > ?", (QUEUED, now)
    )
    ((oldest,),) = await db.execute_fetchall(
        # The partial index's own term, literally: a bound parameter would not select it.
        f"SELECT min(created_at) FROM jobs INDEXED BY jobs_queued_created WHERE state = {QUEUED}"
    )
    counts = sums.counts
    counts["queued"] -= running
    counts["running"] = running
    return Stats(
        total=sum(counts.values()),
        counts=counts,
        done_recent=recent,
        rate_window_s=window_s,
        in_flight=in_flight,
        tokens_in=sums.tokens_in,
        tokens_out=sums.tokens_out,
        oldest_queued_s=None if oldest is None else round(max(0.0, now - oldest), 1),
        top_errors=sorted(sums.errors.items(), key=lambda e: (-e[1], e[0]))[:5],
        models=[  # in SQLite's order: no model first
            sums.models[m].usage(m) for m in sorted(sums.models, key=lambda m: (m is not None, m))
        ],
        tiers=[sums.tiers[t].tier(t) for t in sorted(sums.tiers, key=_tier_rank)],
        not_due=not_due,
        timeouts=sums.timeouts,
        kinds=sums.kinds,
        truncated=sums.stops.get((DONE, TRUNCATED), 0),
        truncated_dead=sums.stops.get((DEAD, TRUNCATED), 0),
        filtered=sums.stops.get((DONE, CONTENT_FILTER), 0)
        + sums.stops.get((DEAD, CONTENT_FILTER), 0),
    )


@dataclass(slots=True)
class _ModelSums:
    """ModelUsage's figures while the tallies are added up."""

    done: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    unpriced: int = 0
    unusable: int = 0
    kinds: TokenKinds = field(default_factory=TokenKinds)

    def add(self, t: Tally) -> None:
        """The tokens and cost of ``t``'s jobs (billed replies: done, or dead for a stop)."""
        self.tokens_in += t.tokens_in
        self.tokens_out += t.tokens_out
        if (cost := t.cost) is not None:  # None while no job of the model had a price
            self.cost_usd = (self.cost_usd or 0.0) + cost
        self.kinds.add(t.kinds)

    def tier(self, tier: str) -> TierUsage:
        return TierUsage(tier, self.done, self.cost_usd, self.unpriced)

    def usage(self, model: str | None) -> ModelUsage:
        return ModelUsage(
            model, self.done, self.tokens_in, self.tokens_out, self.cost_usd, self.unpriced,
            unusable=self.unusable, kinds=self.kinds,
        )  # fmt: skip


@dataclass(slots=True)
class _Sums:
    """Stats' figures while the tallies are added up."""

    counts: dict[StateName, int] = field(default_factory=lambda: dict.fromkeys(STATE_NAMES, 0))
    tokens_in: int = 0
    tokens_out: int = 0
    timeouts: int = 0
    kinds: TokenKinds = field(default_factory=TokenKinds)
    stops: dict[tuple[int, str], int] = field(default_factory=dict)  # (state, stop) -> jobs
    errors: dict[str, int] = field(default_factory=dict)  # last errors of jobs not done
    models: dict[str | None, _ModelSums] = field(default_factory=dict)
    tiers: dict[str, _ModelSums] = field(default_factory=dict)  # the same figures per tier

    def add(self, t: Tally) -> None:
        self.counts[STATE_NAMES[t.state]] += t.jobs
        self.tokens_in += t.tokens_in
        self.tokens_out += t.tokens_out
        self.timeouts += t.timeouts
        self.kinds.add(t.kinds)
        if t.error_type in _STOPS and t.state in (DONE, DEAD):  # aiq.stops; billed replies
            key = (t.state, t.error_type)
            self.stops[key] = self.stops.get(key, 0) + t.jobs
            if t.state == DEAD and t.priced:  # dead by --on-truncated: billed
                self.models.setdefault(t.model, _ModelSums()).add(t)
                self.tiers.setdefault(t.tier or UNKNOWN_TIER, _ModelSums()).add(t)
        if t.state == DONE:
            for m in (
                self.models.setdefault(t.model, _ModelSums()),
                self.tiers.setdefault(t.tier or UNKNOWN_TIER, _ModelSums()),
            ):
                m.done += t.jobs
                m.add(t)
                m.unpriced += t.jobs - t.priced
                m.unusable += t.jobs - t.usable  # a reply's tokens are NULL: it had no usage
        elif t.error_type is not None:  # the last error of a job not done
            self.errors[t.error_type] = self.errors.get(t.error_type, 0) + t.jobs
