"""Plain-text lines for the provider batches (``--via batch``): a run's, and status's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .durations import fmt_duration
from .text import plural

if TYPE_CHECKING:
    from .run_records import BatchRun
    from .stats import Stats


def batch_run_line(b: BatchRun) -> str:
    """A run --via batch in one line: batches submitted, collected, still open, re-queued."""
    again = ", ".join(f"{n:,} {r}" for r, n in sorted(b.requeued.items()))
    line = (
        f"batches: submitted {len(b.submitted):,} ({plural(b.submitted_lines, 'request')}), "
        f"collected {len(b.collected):,}, {b.open:,} still open"
    )
    if again:
        line += f"; re-queued {again}"
    if b.detached and b.open:
        line += "; run `aiq resume` later to collect them"
    return line


def batch_lines(s: Stats, now: float) -> list[str]:
    """The provider batches (--via batch): each one's state and counts, and the lines put
    back in the queue without costing an attempt, and why."""
    if not s.batches:
        return []
    open_ = sum(b.open for b in s.batches)
    lines = [f"batches: {open_:,} open (the last {len(s.batches):,} shown)"]
    for b in s.batches:
        c = b.counts
        counts = f"{c.get('completed', 0):,}/{b.requests:,} done, {c.get('failed', 0):,} failed"
        state = b.state or b.step
        step = "" if b.step in ("created", "ingested") else f" ({b.step})"
        lines.append(
            f"  batch {b.id} {b.provider_batch_id or '-'} ({b.provider}): {state}{step}, "
            f"{counts}, {fmt_duration(now - b.created_at)} old"
        )
    if s.requeued:
        why = ", ".join(f"{n:,} {reason}" for reason, n in sorted(s.requeued.items()))
        # Only a retry (a line's own error, by the online table) may have cost an attempt.
        lines.append(f"re-queued from batches: {why}")
    return lines
