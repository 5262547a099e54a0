"""Plain-text renderings for the CLI: a run's summary, status, exports.

The dry-run forecast is in aiq.report_forecast, the provider batches' lines in
aiq.report_batches, what replay-dead and prune did in aiq.report_store.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .defaults import DEFAULT_NAMES, WITHHELD_TEMPERATURE
from .durations import fmt_duration
from .records import EnqueueCounts
from .report_batches import batch_lines, batch_run_line
from .stats import UNKNOWN_TIER, Stats, TierUsage
from .text import plural, size_text, usd
from .usage import TokenKinds

if TYPE_CHECKING:  # only read here: `status` then loads none of a run's records
    from .run_records import Export, Progress, RunSummary

_WITHHELD = DEFAULT_NAMES[WITHHELD_TEMPERATURE]


def run_cost(p: Progress) -> str:
    """``cost $0.0123``, saying how many replies it leaves out for want of a price or of a
    usable usage."""
    if p.unpriced and p.unpriced >= p.done_now:
        if p.unusable >= p.unpriced:
            return "cost unknown (the replies' usage was unusable)"
        return "cost unknown (no price for the model: add it under `prices:` in the config)"
    more = f" + {plural(p.unpriced, 'reply', 'replies')} of unknown cost" if p.unpriced else ""
    return f"cost {usd(p.cost_usd)}{more}"


def tokens_text(tokens_in: int, tokens_out: int, kinds: TokenKinds) -> str:
    """``12,345 in (4,000 cached) / 678 out (300 reasoning)``: the parts priced or hidden
    apart, where there are any."""
    ins = [
        f"{n:,} {what}"
        for n, what in (
            (kinds.cached, "cached"),
            (kinds.cache_write, "cache writes"),
            (kinds.cache_read, "cache reads"),
        )
        if n
    ]
    parts = " (" + ", ".join(ins) + ")" if ins else ""
    text = f"{tokens_in:,} in{parts} / {tokens_out:,} out"
    return text + (f" ({kinds.reasoning:,} reasoning)" if kinds.reasoning else "")


def unusable_line(n: int) -> str:
    """The warning for replies whose usage aiq could not use."""
    return (
        f"warning: {plural(n, 'reply', 'replies')} with unusable usage (missing, or not whole "
        "numbers 0 or more): tokens and cost unknown, left out of every total (stored as sent)"
    )


def tiers_line(tiers: list[TierUsage]) -> str | None:
    """``  by tier: online $0.0312 (15 done), batch $0.0104 (5 done)``: what each tier that
    billed replies cost, when more than one did (one: the cost line says it all)."""
    return "  by tier: " + ", ".join(map(_tier_part, tiers)) if len(tiers) > 1 else None


def _tier_part(t: TierUsage) -> str:
    notes = [f"{t.done:,} done"]
    if t.tier == UNKNOWN_TIER:
        notes.append("before aiq recorded tiers")
    if t.unpriced and t.cost_usd is not None:  # (none priced: the cost is "?")
        notes.append(f"{t.unpriced:,} of unknown cost")
    return f"{t.tier} {usd(t.cost_usd)} ({', '.join(notes)})"


def cost_lines(s: Stats) -> list[str]:
    """Tokens and cost so far, in total, per tier (when more than one) and per model, for
    ``status``."""
    total = f"tokens {tokens_text(s.tokens_in, s.tokens_out, s.kinds)} · cost {usd(s.cost_usd)}"
    if s.unpriced:
        total += f" (+ {plural(s.unpriced, 'done job')} of unknown cost)"
    lines = [total]
    if tiers := tiers_line(s.tiers):
        lines.append(tiers)
    for m in s.models:
        if m.cost_usd is not None:  # (a model may have only billed dead jobs: cut off)
            cost = usd(m.cost_usd)
        elif m.unusable >= m.unpriced:
            cost = "cost unknown (unusable usage)"
        else:
            cost = "cost unknown (no price)"
        lines.append(
            f"  {m.model or '(none)'}: {m.done:,} done, "
            f"{tokens_text(m.tokens_in, m.tokens_out, m.kinds)}, {cost}"
        )
    if s.unusable:
        lines.append(unusable_line(s.unusable))
    return lines


def input_warnings(path: object, c: EnqueueCounts, *, shown: int = 50) -> list[str]:
    """The invalid lines of a file just read (the first ``shown``), or that it was empty."""
    lines = [f"invalid: {bad}" for bad in c.bad_lines[:shown]]
    if c.invalid > shown:
        lines.append(f"invalid: … and {c.invalid - shown:,} more")
    if c.empty:
        lines.append(
            f"warning: {path} has no lines: nothing was added (if a program writes it, did it "
            "fail?); exit code 7"
        )
    return lines


def skipped_line(c: EnqueueCounts) -> str | None:
    """The summary's word on invalid input lines: never sent, in no output file."""
    if not c.invalid:
        return None
    return (
        f"skipped {plural(c.invalid, 'invalid input line')} (listed when the file was read): "
        "never sent, in no output file; fix them and run again (exit code 6)"
    )


