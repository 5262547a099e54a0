"""Cost accounting and --max-cost, end to end against the fake server.

Every expected figure is computed here by hand from how the fake server counts usage (about
four characters a token, at least one: ``fakeserver.replies._tokens``), never read back from aiq.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest
from conftest import API_KEY, aiq_env, read_jsonl, run_aiq, undo_tallies, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

PRICE_IN, PRICE_OUT = 1.5, 4.0  # USD per 1M tokens for model "m"
CONFIG = f"prices:\n  m: {{input: {PRICE_IN}, output: {PRICE_OUT}}}\n"


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _cost(prompt: str, *, price_in: float = PRICE_IN, price_out: float = PRICE_OUT) -> float:
    reply = FakeServer.reply_text(prompt)
    return (_tokens(prompt) * price_in + _tokens(reply) * price_out) / 1e6


def _status(tmp_path: Path) -> dict:
    proc = run_aiq("status", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cost_per_job_and_per_model_equals_the_usage_priced_by_hand(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    priced = [(f"p{i}", f"question {i}: " + "why? " * i) for i in range(12)]
    write_prompts(tmp_path / "p.jsonl", priced)
    other = {"custom_id": "o1", "prompt": "unpriced model", "model": "other-model"}
    with (tmp_path / "p.jsonl").open("a") as f:
        f.write(json.dumps(other) + "\n")

    proc = run_aiq("run", "p.jsonl", "--base-url", server.base_url, "--model", "m", "--json",
                   "--metrics-file", "aiq.prom", cwd=tmp_path)  # fmt: skip

    assert proc.returncode == 0, proc.stderr
    expected = sum(_cost(p) for _, p in priced)
    summary = json.loads(proc.stdout)
    assert math.isclose(summary["cost_usd"], expected, rel_tol=1e-9)
    assert summary["unpriced"] == 1
    metrics = (tmp_path / "aiq.prom").read_text()
    (cost_line,) = [x for x in metrics.splitlines() if x.startswith("aiq_cost_usd_total ")]
    assert math.isclose(float(cost_line.split()[1]), expected, rel_tol=1e-6)
    status = _status(tmp_path)
    assert math.isclose(status["cost_usd"], expected, rel_tol=1e-9)
    assert status["unpriced"] == 1  # the other model's job: its cost is unknown, not 0
    models = {m["model"]: m for m in status["models"]}
    assert models["m"]["done"] == 12
    assert models["m"]["tokens_in"] == sum(_tokens(p) for _, p in priced)
    assert models["m"]["tokens_out"] == sum(_tokens(server.reply_text(p)) for _, p in priced)
    assert math.isclose(models["m"]["cost_usd"], expected, rel_tol=1e-9)
    assert models["other-model"]["cost_usd"] is None
    assert models["other-model"]["tokens_in"] == _tokens("unpriced model")

    text = run_aiq("status", cwd=tmp_path).stdout
    assert "  m: 12 done" in text and "  other-model: 1 done" in text
    assert "cost unknown" in text


def test_anthropic_usage_is_priced_from_the_default_table(
    tmp_path: Path, server: FakeServer
) -> None:
    prompts = [(f"a{i}", f"tell me about {i}") for i in range(5)]
    write_prompts(tmp_path / "a.jsonl", prompts)
    env = aiq_env(ANTHROPIC_API_KEY=API_KEY)
    env.pop("ANTHROPIC_BASE_URL", None)

    proc = run_aiq(
        "run", "a.jsonl", "--provider", "anthropic", "--base-url", server.base_url,
        "--model", "claude-sonnet-4-5-20250929", "--json", cwd=tmp_path, env=env,
    )  # fmt: skip

    assert proc.returncode == 0, proc.stderr
    # A dated snapshot is priced as its family: claude-sonnet-4-5, $3 / $15 per 1M.
    expected = sum(_cost(p, price_in=3.0, price_out=15.0) for _, p in prompts)
    assert math.isclose(json.loads(proc.stdout)["cost_usd"], expected, rel_tol=1e-9)


def test_max_cost_stops_within_one_job_of_the_cap_and_resumes_with_a_higher_one(
    tmp_path: Path, server: FakeServer
) -> None:
    # $1,000 per 1M tokens: a job costs about two cents, so the cap falls after a dozen.
    (tmp_path / "aiq.yaml").write_text("prices:\n  m: {input: 1000, output: 1000}\n")
    prompts = [(f"q{i:02d}", f"question {i:02d}: what is {i} squared?") for i in range(40)]
    (tmp_path / "p.jsonl").write_text(
        "".join(
            json.dumps({"custom_id": c, "prompt": p, "max_tokens": 20}) + "\n" for c, p in prompts
        )
    )
    job_cost = {p: _cost(p, price_in=1000, price_out=1000) for _, p in prompts}
    # What aiq may reserve for a job: its prompt estimate plus the max_tokens ceiling.
    ceiling = max((_tokens(p) + 20) * 1000 / 1e6 for _, p in prompts)
    cap = 0.25
    args = ("--base-url", server.base_url, "--concurrency", "4", "--json")

    proc = run_aiq("run", "p.jsonl", *args, "--model", "m", "--max-cost", str(cap), cwd=tmp_path)

    assert proc.returncode == 5, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["stopped"] == "budget"
    sent = [r.prompt for r in server.requests if r.status == 200]
    spent = sum(job_cost[p] for p in sent)
    assert cap - ceiling < spent <= cap  # stopped within one job of the cap, not past it
    assert math.isclose(_status(tmp_path)["cost_usd"], spent, rel_tol=1e-9)
    assert 0 < len(sent) < len(prompts)

    same = run_aiq("resume", *args, "--max-cost", str(cap), cwd=tmp_path)
    assert same.returncode == 5  # the cap counts the store's spend: nothing more fits
    assert len(server.requests) == len(sent)

    done = run_aiq("resume", *args, "--max-cost", "5", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert sorted(r.prompt for r in server.requests) == sorted(p for _, p in prompts)  # once each
    assert len(read_jsonl(tmp_path / "p.results.jsonl")) == len(prompts)
    assert math.isclose(_status(tmp_path)["cost_usd"], sum(job_cost.values()), rel_tol=1e-9)


def test_max_cost_refuses_a_model_without_a_price(tmp_path: Path, server: FakeServer) -> None:
    write_prompts(tmp_path / "p.jsonl", [("a", "hello")])

    proc = run_aiq("run", "p.jsonl", "--base-url", server.base_url, "--model", "house-model",
                   "--max-cost", "1", cwd=tmp_path)  # fmt: skip

    assert proc.returncode == 2
    assert "house-model" in proc.stderr and "prices:" in proc.stderr
    assert server.requests == []


def test_a_run_of_an_unpriced_model_says_its_cost_is_unknown_not_zero(
    tmp_path: Path, server: FakeServer
) -> None:
    write_prompts(tmp_path / "p.jsonl", [("a", "hello"), ("b", "bye")])

    proc = run_aiq("run", "p.jsonl", "--base-url", server.base_url, "--model", "house-model",
                   cwd=tmp_path)  # fmt: skip

    assert proc.returncode == 0, proc.stderr
    assert "cost unknown" in proc.stdout and "$0" not in proc.stdout
    assert _status(tmp_path)["cost_usd"] is None


def test_a_store_from_before_cost_accounting_is_upgraded_with_its_models(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    write_prompts(tmp_path / "p.jsonl", [("a", "hello"), ("b", "bye")])
    assert run_aiq("run", "p.jsonl", "--base-url", server.base_url, "--model", "m",
                   cwd=tmp_path).returncode == 0  # fmt: skip
    db = tmp_path / ".aiq" / "aiq.db"
    with sqlite3.connect(db) as conn:  # back to the schema of 0001_initial
        undo_tallies(conn)
        conn.execute("ALTER TABLE jobs DROP COLUMN model")
        conn.execute("ALTER TABLE jobs DROP COLUMN cost_usd")
        conn.execute("DELETE FROM migrations WHERE name = '0002_cost'")
    conn.close()

    check = run_aiq("check", "--provider", "simulated", cwd=tmp_path)
    assert check.returncode == 0 and "the next run upgrades it" in check.stdout
    assert run_aiq("add", "p.jsonl", "--model", "m", cwd=tmp_path).returncode == 0  # upgrades

    status = _status(tmp_path)
    # The model comes back from the bodies; the cost of those replies was never recorded.
    assert [(m["model"], m["done"], m["unpriced"]) for m in status["models"]] == [("m", 2, 2)]
    assert status["cost_usd"] is None


def test_a_reply_served_at_the_flex_tier_is_priced_at_half(
    tmp_path: Path, server: FakeServer
) -> None:
    # The same prompts, asked at the flex tier and at the default one: the replies' own
    # service_tier says which served each, and flex is billed at batch rates (half).
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    prompts = [f"tier question {i}" for i in range(6)]
    with (tmp_path / "p.jsonl").open("w") as f:
        for i, prompt in enumerate(prompts):
            for tier in ("flex", None):
                body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
                if tier:
                    body["service_tier"] = tier
                line = {"custom_id": f"{tier or 'default'}-{i}", "method": "POST",
                        "url": "/v1/chat/completions", "body": body}  # fmt: skip
                f.write(json.dumps(line) + "\n")
    proc = run_aiq("run", "p.jsonl", "--base-url", server.base_url, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    full = sum(_cost(p) for p in prompts)
    assert math.isclose(json.loads(proc.stdout)["cost_usd"], full + full / 2, rel_tol=1e-9)
    served = {r["custom_id"]: r["response"]["body"]["service_tier"]
              for r in read_jsonl(tmp_path / "p.results.jsonl")}  # fmt: skip
    assert set(served.values()) == {"flex", "default"}
