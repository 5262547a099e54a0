"""The dry-run report (``aiq run FILE --dry-run``): requests, tokens and cost per model, what
the figures stand on, the ETA."""

from __future__ import annotations

from .durations import fmt_duration
from .forecast import Forecast
from .pricing import PRICES_AS_OF
from .report import defaults_line
from .text import plural, usd

PRICES_NOTE = (
    f"prices: aiq's list prices as of {PRICES_AS_OF} unless the config sets `prices:`; "
    "they may be outdated, check your provider"
)


def forecast_lines(f: Forecast) -> list[str]:
    """The dry-run report: requests, tokens and cost per model, total, ETA."""
    lines = ["dry run: nothing was sent and the store was not changed"]
    skipped = [f"{f.valid:,} valid", f"{f.invalid:,} invalid"]
    if f.duplicates:
        skipped.append(f"{f.duplicates:,} repeating an earlier line's request")
    if f.done_before:
        skipped.append(f"{f.done_before:,} done before")
    if f.dead_before:
        skipped.append(f"{f.dead_before:,} dead (sent again only after `aiq replay-dead`)")
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
                 f"{usd(f.cost_usd)}" + (" (an estimate)" if f.requests else ""))  # fmt: skip
    if f.requests and f.cost_usd is not None:
        lines.append(_tiers_line(f))
    if f.unpriced:
        names = ", ".join(str(m) for m in f.unpriced)
        lines.append(
            f"no price for {names}: left out of the total; add it under `prices:` in the config"
        )
    lines.extend(_basis_lines(f))
    lines.append(PRICES_NOTE)
    lines.append(_eta_line(f))
    return lines


def _tiers_line(f: Forecast) -> str:
    """The total by way of sending: online at the list price, the others at their share."""
    return (
        f"  by way of sending: online {usd(f.cost_usd)}, --via flex {usd(f.tier_cost_usd('flex'))}"
        f" (OpenAI), --via batch {usd(f.tier_cost_usd('batch'))} (within 24 h; the eta below "
        "is online's)"
    )


def _basis_lines(f: Forecast) -> list[str]:
    """What the figures stand on: output at its ceiling is a bound, prompts are estimated."""
    lines = []
    unbounded = sum(m.unbounded for m in f.models.values())
    if unbounded:
        lines.append(
            f"{plural(unbounded, 'request')} set no max_tokens: their output is not in the "
            "estimate (set max_tokens to bound it)"
        )
    else:
        lines.append("output is counted at its ceiling (max_tokens x n): an upper bound on output")
    for m in f.models.values():
        if m.requests:
            lines.append(f"prompts of {m.model or '(none)'}: an estimate, at {m.basis}")
    if (high := f.cost_usd_high) is not None:
        lines.append(
            f"with every prompt at the highest ratio one reply showed, the cost would be "
            f"{usd(high)}: a margin, not a bound (prompts unlike those seen may run higher)"
        )
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
