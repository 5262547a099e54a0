"""kill -9 at random moments, then resume: nothing finished is lost, nothing is written twice."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer

from aiq.dispatch import _AHEAD

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

CONCURRENCY = 8


def test_sigkill_at_random_moments_then_resume(tmp_path: Path) -> None:
    # ~5 s of work at 8 x 20/s; each cycle gets well under 1 s of it, so most cycles are cut.
    prompts = [(f"c{i}", f"crash test prompt {i}") for i in range(800)]
    write_prompts(tmp_path / "k.jsonl", prompts)
    rng = random.Random(1234)
    kills = 0
    with FakeServer(latency_s=0.05) as server:
        url = ["--base-url", server.base_url]
        args = [*url, "--concurrency", str(CONCURRENCY)]
        for i in range(10):
            # `run` re-enqueues idempotently, so a kill during enqueue loses nothing either.
            command = ("run", "k.jsonl", "--model", "m") if i % 2 == 0 else ("resume",)
            proc = start_aiq(*command, *args, cwd=tmp_path)
            time.sleep(rng.uniform(0.4, 0.9))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait(timeout=30)
        # Never killed, so its concurrency bounds no resend: wide, to finish the rest quickly.
        final = run_aiq("run", "k.jsonl", "--model", "m", *url, "--concurrency", "64",
                        cwd=tmp_path)  # fmt: skip
        assert final.returncode == 0, final.stderr

    assert kills >= 5  # most cycles really were cut short
    results = read_jsonl(tmp_path / "k.results.jsonl")
    by_id = {r["custom_id"]: r for r in results}
    assert len(results) == len(by_id) == len(prompts)  # each custom_id exactly once
    for custom_id, prompt in prompts:
        body = by_id[custom_id]["response"]["body"]
        assert body["choices"][0]["message"]["content"] == server.reply_text(prompt)
    sent = Counter(r.prompt for r in server.requests)
    assert set(sent) == {p for _, p in prompts}
    # A prompt is sent again only if a kill landed between its claim and the commit of its
    # outcome; a run holds at most _AHEAD jobs per sender claimed.
    resent = sum(n - 1 for n in sent.values())
    assert resent <= kills * CONCURRENCY * _AHEAD


def test_a_request_in_flight_at_every_kill_is_dead_after_max_attempts(tmp_path: Path) -> None:
    """A request that always takes the process down with it must not loop forever."""
    write_prompts(tmp_path / "h.jsonl", [("h1", "a request that never comes back")])
    args = ["--max-attempts", "2", "--timeout", "600", "--concurrency", "1"]
    with FakeServer(hang_rate=1.0, hang_s=600.0) as server:
        args += ["--base-url", server.base_url]
        for n in (1, 2):
            command = ("run", "h.jsonl", "--model", "m") if n == 1 else ("resume",)
            proc = start_aiq(*command, *args, cwd=tmp_path)
            deadline = time.monotonic() + 20
            while len(server.requests) < n and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(server.requests) == n, "the request never reached the server"
            time.sleep(0.3)  # past the store cycle that counts the attempt (every 50 ms)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        final = run_aiq("resume", *args, cwd=tmp_path)
        assert len(server.requests) == 2  # not sent a third time
    assert final.returncode == 1, final.stderr  # finished, with a dead job
    (dead,) = read_jsonl(tmp_path / "h.dead.jsonl")
    assert dead["custom_id"] == "h1"
    assert dead["error"]["type"] == "crashed"
    assert "in flight" in dead["error"]["message"]
