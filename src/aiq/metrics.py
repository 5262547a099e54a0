"""A Prometheus text-format metrics file, for node_exporter's textfile collector.

Written atomically (temporary file + rename) every few seconds during a run and once at its
end, so the collector never reads half a file.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .errors import OutputError
from .files import write_atomic
from .run_records import Progress
from .stats import Stats


@dataclass(slots=True)
class RunClock:
    """Wall-clock start and end of a run, and how it ended."""

    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None


def render(p: Progress, clock: RunClock, stats: Stats | None = None) -> str:
    """The metrics text. With ``stats`` (the end of a run) job counts come from the store."""
    lines = [
        *_job_lines(p, stats),
        "# HELP aiq_tokens_total Tokens used by this run, from the providers' usage.",
        "# TYPE aiq_tokens_total counter",
        f'aiq_tokens_total{{direction="in"}} {p.tokens_in}',
        f'aiq_tokens_total{{direction="out"}} {p.tokens_out}',
        "# HELP aiq_tokens_part_total Parts of aiq_tokens_total priced or hidden apart: "
        "cached input (OpenAI), cache writes and reads (Anthropic), reasoning.",
        "# TYPE aiq_tokens_part_total counter",
        f'aiq_tokens_part_total{{direction="in",kind="cached"}} {p.kinds.cached}',
        f'aiq_tokens_part_total{{direction="in",kind="cache_write"}} {p.kinds.cache_write}',
        f'aiq_tokens_part_total{{direction="in",kind="cache_read"}} {p.kinds.cache_read}',
        f'aiq_tokens_part_total{{direction="out",kind="reasoning"}} {p.kinds.reasoning}',
        "# HELP aiq_replies_unusable_usage_total Replies of this run whose usage was missing "
        "or not counts: their tokens and cost are unknown, in no total.",
        "# TYPE aiq_replies_unusable_usage_total counter",
        f"aiq_replies_unusable_usage_total {p.unusable}",
        "# HELP aiq_cost_usd_total USD spent by this run (replies of models with a price).",
        "# TYPE aiq_cost_usd_total counter",
        f"aiq_cost_usd_total {p.cost_usd:.9f}",
        "# HELP aiq_requests_total Requests of this run by outcome.",
        "# TYPE aiq_requests_total counter",
        f'aiq_requests_total{{outcome="done"}} {p.done_now}',
        f'aiq_requests_total{{outcome="retry"}} {p.retries}',
        f'aiq_requests_total{{outcome="dead"}} {p.dead_now}',
        "# HELP aiq_in_flight Requests in flight.",
        "# TYPE aiq_in_flight gauge",
        f"aiq_in_flight {p.in_flight}",
        *_clock_lines(clock),
    ]
    if stats is not None:
        lines += [
            "# HELP aiq_oldest_queued_age_seconds Age of the oldest queued job.",
            "# TYPE aiq_oldest_queued_age_seconds gauge",
            f"aiq_oldest_queued_age_seconds {stats.oldest_queued_s or 0.0:.1f}",
        ]
    return "\n".join(lines) + "\n"


def _job_lines(p: Progress, stats: Stats | None) -> list[str]:
    """Jobs by state: the store's count at the end of a run, else the run's own reckoning."""
    if stats is not None:
        counts = dict(stats.counts)
    else:
        running = p.in_flight
        queued = max(0, p.total - p.done - p.dead - running)
        counts = {"queued": queued, "running": running, "done": p.done, "dead": p.dead}
    return [
        "# HELP aiq_jobs Jobs in the store by state.",
        "# TYPE aiq_jobs gauge",
        *(f'aiq_jobs{{state="{state}"}} {n}' for state, n in counts.items()),
    ]


def _clock_lines(clock: RunClock) -> list[str]:
    """When the run started and, once it has, when it ended and how."""
    lines = [
        "# HELP aiq_last_run_start_timestamp_seconds When the last run started.",
        "# TYPE aiq_last_run_start_timestamp_seconds gauge",
        f"aiq_last_run_start_timestamp_seconds {clock.started_at:.3f}",
    ]
    if clock.ended_at is not None:
        lines += [
            "# HELP aiq_last_run_end_timestamp_seconds When the last run ended.",
            "# TYPE aiq_last_run_end_timestamp_seconds gauge",
            f"aiq_last_run_end_timestamp_seconds {clock.ended_at:.3f}",
            "# HELP aiq_last_run_exit_code The last run's exit code (0 all done, see README).",
            "# TYPE aiq_last_run_exit_code gauge",
            f"aiq_last_run_exit_code {clock.exit_code}",
        ]
    return lines


class MetricsWriter:
    """Rewrites the metrics file at most every ``every_s`` seconds, and at the end."""

    def __init__(self, path: str, *, every_s: float = 5.0) -> None:
        # A textfile collector's directory that is not there is a typo: making it would only
        # hide the metrics where nothing reads them.
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise OutputError(
                f"{path}: --metrics-file: directory {parent} does not exist; create it or fix "
                "the path"
            )
        self.path = path
        self.clock = RunClock(started_at=time.time())
        self._every_s = every_s
        self._last = 0.0

    def tick(self, p: Progress) -> None:
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            write_atomic(self.path, render(p, self.clock).encode(), mode=0o644)

    def finish(self, p: Progress, stats: Stats, exit_code: int) -> None:
        self.clock.ended_at = time.time()
        self.clock.exit_code = exit_code
        write_atomic(self.path, render(p, self.clock, stats).encode(), mode=0o644)
