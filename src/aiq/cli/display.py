"""Where a run's progress and summary go: the terminal, plain lines, JSON, a log file.

``--log-format json`` writes the log as JSON lines (aiq.loglines): to ``--log-file`` if given
(the terminal then shows what it shows in text mode), else to stderr, in place of the live
panel and the plain lines there, so that a shipper reading stderr reads JSON only (the last
``error:`` line of a failed run is still text, after its JSON ``error`` event). A log, text or
JSON, hears each attempt of each job (retries, dead and requeued jobs in text; every attempt
in JSON), named by custom_id and request id; with no log nothing is built per job.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..files import open_log
from .app import console

if TYPE_CHECKING:
    from ..joblog import OnAttempt
    from ..records import EnqueueCounts
    from ..run_records import AttemptEvent, RunSummary


class Display:
    """Where a run's progress and summary go: terminal, plain lines, JSON, a log file."""

    def __init__(
        self, quiet: bool, as_json: bool, log_file: Path | None, log_format: str = "text"
    ) -> None:
        self.as_json = as_json
        self._quiet = quiet or as_json
        self.new_store: Path | None = None  # said once the file is in it
        from ..progress import LiveProgress, PlainProgress, wants_live_panel

        self._log = open_log(log_file) if log_file else None
        # Where JSON log lines go: the log file, else stderr (unless --quiet).
        self._jsonl: TextIO | None = None
        if log_format == "json":
            self._jsonl = self._log if self._log is not None else None if quiet else sys.stderr
        stderr_json = self._jsonl is sys.stderr
        shows: list[Any] = []
        if not (quiet or as_json or stderr_json):
            live = wants_live_panel(sys.stdout.isatty(), os.environ)
            shows.append(LiveProgress(console()) if live else PlainProgress(sys.stderr))
        if self._jsonl is not None:
            from ..loglines import JsonProgress

            shows.append(JsonProgress(self._jsonl))
        elif self._log is not None:
            shows.append(PlainProgress(self._log))
        self._shows = shows

    @property
    def on_attempt(self) -> OnAttempt | None:
        """What hears each attempt: a JSON or text log's writer; None without a log."""
        if self._jsonl is not None:
            return self._attempt_json
        return self._attempt_text if self._log is not None else None

    def _attempt_json(self, e: AttemptEvent) -> None:
        from ..loglines import attempt_fields, json_line

        assert self._jsonl is not None
        level, fields = attempt_fields(e)
        self._jsonl.write(json_line(e.event, level, fields, at=e.at))

    def _attempt_text(self, e: AttemptEvent) -> None:
        from ..loglines import attempt_text

        if (line := attempt_text(e)) is not None:
            self._write_log([line])

    def progress(self, p: Any) -> None:
        for show in self._shows:
            show(p)
        if self._jsonl is not None:  # twice a second: a shipper tailing the log lags no more
            self._jsonl.flush()

    def added(self, path: Path, c: EnqueueCounts) -> None:
        """The file is read: say what was wrong with it now, not hours later at the end."""
        from .. import report

        lines = report.input_warnings(path, c)
        if self.new_store is not None:  # a mistyped --db would otherwise start a store quietly
            lines.append(f"new store at {self.new_store}")
        if self._jsonl is not sys.stderr:
            sys.stderr.writelines(f"{line}\n" for line in lines)
        self._write_log(lines, warnings=True)

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
        if self._jsonl is not None:
            from ..loglines import json_line

            self._jsonl.write(json_line("summary", "info", report.run_summary_json(s)))
        else:
            self._write_log(lines)

    def error(self, message: str, exit_code: int) -> None:
        """A run's fatal error, in a JSON log (the CLI prints its ``error:`` line after)."""
        if self._jsonl is not None:
            from ..loglines import json_line

            fields = {"message": message, "exit_code": exit_code}
            self._jsonl.write(json_line("error", "error", fields))

    def _write_log(self, lines: list[str], *, warnings: bool = False) -> None:
        if self._jsonl is not None:
            from ..loglines import json_line

            for line in lines:  # an input's warnings: its invalid lines, an empty file
                level = "warning" if warnings and not line.startswith("new store") else "info"
                self._jsonl.write(json_line("message", level, {"message": line}))
        elif self._log is not None:
            stamp = datetime.now().astimezone().isoformat(timespec="seconds")
            self._log.writelines(f"{stamp} {line}\n" for line in lines)

    def _stop_shows(self) -> None:
        shows, self._shows = self._shows, []
        for show in shows:
            show.close()

    def close(self) -> None:
        self._stop_shows()
        if self._jsonl is not None:
            self._jsonl.flush()
        if self._log is not None:
            self._log.close()
