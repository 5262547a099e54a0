"""What one attempt's log event says (aiq.joblog, aiq.loglines): pure, table-tested."""

from __future__ import annotations

import json

import pytest

from aiq.joblog import attempt_event
from aiq.loglines import attempt_fields, attempt_text, json_line
from aiq.records import DEAD, DONE, QUEUED, Job, Outcome

_JOB = Job(7, "/v1/chat/completions", b"{}", attempts=2, first_attempt_at=1.0, model="m")
_NOW = 1_000.0


@pytest.mark.parametrize(
    ("outcome", "event", "level", "wait_s"),
    [
        (Outcome(7, DONE, 3, 999.0, status_code=200, request_id="req_a"), "done", "info", None),
        (
            Outcome(7, DONE, 3, 999.0, status_code=200, error_type="truncated"),
            "done",
            "warning",
            None,
        ),
        (
            Outcome(7, QUEUED, 3, 999.0, next_at=_NOW + 2.5, status_code=500, error_type="server"),
            "retry",
            "warning",
            2.5,
        ),
        (  # a 429 costs no attempt; due at once after its pause
            Outcome(7, QUEUED, 2, 999.0, next_at=_NOW - 0.01, status_code=429),
            "retry",
            "warning",
            0.0,
        ),
        (Outcome(7, QUEUED, 2, 999.0, status_code=401), "requeued", "warning", None),
        (Outcome(7, DEAD, 3, 999.0, status_code=400), "dead", "error", None),
    ],
)
def test_an_attempts_event(outcome: Outcome, event: str, level: str, wait_s: float | None) -> None:
    e = attempt_event(_JOB, outcome, "q7", _NOW)

    assert (e.event, e.custom_id, e.attempt, e.wait_s, e.model) == (event, "q7", 3, wait_s, "m")
    got_level, fields = attempt_fields(e)
    assert got_level == level
    line = json.loads(json_line(e.event, got_level, fields, at=e.at))
    assert line["timestamp"] == "1970-01-01T00:16:40.000+00:00"
    assert {k: line[k] for k in ("event", "custom_id", "attempt", "wait_s")} == {
        "event": event,
        "custom_id": "q7",
        "attempt": 3,
        "wait_s": wait_s,
    }
    assert line["request_id"] == outcome.request_id and line["status"] == outcome.status_code


def test_a_text_line_names_the_job_and_its_request_and_skips_done_jobs() -> None:
    retry = Outcome(
        7, QUEUED, 3, 999.0, next_at=_NOW + 2.5, status_code=500, error_type="server",
        error_message="HTTP 500: oops", request_id="req_b",
    )  # fmt: skip
    assert attempt_text(attempt_event(_JOB, retry, "q7", _NOW)) == (
        "retry q7 (request req_b) attempt 3: server: HTTP 500: oops; again in 2.5 s"
    )
    unnamed = Outcome(7, DEAD, 3, 999.0, error_type="timeout")
    assert attempt_text(attempt_event(None, unnamed, None, _NOW)) == "dead job 7 attempt 3: timeout"
    done = Outcome(7, DONE, 3, 999.0, status_code=200)
    assert attempt_text(attempt_event(_JOB, done, "q7", _NOW)) is None
