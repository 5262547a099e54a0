"""kill -9 at random moments, then resume: nothing finished is lost, nothing is written twice."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

from conftest import read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer

from aiq.worker import _AHEAD

CONCURRENCY = 8


def test_sigkill_at_random_moments_then_resume(tmp_path: Path) -> None:
    # ~5 s of work at 8 x 20/s; each cycle gets well under 1 s of it, so most cycles are cut.
    prompts = [(f"c{i}", f"crash test prompt {i}") for i in range(800)]
    write_prompts(tmp_path / "k.jsonl", prompts)
    rng = random.Random(1234)
    kills = 0
    with FakeServer(latency_s=0.05) as server:
        args = ["--base-url", server.base_url, "--concurrency", str(CONCURRENCY)]
        for i in range(10):
            # `run` re-enqueues idempotently, so a kill during enqueue loses nothing either.
            command = ("run", "k.jsonl", "--model", "m") if i % 2 == 0 else ("resume",)
            proc = start_aiq(*command, *args, cwd=tmp_path)
            time.sleep(rng.uniform(0.4, 0.9))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait(timeout=30)
        final = run_aiq("run", "k.jsonl", "--model", "m", *args, cwd=tmp_path)
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
