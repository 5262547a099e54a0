"""Anthropic's separate input and output token limits, end to end: a real ``aiq run`` against
the fake server counting as Anthropic does (``fakeserver.modes.AnthropicBuckets``: cache reads free
of ITPM, OTPM counted on the tokens generated, ``max_tokens`` reserved on arrival), judged
from the server's own log.

The batch is the case issue 13 names: a long system prompt marked for the prompt cache, a
short question, ``max_tokens`` 4,096 and replies of 50 tokens. The output limit allows 20
replies a second; one budget of prompt plus ``max_tokens`` against the tighter ``tokens-*``
header (aiq before this) would send one every 6 s.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import API_KEY, aiq_cmd, aiq_env
from fakeserver import FakeServer
from fakeserver import modes as fl

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

MODEL = "claude-sonnet-4-5"
SYSTEM = "You answer questions about the fake server's documentation. " * 140  # ~2,100 tokens
REPLY_TOKENS = 50
MAX_TOKENS = 4096
OTPM = 60_000  # under split_tokens.RAMP_FROM_PER_MINUTE: no ramp, the whole pace at once
ITPM = 90_000  # 45 uncached prompts a minute; with the cache read, thousands
# As tests/test_limit_modes_e2e.py: 0.95+ alone, a floor for a suite sharing two cores.
EFFICIENCY = 0.8


def write_cached_batch(path: Path, jobs: int) -> None:
    """Message Batches lines sharing one system prompt marked ``cache_control``."""
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    with path.open("w") as f:
        for i in range(jobs):
            params = {
                "model": MODEL,
                "max_tokens": MAX_TOKENS,
                "system": system,
                "messages": [{"role": "user", "content": f"Question {i}: what does knob {i} do?"}],
            }
            f.write(json.dumps({"custom_id": f"q{i}", "params": params}) + "\n")


def test_a_prompt_cached_batch_with_large_max_tokens_reaches_the_output_limit(
    tmp_path: Path,
) -> None:
    jobs = 50
    write_cached_batch(tmp_path / "p.jsonl", jobs)
    mode = fl.AnthropicBuckets(rpm=6000, itpm=ITPM, otpm=OTPM)
    with FakeServer(limit_mode=mode, latency_s=0.2, reply_tokens=REPLY_TOKENS) as server:
        cmd = aiq_cmd(
            "run", "p.jsonl", "--provider", "anthropic", "--base-url", server.base_url,
            "--quiet", "--json",
        )  # fmt: skip
        done = subprocess.run(
            cmd, cwd=tmp_path, env=aiq_env(ANTHROPIC_API_KEY=API_KEY), capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        posts = [r for r in server.requests if r.method == "POST"]
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"]["counts"]["done"] == jobs
    refused = [r for r in posts if r.status == 429]
    admitted = sorted(r.admitted_at for r in posts if r.admitted_at is not None)
    # Output generated from the third admitted request to the last (the first two go before
    # any reply has told the limits and the sizes), against the sustained rate OTPM allows
    # (a bucket full at start would allow more at once; aiq paces).
    span = admitted[-1] - admitted[2]
    efficiency = (len(admitted) - 3) * REPLY_TOKENS / (OTPM / 60 * span)
    said = f"{len(refused)} 429s of {len(posts)}, {span:.2f} s, efficiency {efficiency:.3f}"
    assert len(refused) <= 2, said  # before the first reply aiq knows no limit
    assert efficiency >= EFFICIENCY, said
    assert efficiency <= 1.05, said  # paced, not sent at once
    # The cache was read: ITPM counted the question and one write of the system prompt, not
    # 50 system prompts (which would be ~105,000 tokens, over the limit).
    replies = [json.loads(line) for line in (tmp_path / "p.results.jsonl").read_text().splitlines()]
    reads = [r["response"]["body"]["usage"]["cache_read_input_tokens"] for r in replies]
    assert sum(1 for n in reads if n > 0) >= jobs - 5
