"""Plain-text renderings for the CLI: a run's summary, status, exports, a dry-run forecast."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .forecast import Forecast
from .inputs import DEFAULT_NAMES, WITHHELD_TEMPERATURE
from .outputs import Export
from .pricing import PRICES_AS_OF
from .progress import fmt_duration
from .records import EnqueueCounts, Stats
from .worker import Progress

if TYPE_CHECKING:
    from .runner import RunSummary

_WITHHELD = DEFAULT_NAMES[WITHHELD_TEMPERATURE]
PRICES_NOTE = (
    f"prices: aiq's list prices as of {PRICES_AS_OF} unless the config sets `prices:`; "
    "they may be outdated, check your provider"
)


def usd(value: float | None) -> str:
    """``$1,234.56``; more decimals under a dollar, where cents would hide a test batch."""
    if value is None:
        return "?"
    if value == 0:
        return "$0"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}" if abs(value) >= 0.01 else f"${value:.6f}"


def forecast_lines(f: Forecast) -> list[str]:
    """The dry-run report: requests, tokens and cost per model, total, ETA."""
    lines = ["dry run: nothing was sent and the store was not changed"]
    skipped = [f"{f.valid:,} valid", f"{f.invalid:,} invalid"]
    if f.duplicates:
        skipped.append(f"{f.duplicates:,} repeating an earlier line's request")
    if f.done_before:
        skipped.append(f"{f.done_before:,} done before")
    lines.append(f"{f.path}: {', '.join(skipped)} → {plural(f.requests, 'request')} to send")
    if f.defaults is not None:
        lines.append(defaults_line(f.defaults))
    if f.store_note:
        lines.append(f.store_note)
    width = max([len(str(m.model)) for m in f.models.values()] + [5])
    for m in f.models.values():
        cost = usd(m.cost_usd) if m.price is not None else "cost unknown (no price)"
        lines.append(
            f"  {m.model or '(none)':<{width}}  {m.requests:>8,} requests  "
            f"{m.prompt_tokens:>10,} prompt + {m.output_tokens:>10,} output tokens  {cost}"
        )
    lines.append(f"  {'total':<{width}}  {f.requests:>8,} requests  {f.tokens:>10,} tokens  "
                 f"{usd(f.cost_usd)}")  # fmt: skip
    if f.unpriced:
        names = ", ".join(str(m) for m in f.unpriced)
        lines.append(
            f"no price for {names}: left out of the total; add it under `prices:` in the config"
        )
    unbounded = sum(m.unbounded for m in f.models.values())
    if unbounded:
        lines.append(
            f"{plural(unbounded, 'request')} set no max_tokens: their output is not in the "
            "estimate (set max_tokens for an upper bound)"
        )
    else:
        lines.append("output is counted at its ceiling (max_tokens x n): an upper bound")
    lines.append(PRICES_NOTE)
    lines.append(_eta_line(f))
    return lines


def _eta_line(f: Forecast) -> str:
    if f.eta_s is None:
        return "eta: unknown, no limit configured (set --rpm / --tpm, or rpm: / tpm:)"
    parts = []
    if f.rpm:
        parts.append(f"{fmt_duration(f.requests / f.rpm * 60)} at --rpm {f.rpm:,}")
    if f.tpm:
        parts.append(f"{fmt_duration(f.tokens / f.tpm * 60)} at --tpm {f.tpm:,}")
    return f"eta: at least {fmt_duration(f.eta_s)} ({'; '.join(parts)})"


def run_cost(p: Progress) -> str:
    """``cost $0.0123``, saying how many replies it leaves out for want of a price."""
    if p.unpriced and p.unpriced >= p.done_now:
        return "cost unknown (no price for the model: add it under `prices:` in the config)"
    more = f" + {p.unpriced:,} replies of unknown cost" if p.unpriced else ""
    return f"cost {usd(p.cost_usd)}{more}"


def cost_lines(s: Stats) -> list[str]:
    """Tokens and cost so far, in total and per model, for ``status``."""
    total = f"tokens {s.tokens_in:,} in / {s.tokens_out:,} out · cost {usd(s.cost_usd)}"
    if s.unpriced:
        total += f" (+ {s.unpriced:,} done jobs of unknown cost)"
    lines = [total]
    for m in s.models:
        cost = usd(m.cost_usd) if m.unpriced < m.done else "cost unknown (no price)"
        lines.append(
            f"  {m.model or '(none)'}: {m.done:,} done, {m.tokens_in:,} in / "
            f"{m.tokens_out:,} out, {cost}"
        )
    return lines


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 request``, ``2,000 requests``: a count and its noun, agreeing (``nouns`` when the
    plural is not the noun and an s)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {nouns or noun + 's'}"


def run_summary_lines(s: RunSummary) -> list[str]:
    """The end of a run, on one screen: what it did, where the store stands, the files."""
    p = s.progress
    lines = []
    if s.added is not None:
        lines.append(f"added: {add_counts(s.added)}")
    c = s.stats.counts
    retries = plural(p.retries, "retry", "retries")
    lines.append(
        f"finished {p.done_now:,} and dead-lettered {p.dead_now:,} in "
        f"{fmt_duration(s.duration_s)} ({p.rate_per_s:.1f}/s), {retries}, "
        f"tokens {p.tokens_in:,} in / {p.tokens_out:,} out, {run_cost(p)}"
    )
    lines.append(
        f"store: {c['done']:,} done, {c['dead']:,} dead, {c['queued']:,} queued, "
        f"{c['running']:,} running of {s.stats.total:,}"
    )
    for e in s.exports:
        lines.extend(export_lines(e))
    if s.stopped == "interrupted":
        lines.append("interrupted: run `aiq resume` to carry on where this stopped")
    elif s.stopped == "limit":
        lines.append("stopped at --max-runtime: run `aiq resume` to carry on")
    elif s.stopped == "budget":
        lines.append(
            f"stopped at --max-cost: the store has spent {usd(s.stats.cost_usd)} in all; "
            "raise the cap and `aiq resume --max-cost USD` to carry on"
        )
    elif s.stopped is None and c["dead"]:
        lines.append("some jobs are dead: fix the cause, then `aiq replay-dead` and `aiq resume`")
    return lines


def run_summary_json(s: RunSummary) -> dict[str, Any]:
    """The same, as one JSON object (``--json``)."""
    p = s.progress
    return {
        "exit_code": s.exit_code,
        "stopped": s.stopped,
        "duration_s": round(s.duration_s, 3),
        "done_now": p.done_now,
        "dead_now": p.dead_now,
        "retries": p.retries,
        "tokens_in": p.tokens_in,
        "tokens_out": p.tokens_out,
        "cost_usd": p.cost_usd if p.unpriced < p.done_now or not p.done_now else None,
        "unpriced": p.unpriced,
        "status": s.stats.as_dict(),
        "outputs": [
            {"input": e.source, "results": e.results_path, "dead": e.dead_path,
             "results_count": e.results, "dead_count": e.dead, "written": e.written}
            for e in s.exports
        ],
    }  # fmt: skip


def add_counts(c: EnqueueCounts) -> str:
    """What an add did with a file's lines: ``3 new, 0 known, 1 changed, 0 invalid``."""
    return f"{c.new:,} new, {c.known:,} known, {c.changed:,} changed, {c.invalid:,} invalid"