def run_summary_lines(s: RunSummary) -> list[str]:
    """The end of a run, on one screen: what it did, where the store stands, the files."""
    p = s.progress
    lines = []
    if s.added is not None:
        lines.append(f"added: {add_counts(s.added)}")
        if skipped := skipped_line(s.added):
            lines.append(skipped)
        elif s.added.empty:
            lines.append("warning: the input file has no lines: nothing was added (exit code 7)")
    c = s.stats.counts
    retries = plural(p.retries, "retry", "retries")
    if p.timeouts:
        retries += f", {p.timeouts:,} timed out (may be billed)"
    lines.append(
        f"finished {p.done_now:,} and dead-lettered {p.dead_now:,} in "
        f"{fmt_duration(s.duration_s)} ({p.rate_per_s:.1f}/s), {retries}, "
        f"tokens {tokens_text(p.tokens_in, p.tokens_out, p.kinds)}, {run_cost(p)}"
    )
    if tiers := tiers_line(p.tier_usage()):
        lines.append(tiers)
    if p.unusable:
        lines.append(unusable_line(p.unusable))
    lines.extend(stop_lines(p.truncated, p.filtered, dead=s.on_truncated == "dead", run=True))
    if p.held_by:
        lines.append(
            f"in flight: at most {p.max_in_flight:,} at once, held back by {p.held_by} "
            "(not by the provider's limits)"
        )
    lines.append(
        f"store: {c['done']:,} done, {c['dead']:,} dead, {c['queued']:,} queued, "
        f"{c['running']:,} running of {s.stats.total:,}"
    )
    if (b := s.batch) is not None:
        lines.append(batch_run_line(b))
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
        "timed_out": p.timeouts,
        "truncated": p.truncated,
        "content_filtered": p.filtered,
        "tokens_in": p.tokens_in,
        "tokens_out": p.tokens_out,
        **p.kinds.as_dict(),
        "cost_usd": p.cost_usd if p.unpriced < p.done_now or not p.done_now else None,
        "unpriced": p.unpriced,
        "unusable_usage": p.unusable,
        "tiers": {t.tier: t.as_dict() for t in p.tier_usage()},
        "max_in_flight": p.max_in_flight,
        "held_by": p.held_by,
        "invalid_lines": None if s.added is None else s.added.invalid,
        "empty_input": None if s.added is None else s.added.empty,
        "status": s.stats.as_dict(),
        "batch": None if s.batch is None else s.batch.as_dict(),
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
    lines = [
        f"results: {e.results_path} ({plural(e.results, 'line')}{same})",
        f"dead letters: {e.dead_path} ({plural(e.dead, 'line')}{same})",
    ]
    if e.pruned_lost:
        lines.append(
            f"pruned: {plural(e.pruned_lost, 'line')} of {e.source} are in neither file: `aiq "
            "prune` left them to these files, which no longer hold them (moved or edited "
            "since), or another input file's results hold them (the same requests, sent once)"
        )
    return lines


