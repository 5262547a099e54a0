"""--concurrency auto end to end: a real `aiq run` against the fake server, with no limit known
(the capacity it finds) and with one the machine or max_concurrency holds back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import API_KEY, run_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

LATENCY_S = 0.1


def test_with_no_limit_known_a_one_slot_server_gets_about_one_in_flight(tmp_path: Path) -> None:
    # A llama.cpp server with one slot: it answers one request at a time and queues the rest.
    # Sending 32 at once would multiply each one's latency by 32 for no more replies a second.
    jobs = 30
    write_prompts(tmp_path / "p.jsonl", [(f"c{i}", f"prompt {i}") for i in range(jobs)])
    with FakeServer(require_key=API_KEY, latency_s=LATENCY_S, max_parallel=1) as server:
        proc = run_aiq(
            "run", "p.jsonl", "--base-url", server.base_url, "--model", "m", "--json",
            cwd=tmp_path,
        )  # fmt: skip
        received = sorted(r.received for r in server.requests)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["done_now"] == jobs
    assert 1 <= summary["max_in_flight"] <= 3
    assert summary["held_by"] is None
    # As fast as one at a time: the slot never idles long between requests (the margin is
    # for a loaded machine's turnaround, which one at a time pays on every request).
    assert received[-1] - received[0] <= (jobs - 1) * LATENCY_S * 1.5 + 0.5


def test_max_concurrency_holds_it_back_and_the_run_says_so(tmp_path: Path) -> None:
    # 6,000/min at 0.3 s needs ~40 in flight; the config allows 4.
    (tmp_path / "aiq.yaml").write_text("max_concurrency: 4\n")
    write_prompts(tmp_path / "p.jsonl", [(f"c{i}", f"prompt {i}") for i in range(24)])
    with FakeServer(require_key=API_KEY, latency_s=0.3) as server:
        proc = run_aiq(
            "run", "p.jsonl", "--base-url", server.base_url, "--model", "m", "--rpm", "6000",
            "--json", "--log-file", "run.log", cwd=tmp_path,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["max_in_flight"] == 4
    assert summary["held_by"] == "max_concurrency 4"
    # The progress lines and the summary (here in the log file) say it too.
    log = (tmp_path / "run.log").read_text()
    assert re.search(r"in flight \d+ \(held back by max_concurrency 4\)", log)
    assert "in flight: at most 4 at once, held back by max_concurrency 4" in log