def defaults_line(applied: dict[str, int]) -> str:
    """Which config defaults how many lines took (``inputs.count_defaults``):
    ``defaults applied: model to 12 lines, max_tokens to 12 lines``."""
    withheld = applied.get(_WITHHELD, 0)
    taken = [f"{name} to {plural(n, 'line')}" for name, n in applied.items() if name != _WITHHELD]
    line = f"defaults applied: {', '.join(taken) or 'none'}"
    if withheld:
        line += f"; temperature not added to {plural(withheld, 'line')} (reasoning models)"
    return line


def export_lines(e: Export) -> list[str]:
    """Where one input file's results and dead letters are, and how many lines each has."""
    same = "" if e.written else ", unchanged"
    return [
        f"results: {e.results_path} ({plural(e.results, 'line')}{same})",
        f"dead letters: {e.dead_path} ({plural(e.dead, 'line')}{same})",
    ]


def status_lines(s: Stats) -> list[str]:
    """``aiq status``: counts, progress, rate and ETA, tokens and cost, top errors."""
    c = s.counts
    oldest = fmt_duration(s.oldest_queued_s) if s.oldest_queued_s else "-"
    lines = [
        f"total {s.total:,} · {s.percent_done:.1f}% finished",
        f"queued {c['queued']:,}{f' ({s.not_due:,} not due yet)' if s.not_due else ''} · "
        f"running {c['running']:,} · done {c['done']:,} · dead {c['dead']:,}",
        f"rate {s.rate_per_s:.2f}/s over the last minute · eta {fmt_duration(s.eta_s)}"
        f" · oldest queued {oldest}",
        *cost_lines(s),
    ]
    if s.top_errors:
        lines.append("errors: " + ", ".join(f"{t} {n}" for t, n in s.top_errors))
    return lines
