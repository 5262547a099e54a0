"""What aiq promises a user about stopping, where jobs go, skipped input and leftover state."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from conftest import read_jsonl, start_aiq, write_prompts
from fakeserver import FakeServer


def _wait_for_requests(server: FakeServer, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(server.requests) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(server.requests) >= n, "the requests never reached the server"


def test_a_second_signal_abandons_what_is_in_flight_at_once(tmp_path: Path) -> None:
    write_prompts(tmp_path / "h.jsonl", [(f"h{i}", f"hangs {i}") for i in range(4)])
    with FakeServer(hang_rate=1.0, hang_s=600.0) as server:
        args = ["--base-url", server.base_url, "--model", "m", "--concurrency", "2"]
        proc = start_aiq("run", "h.jsonl", *args, "--timeout", "600", cwd=tmp_path, capture=True)
        _wait_for_requests(server, 2)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        out, err = proc.communicate(timeout=15)
        # The grace for a drain is 30 s: only the second signal ends it this soon.
        assert time.monotonic() - started < 5
    assert proc.returncode == 130, err
    assert "aiq resume" in out


def test_a_drain_that_finishes_every_job_exits_as_a_finished_run(tmp_path: Path) -> None:
    write_prompts(tmp_path / "d.jsonl", [(f"d{i}", f"slow {i}") for i in range(4)])
    with FakeServer(latency_s=2.0) as server:
        args = ["--base-url", server.base_url, "--model", "m", "--concurrency", "4"]
        proc = start_aiq("run", "d.jsonl", *args, cwd=tmp_path, capture=True)
        assert proc.stderr is not None
        # The server logs a request once answered: the progress line says when all are out.
        while "in flight 4" not in (line := proc.stderr.readline()):
            assert line, "the run ended before its requests were in flight"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    assert "interrupted" not in out
    assert len(read_jsonl(tmp_path / "d.results.jsonl")) == 4
