"""Plain-text renderings, for the CLI, of a dry-run forecast and of costs in status."""

from __future__ import annotations

from .forecast import Forecast
from .pricing import PRICES_AS_OF
from .progress import fmt_duration
from .store import Stats
from .worker import Progress

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


def plural(n: int, noun: str) -> str:
    """``1 request``, ``2,000 requests``: a count and its noun, agreeing."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
