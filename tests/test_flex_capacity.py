"""A flex tier out of capacity is backed off, not paced to (issue 15, item 7's errors): OpenAI's
``429 Resource Unavailable`` costs no attempt, and the rate limiter learns nothing from it, so
once the tier has room the bucket's burst is still there to use."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import read_jsonl, run_aiq, write_prompts
from fakeserver import FakeServer
from fakeserver import modes as fl

from aiq.providers.failures import classify_status

JOBS = 300


@pytest.mark.parametrize(
    ("status", "message", "code", "codes"),
    [
        (429, "HTTP 429: Resource Unavailable", None, frozenset()),  # the guide's words
        (429, "HTTP 429: busy", "resource_unavailable", frozenset({"resource_unavailable"})),
        (498, "HTTP 498: Flex Tier Capacity Exceeded", None, frozenset()),  # Groq's flex
        (498, "HTTP 498: no room", "capacity_exceeded", frozenset({"capacity_exceeded"})),
    ],
)
def test_a_tier_with_no_room_is_capacity_not_a_rate_limit(
    status: int, message: str, code: str | None, codes: frozenset[str]
) -> None:
    assert classify_status(status, message, code, codes=codes) == ("capacity", True, False)


def test_a_rate_limit_429_is_still_one() -> None:
    message = "HTTP 429: Rate limit reached for gpt-4o-mini on requests per min (RPM)"
    assert classify_status(429, message, "rate_limit_exceeded") == ("rate_limit", True, False)


@pytest.mark.slow
def test_no_capacity_for_a_while_costs_no_attempt_and_keeps_the_burst(tmp_path: Path) -> None:
    # A bucket of 600 full at the start, the tier busy for half a second once 50 got through,
    # while aiq sends from the bucket. Paced after a "rate limit", the other 250 would take
    # 25 s at 10 a second; with the burst kept they go when the tier has room again.
    write_prompts(tmp_path / "p.jsonl", [(f"f{i}", f"flex prompt {i}") for i in range(JOBS)])
    mode = fl.FlexCapacity(fl.OpenAIBucket(rpm=600), after=50, busy_s=0.5)
    with FakeServer(limit_mode=mode, latency_s=0.05) as server:
        started = time.monotonic()
        proc = run_aiq(
            "run", "p.jsonl", "--base-url", server.base_url, "--model", "gpt-4o-mini",
            "--json", "--quiet", cwd=tmp_path, timeout=60,
        )  # fmt: skip
        took_s = time.monotonic() - started
        posts = [r for r in server.requests if r.method == "POST"]
    assert proc.returncode == 0, proc.stderr
    assert mode.refused >= 1  # the tier was busy for a while
    assert json.loads(proc.stdout)["status"]["counts"]["done"] == JOBS
    # (aiq's start and export included: 3.0 s; 27.6 s when taken for a rate limit)
    assert took_s < 12, took_s
    assert sum(r.status == 429 for r in posts) == mode.refused
    results = [json.loads(line) for line in (tmp_path / "p.results.jsonl").read_text().splitlines()]
    assert len(results) == JOBS


@pytest.mark.slow
def test_via_flex_asks_the_flex_tier_of_every_chat_request_whose_line_names_none(
    tmp_path: Path,
) -> None:
    lines = [
        {"custom_id": "plain", "prompt": "flex me"},
        {"custom_id": "own", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gpt-4o-mini", "service_tier": "auto",
                  "messages": [{"role": "user", "content": "my own tier"}]}},
        {"custom_id": "emb", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "text-embedding-3-small", "input": "no tiers here"}},
    ]  # fmt: skip
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with FakeServer(latency_s=0.01) as server:
        proc = run_aiq(
            "run", "p.jsonl", "--base-url", server.base_url, "--model", "gpt-4o-mini",
            "--via", "flex", "--quiet", cwd=tmp_path, timeout=60,
        )  # fmt: skip
        bodies = {r.prompt: r.body for r in server.requests if r.method == "POST"}
    assert proc.returncode == 0, proc.stderr
    assert bodies["flex me"]["service_tier"] == "flex"
    assert bodies["my own tier"]["service_tier"] == "auto"  # the line's own wins
    assert "service_tier" not in bodies["no tiers here"]  # embeddings take none
    results = {r["custom_id"]: r for r in read_jsonl(tmp_path / "p.results.jsonl")}
    assert results["plain"]["response"]["body"]["service_tier"] == "flex"
    # The store keeps the request as the line gave it: the tier is how this run sent it.
    show = run_aiq("show", "plain", "--json", cwd=tmp_path)
    assert show.returncode == 0, show.stderr
    assert "service_tier" not in json.loads(show.stdout)["lines"][0]["request"]["body"]
    # ...and the tier that billed each reply: flex where the reply said so, else online.
    billed = {
        c: json.loads(run_aiq("show", c, "--json", cwd=tmp_path).stdout)["lines"][0]["tier"]
        for c in ("plain", "own", "emb")
    }
    assert billed == {"plain": "flex", "own": "online", "emb": "online"}


def test_via_flex_is_refused_for_a_provider_without_the_tier(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text(json.dumps({"custom_id": "a", "prompt": "hi"}) + "\n")
    proc = run_aiq(
        "run", "p.jsonl", "--provider", "anthropic", "--model", "claude-sonnet-4-5",
        "--via", "flex", "--base-url", "http://127.0.0.1:9", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "--via flex is OpenAI's flex tier" in proc.stderr
