"""Where a run's progress and summary go: the terminal, plain lines, JSON, a log file."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import open_log
from .app import console

if TYPE_CHECKING:
    from ..records import EnqueueCounts
    from ..run_records import RunSummary


class Display:
    """Where a run's progress and summary go: terminal, plain lines, JSON, a log file."""

    def __init__(self, quiet: bool, as_json: bool, log_file: Path | None) -> None:
        self.as_json = as_json
        self._quiet = quiet or as_json
        self.new_store: Path | None = None  # said once the file is in it
        from ..progress import LiveProgress, PlainProgress, wants_live_panel

        self._log = open_log(log_file) if log_file else None
        shows: list[Any] = []
        if not (quiet or as_json):
            live = wants_live_panel(sys.stdout.isatty(), os.environ)
            shows.append(LiveProgress(console()) if live else PlainProgress(sys.stderr))
        if self._log is not None:
            shows.append(PlainProgress(self._log))
        self._shows = shows

    def progress(self, p: Any) -> None:
        for show in self._shows:
            show(p)

    def added(self, path: Path, c: EnqueueCounts) -> None:
        """The file is read: say what was wrong with it now, not hours later at the end."""
        from .. import report

        lines = report.input_warnings(path, c)
        if self.new_store is not None:  # a mistyped --db would otherwise start a store quietly
            lines.append(f"new store at {self.new_store}")
        sys.stderr.writelines(f"{line}\n" for line in lines)
        self._write_log(lines)

    def note(self, line: str) -> None:
        """One line of what a run is doing (a batch's steps and counts), as it happens."""
        if not self._quiet:
            print(line, file=sys.stderr, flush=True)
        self._write_log([line])

    def summary(self, s: RunSummary) -> None:
        from .. import report

        self._stop_shows()  # the panel's last frame first, then the summary under it
        lines = report.run_summary_lines(s)
        if self.as_json:
            print(json.dumps(report.run_summary_json(s)))
        else:
            print("\n".join(lines))
        self._write_log(lines)

    def _write_log(self, lines: list[str]) -> None:
        if self._log is not None:
            stamp = datetime.now().astimezone().isoformat(timespec="seconds")
            self._log.writelines(f"{stamp} {line}\n" for line in lines)

    def _stop_shows(self) -> None:
        shows, self._shows = self._shows, []
        for show in shows:
            show.close()

    def close(self) -> None:
        self._stop_shows()
        if self._log is not None:
            self._log.close()
