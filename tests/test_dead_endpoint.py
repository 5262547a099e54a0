"""A dead endpoint fails in seconds; an outage says what the server said.

Real `aiq run` subprocesses against a closed port (nothing ever answers: exit 4 in seconds,
naming the URL and the refusal, not after --max-outage), against the fake server answering 500
to everything (an outage: the final error and the progress lines quote the server's message),
and against one that answered and then went away (still an outage, bounded by --max-outage).
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from conftest import run_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # free once the socket closes: nothing listens there


def _attempts(db: Path) -> set[int]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT attempts FROM jobs")}


def test_an_endpoint_that_never_answers_fails_in_seconds_naming_url_and_error(
    tmp_path: Path,
) -> None:
    write_prompts(tmp_path / "f.jsonl", [(f"c{i}", f"prompt {i}") for i in range(20)])
    base = f"http://127.0.0.1:{_closed_port()}/v1"

    done = run_aiq("run", "f.jsonl", "--base-url", base, "--model", "m", "--json", cwd=tmp_path)

    assert done.returncode == 4, done.stderr
    # The run's own clock (the 2 s of breaker.UNREACHABLE_S and a retry or two), not --max-
    # outage's 600 s; not the wall time around it, which a loaded machine's start-up inflates.
    assert json.loads(done.stdout)["duration_s"] < 6
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"{base}/chat/completions" in error and "Connection refused" in error
    assert "--base-url" in error and "aiq resume" in error
    assert "max-outage" not in error
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    assert status["counts"]["queued"] == 20
    assert _attempts(tmp_path / ".aiq" / "aiq.db") == {0}  # no job was charged for it


def test_an_outage_quotes_the_servers_last_error_in_progress_and_final_error(
    tmp_path: Path,
) -> None:
    # llama.cpp answers a request it cannot serve with HTTP 500: an answer, so an outage.
    write_prompts(tmp_path / "f.jsonl", [(f"c{i}", f"prompt {i}") for i in range(30)])
    with FakeServer(status_for_all=500) as server:
        started = time.monotonic()
        done = run_aiq("run", "f.jsonl", "--base-url", server.base_url, "--model", "m",
                       "--concurrency", "10", "--max-outage", "2",
                       "--log-file", "aiq.log", cwd=tmp_path)  # fmt: skip
        elapsed = time.monotonic() - started

    assert done.returncode == 4, done.stderr
    assert 2 <= elapsed < 15
    said = "HTTP 500: The server had an error while processing your request"
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert said in error
    assert "over 2 s (--max-outage)" in error and " min" not in error
    progress = [line for line in done.stderr.splitlines() if "provider down" in line]
    assert progress and all(f"last error: {said}" in line for line in progress)
    assert f"last error: {said}" in (tmp_path / "aiq.log").read_text()
    assert _attempts(tmp_path / ".aiq" / "aiq.db") <= {0, 1}  # before the breaker opened


def test_an_endpoint_that_answered_then_went_away_is_an_outage(tmp_path: Path) -> None:
    write_prompts(tmp_path / "f.jsonl", [(f"c{i}", f"prompt {i}") for i in range(60)])
    server = FakeServer(latency_s=0.02).start()
    stopped = threading.Event()

    def stop_after_ten() -> None:
        while sum(r.method == "POST" for r in server.requests) < 10:
            time.sleep(0.005)
        server.stop()  # the port closes: every later call is refused
        stopped.set()

    threading.Thread(target=stop_after_ten, daemon=True).start()
    try:
        started = time.monotonic()
        done = run_aiq("run", "f.jsonl", "--base-url", server.base_url, "--model", "m",
                       "--concurrency", "4", "--max-outage", "3", cwd=tmp_path)  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        if not stopped.wait(10):
            server.stop()

    assert done.returncode == 4, done.stderr
    assert elapsed >= 3  # waited out --max-outage: it had answered, so it may come back
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "over 3 s (--max-outage)" in error and "Connection refused" in error
    counts = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)["counts"]
    assert counts["done"] >= 10 and counts["dead"] == 0
