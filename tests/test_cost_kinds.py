"""Cached, cache-written and reasoning tokens in the cost, and replies whose usage is not
counts, end to end: a real fake server, real ``aiq`` subprocesses.

Every expected figure is computed here by hand from how the fake server counts usage (about
four characters a token, at least one: ``fakeserver.replies._tokens``), never read back from aiq.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import API_KEY, aiq_env, read_jsonl, run_aiq, undo_tallies, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _status(tmp_path: Path) -> dict:
    proc = run_aiq("status", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _metric(tmp_path: Path, name: str) -> float:
    lines = (tmp_path / "aiq.prom").read_text().splitlines()
    (line,) = [x for x in lines if x.startswith(name + " ")]
    return float(line.split()[1])


def test_openai_cached_and_reasoning_tokens_are_counted_and_priced_by_hand(
    tmp_path: Path,
) -> None:
    # Input $2, cached input $0.50, output $8 per 1M tokens.
    (tmp_path / "aiq.yaml").write_text("prices:\n  m: {input: 2, output: 8, cached_input: 0.5}\n")
    prompts = [(f"p{i}", f"question {i}: " + "tell me more. " * (i + 3)) for i in range(6)]
    write_prompts(tmp_path / "p.jsonl", prompts)
    cached, reasoning = 4, 25  # every reply: 4 prompt tokens from the cache, 25 reasoning
    with FakeServer(require_key=API_KEY, cached_tokens=cached, reasoning_tokens=reasoning) as s:
        proc = run_aiq("run", "p.jsonl", "--base-url", s.base_url, "--model", "m", "--json",
                       "--metrics-file", "aiq.prom", cwd=tmp_path)  # fmt: skip

    assert proc.returncode == 0, proc.stderr
    # Per reply: prompt_tokens = _tokens(prompt), 4 of them cached; completion_tokens =
    # _tokens(reply text) + 25 reasoning. Cost = ((prompt - 4) x 2 + 4 x 0.5 + completion x 8)
    # / 1e6.
    tokens_in = sum(_tokens(p) for _, p in prompts)
    tokens_out = sum(_tokens(FakeServer.reply_text(p)) + reasoning for _, p in prompts)
    cost = (
        sum(
            (_tokens(p) - cached) * 2 + cached * 0.5 + (_tokens(FakeServer.reply_text(p)) + 25) * 8
            for _, p in prompts
        )
        / 1e6
    )
    n = len(prompts)
    summary = json.loads(proc.stdout)
    assert (summary["tokens_in"], summary["tokens_out"]) == (tokens_in, tokens_out)
    assert (summary["tokens_cached"], summary["tokens_reasoning"]) == (cached * n, reasoning * n)
    assert (summary["tokens_cache_write"], summary["tokens_cache_read"]) == (0, 0)
    assert math.isclose(summary["cost_usd"], cost, rel_tol=1e-9)
    # Not the plain price of the same tokens: the cached ones cost a quarter.
    assert not math.isclose(cost, (tokens_in * 2 + tokens_out * 8) / 1e6, rel_tol=1e-6)

    status = _status(tmp_path)
    assert (status["tokens_cached"], status["tokens_reasoning"]) == (cached * n, reasoning * n)
    assert math.isclose(status["cost_usd"], cost, rel_tol=1e-9)
    (model,) = status["models"]
    assert (model["tokens_cached"], model["tokens_reasoning"]) == (cached * n, reasoning * n)
    assert status["unusable_usage"] == 0
    text = run_aiq("status", cwd=tmp_path).stdout
    assert f"tokens {tokens_in:,} in ({cached * n:,} cached) / {tokens_out:,} out " \
           f"({reasoning * n:,} reasoning)" in text  # fmt: skip
    assert _metric(tmp_path, 'aiq_tokens_part_total{direction="in",kind="cached"}') == cached * n
    assert (
        _metric(tmp_path, 'aiq_tokens_part_total{direction="out",kind="reasoning"}')
        == reasoning * n
    )
    assert math.isclose(_metric(tmp_path, "aiq_cost_usd_total"), cost, rel_tol=1e-6)


def test_cached_input_without_a_price_is_the_tables_or_half_the_input_price(
    tmp_path: Path,
) -> None:
    # gpt-4.1 is in aiq's table: input $2, cached $0.50, output $8. "house" is not, and its
    # config gives no cached_input: half its input price, $0.50 of $1.
    (tmp_path / "aiq.yaml").write_text("prices:\n  house: {input: 1, output: 3}\n")
    lines = [{"custom_id": f"{m}-{i}", "prompt": f"{m} prompt number {i}", "model": m}
             for m in ("gpt-4.1", "house") for i in range(3)]  # fmt: skip
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with FakeServer(require_key=API_KEY, cached_tokens=2) as s:
        proc = run_aiq("run", "p.jsonl", "--base-url", s.base_url, "--json", cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    rates = {"gpt-4.1": (2.0, 0.5, 8.0), "house": (1.0, 0.5, 3.0)}  # input, cached, output
    want = {m: 0.0 for m in rates}
    for x in lines:
        i, c, o = rates[x["model"]]
        prompt, reply = x["prompt"], FakeServer.reply_text(x["prompt"])
        want[x["model"]] += ((_tokens(prompt) - 2) * i + 2 * c + _tokens(reply) * o) / 1e6
    got = {m["model"]: m["cost_usd"] for m in _status(tmp_path)["models"]}
    assert got.keys() == want.keys()
    for m in want:
        assert math.isclose(got[m], want[m], rel_tol=1e-9), m


def _anthropic_lines(n: int) -> str:
    shared = "You answer questions about one long document. " * 20
    system = [{"type": "text", "text": shared, "cache_control": {"type": "ephemeral"}}]
    return "".join(
        json.dumps({"custom_id": f"c{i}", "params": {
            "system": system, "messages": [{"role": "user", "content": f"question {i}?"}]}})
        + "\n"
        for i in range(n)
    )  # fmt: skip


def test_anthropic_cache_writes_and_reads_show_and_take_the_configured_rates(
    tmp_path: Path,
) -> None:
    # Input $3, output $15, cache writes $4 and reads $0.25 (not the 1.25x / 0.1x defaults).
    (tmp_path / "aiq.yaml").write_text(
        "prices:\n  claude-x: {input: 3, output: 15, cache_write: 4, cache_read: 0.25}\n"
    )
    (tmp_path / "c.jsonl").write_text(_anthropic_lines(4))
    env = aiq_env(ANTHROPIC_API_KEY=API_KEY)
    with FakeServer(require_key=API_KEY, reasoning_tokens=10) as s:
        proc = run_aiq("run", "c.jsonl", "--provider", "anthropic", "--base-url", s.base_url,
                       "--model", "claude-x", "--concurrency", "1", "--metrics-file",
                       "aiq.prom", cwd=tmp_path, env=env)  # fmt: skip

    assert proc.returncode == 0, proc.stderr
    usage = [r["response"]["body"]["usage"] for r in read_jsonl(tmp_path / "c.results.jsonl")]
    # One at a time: the first request writes the shared prefix, the other three read it.
    written = sum(u["cache_creation_input_tokens"] for u in usage)
    read = sum(u["cache_read_input_tokens"] for u in usage)
    prefix = _tokens("You answer questions about one long document. " * 20)
    assert (written, read) == (prefix, 3 * prefix)
    fresh = sum(u["input_tokens"] for u in usage)
    out = sum(u["output_tokens"] for u in usage)
    assert all(u["output_tokens_details"]["thinking_tokens"] == 10 for u in usage)
    cost = (fresh * 3 + written * 4 + read * 0.25 + out * 15) / 1e6
    status = _status(tmp_path)
    assert status["tokens_in"] == fresh + written + read  # every prompt token, cached or not
    assert (status["tokens_cache_write"], status["tokens_cache_read"]) == (written, read)
    assert (status["tokens_cached"], status["tokens_reasoning"]) == (0, 40)
    assert math.isclose(status["cost_usd"], cost, rel_tol=1e-9)
    kinds = f"({written:,} cache writes, {read:,} cache reads) / {out:,} out (40 reasoning)"
    assert kinds in proc.stdout  # the run's summary
    assert kinds in run_aiq("status", cwd=tmp_path).stdout
    assert _metric(tmp_path, 'aiq_tokens_part_total{direction="in",kind="cache_read"}') == read


def test_replies_with_unusable_usage_are_counted_never_subtracted_and_stored_as_sent(
    tmp_path: Path,
) -> None:
    (tmp_path / "aiq.yaml").write_text("prices:\n  m: {input: 2, output: 8}\n")
    bad: dict[str, dict[str, Any]] = {
        "NEG": {"prompt_tokens": -1_000_000_000, "completion_tokens": -5},
        "NEGOUT": {"completion_tokens": -7},
        "FLOAT": {"prompt_tokens": 12.5},
        "TEXT": {"completion_tokens": "many"},
        "NULL": {"prompt_tokens": None},
        "BOOL": {"completion_tokens": True},
        "PART": {"prompt_tokens_details": {"cached_tokens": 10**9}},  # more than the prompt
    }
    good = [(f"g{i}", f"a good question {i}") for i in range(4)]
    write_prompts(tmp_path / "p.jsonl", [*good, *((k.lower(), f"{k} one") for k in bad)])
    with FakeServer(require_key=API_KEY, usage_patches=bad) as s:
        proc = run_aiq("run", "p.jsonl", "--base-url", s.base_url, "--model", "m",
                       "--metrics-file", "aiq.prom", cwd=tmp_path)  # fmt: skip

    assert proc.returncode == 0, proc.stderr
    # Only the good replies count: (prompt x 2 + reply x 8) / 1e6 each.
    tokens_in = sum(_tokens(p) for _, p in good)
    tokens_out = sum(_tokens(FakeServer.reply_text(p)) for _, p in good)
    cost = (tokens_in * 2 + tokens_out * 8) / 1e6
    assert f"tokens {tokens_in:,} in / {tokens_out:,} out" in proc.stdout
    assert "7 replies with unusable usage" in proc.stdout
    status = _status(tmp_path)
    assert status["unpriced"] == len(bad)
    assert (status["tokens_in"], status["tokens_out"]) == (tokens_in, tokens_out)
    assert math.isclose(status["cost_usd"], cost, rel_tol=1e-9)
    assert status["unusable_usage"] == len(bad) and status["counts"]["done"] == 11
    assert _metric(tmp_path, "aiq_replies_unusable_usage_total") == len(bad)
    assert _metric(tmp_path, "aiq_cost_usd_total") > 0
    text = run_aiq("status", cwd=tmp_path).stdout
    assert "7 replies with unusable usage" in text
    assert f"tokens {tokens_in:,} in / {tokens_out:,} out" in text
    # The reply is kept exactly as the server sent it, bad figures and all.
    results = {r["custom_id"]: r for r in read_jsonl(tmp_path / "p.results.jsonl")}
    assert results["neg"]["response"]["body"]["usage"]["prompt_tokens"] == -1_000_000_000
    assert results["float"]["response"]["body"]["usage"]["prompt_tokens"] == 12.5


def test_unusable_usage_never_makes_room_under_max_cost(tmp_path: Path) -> None:
    # $1,000 per 1M tokens: a job costs about two cents. Replies claiming a billion negative
    # prompt tokens (-$1,000 each) would, if counted, let every job through a $0.10 cap.
    (tmp_path / "aiq.yaml").write_text("prices:\n  m: {input: 1000, output: 1000}\n")
    lines = [{"custom_id": f"q{i:02d}", "prompt": f"{'NEG ' if i < 3 else ''}question {i:02d}",
              "max_tokens": 20} for i in range(30)]  # fmt: skip
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    patches = {"NEG": {"prompt_tokens": -1_000_000_000}}
    with FakeServer(require_key=API_KEY, usage_patches=patches) as s:
        proc = run_aiq("run", "p.jsonl", "--base-url", s.base_url, "--model", "m", "--json",
                       "--concurrency", "1", "--max-cost", "0.1", cwd=tmp_path)  # fmt: skip
        sent = [r.prompt for r in s.requests if r.status == 200]

    assert proc.returncode == 5, proc.stderr  # stopped at the cap
    summary = json.loads(proc.stdout)
    assert summary["stopped"] == "budget" and summary["cost_usd"] >= 0
    good = [p for p in sent if not p.startswith("NEG")]
    spent = sum((_tokens(p) + _tokens(FakeServer.reply_text(p))) * 1000 / 1e6 for p in good)
    assert spent <= 0.1 and len(sent) < len(lines)
    # What the unusable replies were counted at (their estimate, prompt + max_tokens) and the
    # good replies' cost together stay under the cap.
    held = sum((_tokens(p) + 20) * 1000 / 1e6 for p in sent if p.startswith("NEG"))
    assert spent + held <= 0.1 + 1e-9


def test_a_store_from_before_token_kinds_opens_and_counts_them_from_then_on(
    tmp_path: Path,
) -> None:
    (tmp_path / "aiq.yaml").write_text("prices:\n  m: {input: 2, output: 8}\n")
    write_prompts(tmp_path / "p.jsonl", [("a", "hello"), ("b", "bye")])
    with FakeServer(require_key=API_KEY, cached_tokens=1) as s:
        args = ("--base-url", s.base_url, "--model", "m")
        assert run_aiq("run", "p.jsonl", *args, cwd=tmp_path).returncode == 0
        before = _status(tmp_path)
        db = tmp_path / ".aiq" / "aiq.db"
        with sqlite3.connect(db) as conn:  # back to the schema before 0007_token_kinds
            undo_tallies(conn)
            for column in ("cached", "cache_write", "cache_read", "reasoning"):
                conn.execute(f"ALTER TABLE jobs DROP COLUMN tokens_{column}")
            conn.execute("DELETE FROM migrations WHERE name = '0007_token_kinds'")
        conn.close()
        old = run_aiq("status", cwd=tmp_path)
        assert old.returncode != 0 and "run any writing aiq command" in old.stderr

        write_prompts(tmp_path / "p.jsonl", [("c", "one more")], mode="a")
        assert run_aiq("run", "p.jsonl", *args, cwd=tmp_path).returncode == 0  # upgrades it

    after = _status(tmp_path)
    # The old jobs' parts were never recorded: none counted, their tokens and cost as they were.
    assert after["tokens_cached"] == 1 and after["unusable_usage"] == 0
    assert after["tokens_in"] == before["tokens_in"] + _tokens("one more")
    new = ((_tokens("one more") - 1) * 2 + 1 * 2 * 0.5
           + _tokens(FakeServer.reply_text("one more")) * 8) / 1e6  # fmt: skip
    assert math.isclose(after["cost_usd"], before["cost_usd"] + new, rel_tol=1e-9)
