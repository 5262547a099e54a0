"""A spend limit is money, not pacing: the run stops at once with exit 4, every unfinished job
left queued for `aiq resume`, and a message that names the limit and what to do (issue 13).
Before, each refusal was retried as a rate limit, forever (1,068 refused calls in 2 minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_aiq, write_prompts
from fakeserver import FakeServer
from fakeserver import modes as fl

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

JOBS, AFTER = 40, 5


@pytest.mark.parametrize(
    ("shape", "provider", "model"),
    [
        ("openai-organization", "openai", "gpt-4o-mini"),
        ("openai-project", "openai", "gpt-4o-mini"),
        ("anthropic", "anthropic", "claude-sonnet-4-5"),
    ],
)
def test_a_spend_limit_stops_the_run_and_keeps_every_job(
    tmp_path: Path, shape: str, provider: str, model: str
) -> None:
    write_prompts(tmp_path / "p.jsonl", [(f"s{i}", f"spend prompt {i}") for i in range(JOBS)])
    mode = fl.SpendLimit(after=AFTER, shape=shape)
    with FakeServer(limit_mode=mode, latency_s=0.02) as server:
        proc = run_aiq(
            "run", "p.jsonl", "--provider", provider, "--base-url", server.base_url,
            "--model", model, "--concurrency", "4", cwd=tmp_path, timeout=60,
        )  # fmt: skip
        posts = [r for r in server.requests if r.method == "POST"]
    assert proc.returncode == 4, proc.stderr
    assert "spend limit" in proc.stderr, proc.stderr
    assert "aiq resume" in proc.stderr, proc.stderr
    # No storm: the calls in flight when the first refusal came, not hundreds.
    refused = sum(r.status == 429 for r in posts)
    assert 1 <= refused <= 4, refused
    status = run_aiq("status", "--json", cwd=tmp_path)
    counts = json.loads(status.stdout)["counts"]
    assert counts["done"] == AFTER
    assert counts.get("dead", 0) == 0  # none is the job's own fault
    assert counts["queued"] == JOBS - AFTER