def status_lines(s: Stats, *, now: float | None = None) -> list[str]:
    """``aiq status``: counts, whether a run is active (its rate and ETA), tokens and cost,
    top errors."""
    c = s.counts
    running = f"running {c['running']:,}"
    if c["running"] and s.in_batches == c["running"]:
        running += " (in provider batches)"
    elif c["running"] and s.active:
        running += f" ({s.in_flight:,} in flight, {s.claimed:,} claimed, not sent yet)"
    elif c["running"]:
        running += " (abandoned"
        running += f", {s.in_batches:,} in provider batches)" if s.in_batches else ")"
    lines = [
        f"total {s.total:,} · {s.percent_done:.1f}% finished",
        f"queued {c['queued']:,}{f' ({s.not_due:,} not due yet)' if s.not_due else ''} · "
        f"{running} · done {c['done']:,} · dead {c['dead']:,}",
        *_run_lines(s, time.time() if now is None else now),
        *cost_lines(s),
    ]
    if s.top_errors:
        lines.append("errors: " + ", ".join(f"{t} {n}" for t, n in s.top_errors))
    if s.timeouts:
        lines.append(
            f"timed out: {plural(s.timeouts, 'call')} got no reply in time (retried; the "
            "provider may still bill them)"
        )
    if s.truncated_dead:
        lines.append(
            f"cut off: {plural(s.truncated_dead, 'reply', 'replies')} cut off by max_tokens "
            "were dead-lettered (--on-truncated dead), the replies kept in the dead letters"
        )
    lines.extend(stop_lines(s.truncated, s.filtered, dead=False))
    if s.size_bytes is not None:  # what `aiq prune` would shrink
        lines.append(f"store: {size_text(s.size_bytes)} on disk")
    lines.extend(batch_lines(s, time.time() if now is None else now))
    return lines


def stop_lines(truncated: int, filtered: int, *, dead: bool, run: bool = False) -> list[str]:
    """Replies that stopped short (aiq.stops): billed, and with less than was asked for;
    ``run``: a run's, which may name the option that would have dead-lettered them."""
    lines = []
    if truncated:
        if dead:
            kept = "dead-lettered (--on-truncated dead)"
        else:
            kept = "kept as results" + (" (--on-truncated dead dead-letters them)" if run else "")
        lines.append(
            f"cut off: {plural(truncated, 'reply', 'replies')} cut off by max_tokens, {kept}; "
            "raise max_tokens and run the file again to have them whole"
        )
    if filtered:
        lines.append(
            f"content filter: {plural(filtered, 'reply', 'replies')} stopped by a content "
            "filter, kept as results (a replay would likely be refused again)"
        )
    return lines


def _run_lines(s: Stats, now: float) -> list[str]:
    """Whether a run is active: its rate and ETA, or how the last one ended."""
    oldest = f"oldest queued {fmt_duration(s.oldest_queued_s) if s.oldest_queued_s else '-'}"
    run = s.run
    if s.active:
        who = "run active"
        if run is not None and run.pid is not None:
            who += f" (pid {run.pid} on {run.host}, since {_when(run.started_at, now)})"
        window = fmt_duration(s.rate_window_s)
        rate = f"rate {s.rate_per_s:.2f}/s over the last {window} · eta {fmt_duration(s.eta_s)}"
        return [f"{who} · {rate} · {oldest}"]
    if run is not None and run.died:
        lines = [
            f"no run is active: the last one (pid {run.pid} on {run.host}, started "
            f"{_when(run.started_at, now)}) died · {oldest}"
        ]
        if s.counts["running"]:
            lines.append(
                f"its {plural(s.counts['running'], 'running job')} go back to the queue on "
                "`aiq resume` (or the next `aiq run`)"
            )
        return lines
    ended = f" (the last one ended {_when(run.ended_at, now)})" if run and run.ended_at else ""
    return [f"no run is active{ended} · {oldest}"]


def _when(t: float | None, now: float) -> str:
    """``14:03:07, 2m05s ago`` (with the date when not today); ``?`` when unknown."""
    if t is None:
        return "?"
    at = datetime.fromtimestamp(t)
    stamp = at.strftime("%H:%M:%S" if at.date() == datetime.fromtimestamp(now).date() else
                        "%Y-%m-%d %H:%M:%S")  # fmt: skip
    return f"{stamp}, {fmt_duration(max(0.0, now - t))} ago"
