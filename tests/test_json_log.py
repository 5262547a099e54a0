"""`--log-format json`: every line of the log parseable, every attempt named by its custom_id
and the provider's request id, through retries to done or dead; the dead letter carries the
request id too. Real `aiq` subprocesses against the fake server (faults and a permanent 400)."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import API_KEY, read_jsonl, run_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq and a server in real time

_ATTEMPT_FIELDS = {"custom_id", "request_id", "attempt", "status", "error_type", "wait_s"}
_IDS = [f"p{i}" for i in range(24)]


@pytest.fixture
def flaky() -> Iterator[FakeServer]:
    with FakeServer(require_key=API_KEY, transient_rate=0.35, error_500_rate=0.1, seed=7) as s:
        yield s


def _prompts(cwd: Path) -> None:
    write_prompts(
        cwd / "b.jsonl", [*((c, f"question {c}") for c in _IDS), ("bad", "FAIL_PERMANENT")]
    )


def _run(cwd: Path, server: FakeServer, *flags: str) -> subprocess.CompletedProcess[str]:
    args = ("--base-url", server.base_url, "--model", "m", "--max-attempts", "8", *flags)
    return run_aiq("run", "b.jsonl", *args, cwd=cwd)


def _lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        record = json.loads(line)  # every line: a parse error fails the test
        assert {"timestamp", "level", "event"} <= set(record), line
        out.append(record)
    return out


def test_every_line_parses_and_follows_each_job_through_its_retries(
    tmp_path: Path, flaky: FakeServer
) -> None:
    _prompts(tmp_path)

    proc = _run(tmp_path, flaky, "--log-format", "json", "--log-file", "log.jsonl")

    assert proc.returncode == 1, proc.stderr  # the one dead job
    text = (tmp_path / "log.jsonl").read_text()
    assert API_KEY not in text and API_KEY not in proc.stderr
    records = _lines(text)
    attempts = [r for r in records if r["event"] in {"done", "retry", "dead", "requeued"}]
    by_id: dict[str, list[dict]] = defaultdict(list)
    for r in attempts:
        assert set(r) >= _ATTEMPT_FIELDS, r
        by_id[r["custom_id"]].append(r)
        if r["status"] is not None:  # a reply came: the fake server names every one
            assert r["request_id"].startswith("req_"), r
    assert set(by_id) == {*_IDS, "bad"}
    retries = [r for r in attempts if r["event"] == "retry"]
    assert retries and all(r["level"] == "warning" and r["wait_s"] >= 0 for r in retries)
    assert {r["error_type"] for r in retries} >= {"server"}

    results = {
        r["custom_id"]: r["response"]["request_id"]
        for r in read_jsonl(tmp_path / "b.results.jsonl")
    }
    for custom_id in _IDS:  # each ends done, with the request id its result line carries
        *before, last = by_id[custom_id]
        assert last["event"] == "done" and last["status"] == 200 and last["level"] == "info"
        assert last["request_id"] == results[custom_id]
        assert all(r["event"] == "retry" for r in before)
        assert [r["attempt"] for r in by_id[custom_id]] == sorted(
            r["attempt"] for r in by_id[custom_id]
        )
    (dead,) = by_id["bad"]
    assert dead["event"] == "dead" and dead["level"] == "error"
    assert dead["status"] == 400 and dead["error_type"] == "invalid_request"
    (letter,) = read_jsonl(tmp_path / "b.dead.jsonl")
    assert letter["error"]["request_id"] == dead["request_id"] is not None

    events = [r["event"] for r in records]
    assert "progress" in events and events[-1] == "summary"
    assert records[-1]["exit_code"] == 1


def test_without_a_log_file_stderr_is_json_lines_only(tmp_path: Path, flaky: FakeServer) -> None:
    _prompts(tmp_path)

    proc = _run(tmp_path, flaky, "--log-format", "json")

    assert proc.returncode == 1, proc.stderr
    records = _lines(proc.stderr)
    assert {r["custom_id"] for r in records if r["event"] == "done"} == set(_IDS)
    assert proc.stdout.startswith("added: 25 new")  # the summary, as text, on stdout


def test_a_text_log_names_each_retry_and_dead_job(tmp_path: Path, flaky: FakeServer) -> None:
    _prompts(tmp_path)

    proc = _run(tmp_path, flaky, "--log-file", "log.txt")

    assert proc.returncode == 1, proc.stderr
    text = (tmp_path / "log.txt").read_text()
    dead = [line for line in text.splitlines() if " dead bad (request req_" in line]
    assert len(dead) == 1 and "attempt 1: invalid_request: HTTP 400" in dead[0], text
    retries = [line for line in text.splitlines() if " retry p" in line]
    assert retries and all("(request req_" in line or "connection" in line for line in retries)
    assert " done p" not in text  # a line a reply would bury what went wrong


def test_an_unknown_log_format_is_refused(tmp_path: Path) -> None:
    _prompts(tmp_path)
    proc = run_aiq("run", "b.jsonl", "--log-format", "xml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--log-format 'xml': give text or json" in proc.stderr
