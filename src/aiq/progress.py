"""Progress display: a rich live panel on a terminal, plain timestamped lines elsewhere.

The core reports a Progress object through a callback; only this module (and the CLI) knows
about terminals.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, TaskProgressColumn, TextColumn
from rich.progress import Progress as Bar
from rich.table import Table

from .durations import duration_text
from .worker import Progress, quoted


def fmt_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``, or ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def summary_line(p: Progress) -> str:
    """One line with every live figure, for logs."""
    finished = p.done + p.dead
    pct = 100.0 * finished / p.total if p.total else 100.0
    return (
        f"done {p.done}/{p.total} ({pct:.0f}%) · {p.rate_per_s:.1f}/s · eta {fmt_duration(p.eta_s)}"
        f" · in flight {p.in_flight} · retries {p.retries} · dead {p.dead}"
        f" · tokens {p.tokens_in:,} in / {p.tokens_out:,} out{outage_note(p)}"
    )


def outage_note(p: Progress) -> str:
    """`` · provider down 42 s, probing; last error: HTTP 503: …`` while the circuit breaker
    is open, else nothing."""
    if not p.outage_s:
        return ""
    last = f"; last error: {quoted(p.last_error, 160)}" if p.last_error else ""
    return f" · provider down {duration_text(p.outage_s)}, probing{last}"


class PlainProgress:
    """Timestamped lines every ``every_s`` seconds: for cron, CI logs and NO_COLOR."""

    def __init__(self, stream: TextIO = sys.stderr, *, every_s: float = 10.0) -> None:
        self._stream = stream
        self._every_s = every_s
        self._last = 0.0

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            stamp = datetime.now().astimezone().isoformat(timespec="seconds")
            print(f"{stamp} {summary_line(p)}", file=self._stream, flush=True)

    def close(self) -> None:
        """Nothing to tear down."""


class LiveProgress:
    """A rich live panel: bar, rate, ETA, in flight, retries, dead, tokens."""

    def __init__(self, console: Console) -> None:
        self._bar = Bar(TextColumn("[bold]aiq"), BarColumn(), TaskProgressColumn(), expand=False)
        self._task = self._bar.add_task("jobs", total=None)
        self._live = Live(console=console, refresh_per_second=4, transient=False)
        self._live.start()

    def __call__(self, p: Progress) -> None:
        self._bar.update(self._task, total=p.total or None, completed=p.done + p.dead)
        grid = Table.grid(padding=(0, 2))
        grid.add_row(self._bar)
        stats = Table.grid(padding=(0, 3))
        stats.add_row(
            f"done [green]{p.done:,}[/]/{p.total:,}",
            f"rate {p.rate_per_s:,.1f}/s",
            f"eta {fmt_duration(p.eta_s)}",
            f"in flight {p.in_flight}",
            f"retries [yellow]{p.retries:,}[/]",
            f"dead [red]{p.dead:,}[/]",
            f"tokens {p.tokens_in:,} in / {p.tokens_out:,} out",
        )
        grid.add_row(stats)
        if p.outage_s:
            grid.add_row(f"[red]{outage_note(p).removeprefix(' · ')}[/]")
        self._live.update(grid)

    def close(self) -> None:
        self._live.stop()
