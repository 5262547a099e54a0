"""Progress display: a rich live panel on a terminal, plain timestamped lines elsewhere.

The core reports a Progress object through a callback; only this module (and the CLI) knows
about terminals.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TextIO

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.progress import BarColumn, TaskProgressColumn, TextColumn
from rich.progress import Progress as Bar
from rich.text import Text

from .durations import duration_text, fmt_duration
from .run_records import Progress
from .text import quoted


def summary_line(p: Progress) -> str:
    """One line with every live figure, for logs. Its percentage is of jobs finished, done or
    dead, as ``aiq status`` says it ("% finished")."""
    pct = 100.0 * (p.done + p.dead) / p.total if p.total else 100.0
    return (
        f"done {p.done}/{p.total} · dead {p.dead} · {pct:.0f}% finished"
        f" · {p.rate_per_s:.1f}/s · eta {fmt_duration(p.eta_s)}"
        f" · in flight {p.in_flight}{held_note(p)}{f' · {p.waiting}' if p.waiting else ''}"
        f" · retries {p.retries} · tokens {p.tokens_in:,} in / {p.tokens_out:,} out"
        f"{f' · {p.limits}' if p.limits else ''}{outage_note(p)}"
    )


def held_note(p: Progress) -> str:
    """`` (held back by max_concurrency 256)`` when something other than the provider's limits
    keeps --concurrency auto from sending more at once, else nothing."""
    return f" (held back by {p.held_by})" if p.held_by else ""


def wants_live_panel(isatty: bool, environ: Mapping[str, str]) -> bool:
    """The live panel on a terminal, plain lines elsewhere (a pipe, a file, a dumb terminal).

    ``NO_COLOR`` is no reason for plain lines: it asks for no colour (no-color.org), and rich
    draws the panel without any when it is set.
    """
    return isatty and environ.get("TERM") != "dumb"


def outage_note(p: Progress) -> str:
    """`` · provider down 42 s, probing; last error: HTTP 503: …`` while the circuit breaker
    is open, else nothing."""
    if not p.outage_s:
        return ""
    last = f"; last error: {quoted(p.last_error, 160)}" if p.last_error else ""
    return f" · provider down {duration_text(p.outage_s)}, probing{last}"


class Cadence:
    """When a progress line is due: the first at once, then every ``every_s`` seconds, and
    one at once when the provider goes down or comes back (a log read later shows when)."""

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._last: float | None = None  # (monotonic may start near 0)
        self._down = False  # whether the last line said the provider was down

    def due(self, p: Progress) -> bool:
        now, down = time.monotonic(), bool(p.outage_s)
        if self._last is None or now - self._last >= self._every_s or down != self._down:
            self._last, self._down = now, down
            return True
        return False


class PlainProgress:
    """Timestamped lines at the :class:`Cadence`: for cron, CI logs and --log-file."""

    def __init__(self, stream: TextIO = sys.stderr, *, every_s: float = 10.0) -> None:
        self._stream = stream
        self._cadence = Cadence(every_s)

    def __call__(self, p: Progress) -> None:
        if self._cadence.due(p):
            stamp = datetime.now().astimezone().isoformat(timespec="seconds")
            print(f"{stamp} {summary_line(p)}", file=self._stream, flush=True)

    def close(self) -> None:
        """Nothing to tear down."""


class LiveProgress:
    """A rich live panel: the bar with rate and ETA over one line of counts.

    Each line fits the terminal: rich narrows the bar, and the counts leave out the figures
    least needed (tokens, then retries) rather than wrap.
    """

    def __init__(self, console: Console) -> None:
        self._bar = Bar(
            TextColumn("[bold]aiq"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[figures]}"),
            expand=False,
        )
        self._task = self._bar.add_task("jobs", total=None, figures="")
        self._live = Live(console=console, refresh_per_second=4, transient=False)
        self._live.start()

    def __call__(self, p: Progress) -> None:
        figures = f"· {p.rate_per_s:,.1f}/s · eta {fmt_duration(p.eta_s)} · in flight {p.in_flight}"
        if p.held_by:
            figures += "*"  # the note below says what holds it back
        self._bar.update(
            self._task, total=p.total or None, completed=p.done + p.dead, figures=figures
        )
        counts = _OneLine(
            [
                Text.assemble("done ", (f"{p.done:,}", "green"), f"/{p.total:,}"),
                Text.assemble("dead ", (f"{p.dead:,}", "red")),
                Text.assemble("retries ", (f"{p.retries:,}", "yellow")),
                Text(f"tokens {_short(p.tokens_in)} in / {_short(p.tokens_out)} out"),
                *([Text(p.limits, style="cyan")] if p.limits else []),
            ],
            # The limits first (when shown), then the tokens, then the retries.
            leave_out=(4, 3, 2) if p.limits else (3, 2),
        )
        rows: list[RenderableType] = [self._bar, counts]
        if p.waiting:  # why nothing moves: as visible as an outage
            rows.append(Text(p.waiting, style="yellow", no_wrap=True, overflow="ellipsis"))
        if p.held_by:
            note = f"* in flight held back by {p.held_by}"
            rows.append(Text(note, style="yellow", no_wrap=True, overflow="ellipsis"))
        if p.outage_s:
            note = outage_note(p).removeprefix(" · ")
            rows.append(Text(note, style="red", no_wrap=True, overflow="ellipsis"))
        self._live.update(Group(*rows))

    def close(self) -> None:
        self._live.stop()


class _OneLine:
    """Parts joined by `` · `` on one line: those in ``leave_out`` are left out, in that order,
    while the line is wider than the console; what still does not fit is cut with an ellipsis."""

    def __init__(self, parts: list[Text], *, leave_out: tuple[int, ...]) -> None:
        self._parts = parts
        self._leave_out = leave_out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown = list(range(len(self._parts)))
        line = self._join(shown)
        for i in self._leave_out:
            if line.cell_len <= options.max_width:
                break
            shown.remove(i)
            line = self._join(shown)
        line.no_wrap = True
        line.overflow = "ellipsis"
        yield line

    def _join(self, shown: list[int]) -> Text:
        return Text(" · ").join(self._parts[i] for i in shown)


def _short(n: int) -> str:
    """``12,345``; from 100,000 on ``123k``, ``4.6M``, ``1.2G``: a token count in few columns."""
    if n < 100_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n / 1e3:.0f}k"
    if n < 1_000_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e9:.1f}G"
