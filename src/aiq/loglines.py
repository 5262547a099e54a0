"""A run's log lines, as text or as JSON lines (``--log-format json``) for log shippers.

A JSON line is one object: ``timestamp`` (ISO 8601, UTC, milliseconds), ``level`` (info,
warning, error), ``event``, then the event's fields. An attempt's line (events done, retry,
dead, requeued) always has ``custom_id``, ``request_id``, ``attempt``, ``status``,
``error_type``, ``wait_s`` and the rest (null when none), so a shipper's schema is one per
event. Nothing here can hold a key: the messages are the provider's as stored, with the key
cut out before they reached the store (aiq.providers.failures).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from .durations import duration_text
from .progress import Cadence, summary_line
from .run_records import AttemptEvent, Progress

__all__ = ["JsonProgress", "attempt_fields", "attempt_text", "json_line", "progress_fields"]

_LEVELS = {"done": "info", "retry": "warning", "requeued": "warning", "dead": "error"}


def json_line(event: str, level: str, fields: dict[str, Any], *, at: float | None = None) -> str:
    """One JSON log line (with its newline) for ``event``, stamped ``at`` (now if None)."""
    when = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    head = {"timestamp": when.isoformat(timespec="milliseconds"), "level": level, "event": event}
    return orjson.dumps({**head, **fields}).decode() + "\n"


def attempt_fields(e: AttemptEvent) -> tuple[str, dict[str, Any]]:
    """The level and fields of an attempt's JSON line. A done reply that stopped short
    (truncated, content filter) is a warning: billed, with less than was asked for."""
    level = "warning" if e.event == "done" and e.error_type else _LEVELS[e.event]
    return level, {
        "custom_id": e.custom_id,
        "request_id": e.request_id,
        "attempt": e.attempt,
        "status": e.status,
        "error_type": e.error_type,
        "wait_s": e.wait_s,
        "message": e.message,
        "latency_s": e.latency_s,
        "model": e.model,
        "job_id": e.job_id,
    }


def attempt_text(e: AttemptEvent) -> str | None:
    """An attempt as a text log line: retries, dead and requeued jobs; None for a job done
    (a line per reply would bury what went wrong)."""
    if e.event == "done":
        return None
    ids = f"{e.custom_id or f'job {e.job_id}'}"
    if e.request_id:
        ids += f" (request {e.request_id})"
    what = f"{e.event} {ids} attempt {e.attempt}: {e.error_type or 'error'}"
    if e.message:  # the provider's, which names the HTTP status
        what += f": {e.message}"
    elif e.status:
        what += f" HTTP {e.status}"
    if e.wait_s is not None:
        what += f"; again in {duration_text(e.wait_s)}"
    return what


def progress_fields(p: Progress) -> dict[str, Any]:
    """A progress line's fields: the live figures, and the text line that says them."""
    return {
        "total": p.total,
        "done": p.done,
        "dead": p.dead,
        "retries": p.retries,
        "in_flight": p.in_flight,
        "rate_per_s": round(p.rate_per_s, 3),
        "eta_s": None if p.eta_s is None else round(p.eta_s, 1),
        "tokens_in": p.tokens_in,
        "tokens_out": p.tokens_out,
        "outage_s": round(p.outage_s, 1),
        "message": summary_line(p),
    }


class JsonProgress:
    """A progress JSON line at the same :class:`~aiq.progress.Cadence` as PlainProgress
    writes its text lines."""

    def __init__(self, stream: TextIO, *, every_s: float = 10.0) -> None:
        self._stream = stream
        self._cadence = Cadence(every_s)

    def __call__(self, p: Progress) -> None:
        if self._cadence.due(p):
            self._stream.write(json_line("progress", "info", progress_fields(p)))
            self._stream.flush()

    def close(self) -> None:
        """Nothing to tear down."""
