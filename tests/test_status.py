"""`aiq status`: whether a run is active, what is in flight, and a rate over the time it has run.

End to end against a slow fake server (a run, then a kill -9), and lock.run_state on its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer

from aiq.contract import StateName
from aiq.lock import StoreLock, run_state
from aiq.report import status_lines
from aiq.stats import RunState, Stats


def _status(cwd: Path) -> dict:
    proc = run_aiq("status", "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_status_of_a_live_run_then_of_one_killed(tmp_path: Path) -> None:
    write_prompts(tmp_path / "p.jsonl", [(f"q{i}", f"question {i}") for i in range(60)])
    with FakeServer(latency_s=0.5) as server:
        args = ("--base-url", server.base_url, "--model", "m", "--concurrency", "2")
        proc = start_aiq("run", "p.jsonl", *args, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 30
            while len(server.requests) < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
            # A request is marked in flight at the worker's next store cycle (<= 50 ms): look
            # again if both requests had only just gone out.
            for _ in range(4):
                s = _status(tmp_path)
                # Two senders: two in flight at most; the rest of `running` is claimed ahead.
                assert s["in_flight"] <= 2 < s["counts"]["running"], s
                if s["in_flight"]:
                    break
            text = run_aiq("status", cwd=tmp_path).stdout
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)

        assert s["active"] is True and s["run"]["pid"] == proc.pid
        assert s["in_flight"] >= 1 and s["claimed"] == s["counts"]["running"] - s["in_flight"]
        # The rate is of the seconds the run has been sending, not of a whole minute.
        since = s["run"]["sending_since"]
        assert 1.0 <= s["rate_window_s"] <= time.time() - since
        assert abs(s["rate_per_s"] * s["rate_window_s"] - s["counts"]["done"]) <= 1
        assert s["rate_per_s"] > 1.0 and s["eta_s"] is not None  # 2 per 0.5 s: ~4/s
        assert "run active (pid " in text and " in flight, " in text and "eta " in text

        dead = _status(tmp_path)
        assert dead["active"] is False and dead["run"]["died"] is True
        assert dead["abandoned"] == dead["counts"]["running"] > 0
        assert (dead["in_flight"], dead["claimed"], dead["eta_s"]) == (0, 0, None)
        text = run_aiq("status", cwd=tmp_path).stdout
        assert "no run is active: the last one (pid " in text and ") died" in text
        assert "(abandoned)" in text and "go back to the queue on `aiq resume`" in text
        assert "eta" not in text

        server.latency_s = 0.0
        resumed = run_aiq("resume", "--base-url", server.base_url, cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr

    after = _status(tmp_path)
    assert after["active"] is False and after["run"]["died"] is False
    assert after["run"]["ended_at"] >= after["run"]["started_at"]
    assert (after["counts"]["running"], after["abandoned"], after["eta_s"]) == (0, 0, 0.0)


def test_run_state_reads_the_lock_without_taking_it(tmp_path: Path) -> None:
    db = tmp_path / "aiq.db"
    assert run_state(db).active is False and not Path(f"{db}.lock").exists()  # not created

    with StoreLock(db) as lock:
        lock.note(sending_since=123.0)
        held = run_state(db)
        assert (held.active, held.pid, held.sending_since) == (True, os.getpid(), 123.0)
    ended = run_state(db)
    assert not ended.active and not ended.died and ended.ended_at is not None

    # A run killed: its word is left, with no end; the lock is free.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    for pid in (int(gone.stdout), os.getpid()):  # a pid no process has; one that is alive
        info = {"pid": pid, "host": socket.gethostname(), "started_at": 1.0}
        Path(f"{db}.lock").write_text(json.dumps(info))
        died = run_state(db)
        assert (died.active, died.died, died.pid) == (False, True, pid)
    with StoreLock(db):  # and the lock is still free for the next run
        pass
    Path(f"{db}.lock").write_text("")  # as an older aiq left it at the end of a run
    assert (run_state(db).active, run_state(db).died) == (False, False)


def test_the_text_says_when_the_last_run_ended_and_shows_no_rate() -> None:
    counts: dict[StateName, int] = {"queued": 3, "running": 0, "done": 7, "dead": 0}
    ended = RunState(active=False, pid=1, host="h", started_at=1_000.0, ended_at=1_030.0)
    s = Stats(total=10, counts=counts, done_recent=7, tokens_in=0, tokens_out=0,
              oldest_queued_s=40.0, top_errors=[], run=ended)  # fmt: skip

    lines = status_lines(s, now=1_150.0)

    assert lines[1] == "queued 3 · running 0 · done 7 · dead 0"
    assert lines[2].startswith("no run is active (the last one ended ")
    assert lines[2].endswith(", 2m00s ago) · oldest queued 40s")
    assert (s.rate_per_s, s.eta_s) == (0.0, None)
