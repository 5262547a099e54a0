"""aiq against the fake server's ways of counting (tests/fake_limits.py), end to end: every job
done, 429s under 1%, and the sending time near the least the mode allows. Kept small: a high
limit and a few hundred jobs, a few seconds a run. The modes still under target (bench/README,
"Rate-limit modes") have no test here yet: LiteLLM's calendar minute, Azure's 10 s windows,
another client on the key."""

from __future__ import annotations

import json
from pathlib import Path

import fake_limits as fl
import pytest
from conftest import run_aiq, write_prompts
from fakeserver import FakeServer

JOBS = 400
LATENCY_S = 0.05


def _run(tmp_path: Path, mode: fl.Mode, *flags: str) -> tuple[list, float]:
    write_prompts(tmp_path / "p.jsonl", [(f"p{i}", f"mode prompt {i}") for i in range(JOBS)])
    with FakeServer(limit_mode=mode, latency_s=LATENCY_S) as server:
        proc = run_aiq("run", "p.jsonl", "--base-url", server.base_url, "--model", "m",
                       "--quiet", "--json", *flags, cwd=tmp_path, timeout=120)  # fmt: skip
        posts = [r for r in server.requests if r.method == "POST"]
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"]["counts"]["done"] == JOBS
    refused = sum(r.status == 429 for r in posts)
    assert refused <= 0.01 * len(posts), refused
    wall = max(r.monotonic for r in posts) - min(r.received for r in posts)
    return posts, wall


@pytest.mark.parametrize("flags", [("--rpm", "6000"), ()], ids=["configured", "learned"])
def test_a_limit_enforced_per_second_is_used_to_the_full(tmp_path: Path, flags: tuple) -> None:
    # 6,000/min as a bucket of 100 refilled at 100/s. Against the sustained rate (100 a
    # second): aiq does not yet send the bucket's first 100 at once, which the least time
    # (3 s, not 4) would need; bench/README's per-second rows carry that gap.
    _, wall = _run(tmp_path, fl.PerSecond(rpm=6000), *flags)
    paced = (JOBS - 1) / 100
    # The bench's target is 0.95; here 0.85, for a suite on three workers sharing two cores.
    assert (paced + LATENCY_S) / wall >= 0.85, wall


@pytest.mark.parametrize("flags", [("--rpm", "6000"), ()], ids=["configured", "learned"])
def test_a_full_minute_bucket_is_sent_at_once(tmp_path: Path, flags: tuple) -> None:
    # OpenAI's bucket is full at the start: 400 of a 6,000/min limit may all go now. Paced
    # evenly they would take 4 s.
    _, wall = _run(tmp_path, fl.OpenAIBucket(rpm=6000), *flags)
    assert wall < 2.0, wall
