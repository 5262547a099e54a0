"""`aiq run FILE --dry-run`: the forecast equals a hand count, and nothing is sent or written."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from conftest import run_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

# Round prices, so the expected cost is plain arithmetic: $1 and $2 per million tokens.
CONFIG = "prices:\n  m: {input: 1.0, output: 2.0, batch_share: 0.4}\n"


def _line(custom_id: str, prompt: str, **extra: object) -> str:
    return json.dumps({"custom_id": custom_id, "prompt": prompt, **extra}) + "\n"


def test_forecast_counts_tokens_and_cost_per_model_and_the_eta(tmp_path: Path) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    (tmp_path / "p.jsonl").write_text(
        # A prompt's tokens: a token per 4 characters, plus the chat template's 3 for its one
        # message and 3 for the request (tokens.PER_MESSAGE, PER_REQUEST).
        _line("a", "x" * 40, max_tokens=100)  # 10 + 6 prompt tokens + 100 output
        + _line("b", "y" * 41, max_tokens=100)  # 11 (ceil) + 6 + 100
        + _line("dup", "x" * 40, max_tokens=100)  # the same request as "a": sent once
        + _line("c", "z" * 8, model="gpt-4o-mini", max_tokens=10, n=2)  # 2 + 6 + 20, default price
        + _line("d", "w" * 4, model="no-such-model", max_tokens=5)  # 1 + 6 + 5, no price
        + "{not json\n"
    )

    proc = run_aiq(
        "run", "p.jsonl", "--dry-run", "--json", "--model", "m", "--rpm", "60", "--tpm", "300",
        cwd=tmp_path,
    )  # fmt: skip

    assert proc.returncode == 6, proc.stderr  # as the run would: a line would be skipped
    assert "p.jsonl:6:" in proc.stderr  # the invalid line, reported as `add` reports it
    f = json.loads(proc.stdout)
    assert (f["valid"], f["invalid"], f["duplicates"], f["requests"]) == (5, 1, 1, 4)
    models = {m["model"]: m for m in f["models"]}
    assert models["m"]["requests"] == 2
    assert (models["m"]["prompt_tokens"], models["m"]["output_tokens"]) == (33, 200)
    assert math.isclose(models["m"]["cost_usd"], (33 * 1.0 + 200 * 2.0) / 1e6)
    mini = models["gpt-4o-mini"]
    assert (mini["prompt_tokens"], mini["output_tokens"]) == (8, 20)
    assert math.isclose(mini["cost_usd"], (8 * 0.15 + 20 * 0.60) / 1e6)  # pricing defaults
    assert models["no-such-model"]["cost_usd"] is None  # unknown, not 0
    assert f["unpriced_models"] == ["no-such-model"]
    assert math.isclose(f["cost_usd"], models["m"]["cost_usd"] + mini["cost_usd"])
    # Each way of sending: flex at half; batch at m's own share (0.4), half for gpt-4o-mini.
    by_via = f["cost_usd_by_via"]
    assert by_via["online"] == f["cost_usd"]
    assert math.isclose(by_via["flex"], f["cost_usd"] / 2)
    assert math.isclose(by_via["batch"], models["m"]["cost_usd"] * 0.4 + mini["cost_usd"] / 2)
    assert f["tokens"] == 233 + 28 + 12
    # Limits hold per model: model m's 233 tokens at 300/min take 46.6 s (its 2 requests at
    # 60/min, 2 s); the other models, side by side, take less. Tokens set the ETA.
    assert (f["eta_s"], f["bottleneck"]) == (46.6, "tpm")
    # No store: nothing learned, so the prompts are the rule of thumb, and no margin figure.
    assert models["m"]["prompt_basis"] is None and f["cost_usd_high"] is None
    assert not (tmp_path / ".aiq").exists()  # no store created


def test_text_report_names_each_model_and_says_when_no_limit_is_set(tmp_path: Path) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    write_prompts(tmp_path / "p.jsonl", [("a", "hello"), ("b", "hello again")])

    proc = run_aiq("run", "p.jsonl", "--dry-run", "--model", "m", cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert "2 requests to send" in proc.stdout
    assert "  m " in proc.stdout
    assert "no limit configured" in proc.stdout
    assert "may be outdated" in proc.stdout
    assert "by way of sending: online $" in proc.stdout and "--via batch $" in proc.stdout
    assert "2 requests set no max_tokens" in proc.stdout


def test_dry_run_sends_nothing_and_leaves_the_store_as_it_was(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    first = [(f"a{i}", f"question {i}") for i in range(3)]
    write_prompts(tmp_path / "p.jsonl", first)
    args = ("--base-url", server.base_url, "--model", "m")
    assert run_aiq("run", "p.jsonl", *args, cwd=tmp_path).returncode == 0
    sent = len(server.requests)
    write_prompts(tmp_path / "p.jsonl", [(f"b{i}", f"more {i}") for i in range(4)], mode="a")
    db = tmp_path / ".aiq" / "aiq.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    status_before = run_aiq("status", "--json", cwd=tmp_path).stdout

    proc = run_aiq("run", "p.jsonl", "--dry-run", "--json", *args, cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)
    assert (f["done_before"], f["requests"]) == (3, 4)  # the done ones would not be sent
    assert len(server.requests) == sent  # nothing went out
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout) == json.loads(status_before)


def test_dead_jobs_are_not_counted_as_to_send_until_replayed(
    tmp_path: Path, server: FakeServer
) -> None:
    write_prompts(tmp_path / "p.jsonl", [("ok", "fine"), ("bad", "FAIL_PERMANENT no")])
    args = ("--base-url", server.base_url, "--model", "m")
    assert run_aiq("run", "p.jsonl", *args, cwd=tmp_path).returncode == 1  # "bad" is dead
    write_prompts(tmp_path / "p.jsonl", [("new", "another")], mode="a")

    text = run_aiq("run", "p.jsonl", "--dry-run", *args, cwd=tmp_path)
    f = json.loads(run_aiq("run", "p.jsonl", "--dry-run", "--json", *args, cwd=tmp_path).stdout)

    assert text.returncode == 0, text.stderr
    assert "1 done before, 1 dead (sent again only after `aiq replay-dead`)" in text.stdout
    assert "→ 1 request to send" in text.stdout
    assert (f["done_before"], f["dead_before"], f["requests"]) == (1, 1, 1)
    sent = len(server.requests)
    ran = run_aiq("run", "p.jsonl", *args, cwd=tmp_path)  # and so a run does
    assert ran.returncode == 1, ran.stderr
    assert len(server.requests) == sent + 1

    assert run_aiq("replay-dead", cwd=tmp_path).returncode == 0
    f = json.loads(run_aiq("run", "p.jsonl", "--dry-run", "--json", *args, cwd=tmp_path).stdout)
    assert (f["done_before"], f["dead_before"], f["requests"]) == (2, 0, 1)  # queued: sent


def test_a_file_without_a_valid_line_exits_2(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text("nope\n[1]\n")

    proc = run_aiq("run", "p.jsonl", "--dry-run", "--model", "m", cwd=tmp_path)

    assert proc.returncode == 2
    assert "no valid line" in proc.stderr


def test_strict_refuses_a_file_with_an_invalid_line_as_run_would(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text(_line("a", "fine") + "nope\n")

    lenient = run_aiq("run", "p.jsonl", "--dry-run", "--model", "m", cwd=tmp_path)
    strict = run_aiq("run", "p.jsonl", "--dry-run", "--strict", "--model", "m", cwd=tmp_path)

    assert lenient.returncode == 6, lenient.stderr
    assert strict.returncode == 2
    assert "--strict" in strict.stderr and "p.jsonl:2" in strict.stderr


def test_a_model_with_limits_of_its_own_sets_the_eta_when_it_is_the_slowest(
    tmp_path: Path,
) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG + "model_limits:\n  slow: {rpm: 6}\n")
    (tmp_path / "p.jsonl").write_text(
        "".join(_line(f"s{i}", f"slow {i}", model="slow") for i in range(3))
        + "".join(_line(f"f{i}", f"fast {i}") for i in range(30))
    )
    proc = run_aiq("run", "p.jsonl", "--dry-run", "--json", "--model", "m", "--rpm", "600",
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)
    # slow: 3 requests at 6/min = 30 s; m: 30 at 600/min = 3 s.
    assert (f["eta_s"], f["bottleneck"]) == (30.0, "rpm")
