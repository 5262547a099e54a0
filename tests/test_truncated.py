"""Replies cut off by max_tokens or stopped by a content filter (issue 13, item 4).

Real `aiq` subprocesses against the fake server, whose markers make a 200 that stopped short in
each API's own shape (tests/fakeserver, ``stopped_short``). Before this, each was a plain
success: nothing in the summary or `status` told a cut-off or empty answer from a whole one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import read_jsonl, run_aiq
from fakeserver import FakeServer
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

MAX_TOKENS = 40


def _batch(custom_id: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _chat(text: str) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": text}]}  # fmt: skip


LINES = [
    _batch("whole", "/v1/chat/completions", _chat("hello")),
    _batch("cut", "/v1/chat/completions", _chat("write a saga CUT_OFF")),
    _batch("thought", "/v1/chat/completions", _chat("prove it THINKS_TOO_LONG")),
    _batch("filtered", "/v1/chat/completions", _chat("something FILTER_ME")),
    _batch("comp-cut", "/v1/completions",
           {"model": "gpt-3.5-turbo-instruct", "prompt": "once CUT_OFF", "max_tokens": 5}),
    _batch("resp-cut", "/v1/responses",
           {"model": "gpt-4o-mini", "input": "tell CUT_OFF", "max_output_tokens": 16}),
]  # fmt: skip
CUT = {"cut", "thought", "comp-cut", "resp-cut"}


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _status(cwd: Path) -> tuple[dict[str, Any], str]:
    as_json = run_aiq("status", "--json", cwd=cwd)
    text = run_aiq("status", cwd=cwd)
    assert as_json.returncode == 0 and text.returncode == 0, as_json.stderr + text.stderr
    return json.loads(as_json.stdout), text.stdout


def test_stopped_short_replies_are_kept_as_sent_and_counted(tmp_path: Path) -> None:
    _write(tmp_path / "f.jsonl", LINES)
    with FakeServer() as server:
        done = run_aiq("run", "f.jsonl", "--base-url", server.base_url, cwd=tmp_path)

    assert done.returncode == 0, done.stderr  # kept by default: finished, nothing dead
    assert "4 replies cut off by max_tokens, kept as results" in done.stdout
    assert "--on-truncated dead" in done.stdout and "raise max_tokens" in done.stdout
    assert "1 reply stopped by a content filter" in done.stdout
    results = {
        r["custom_id"]: r["response"]["body"] for r in read_jsonl(tmp_path / "f.results.jsonl")
    }
    assert set(results) == {x["custom_id"] for x in LINES}
    # Stored exactly as sent: each still reads as its API's type, with its stop in it.
    assert ChatCompletion.model_validate(results["cut"]).choices[0].finish_reason == "length"
    thought = ChatCompletion.model_validate(results["thought"])
    assert thought.choices[0].message.content == ""
    assert thought.usage is not None and thought.usage.completion_tokens == MAX_TOKENS
    assert Completion.model_validate(results["comp-cut"]).choices[0].finish_reason == "length"
    assert Response.model_validate(results["resp-cut"]).status == "incomplete"
    filtered = ChatCompletion.model_validate(results["filtered"]).choices[0].finish_reason
    assert filtered == "content_filter"

    status, text = _status(tmp_path)
    assert (status["truncated"], status["truncated_dead"], status["content_filtered"]) == (4, 0, 1)
    assert "cut off: 4 replies cut off by max_tokens" in text
    assert "content filter: 1 reply stopped by a content filter" in text
    assert status["top_errors"] == []  # done jobs: not errors
    summary = json.loads(
        run_aiq(
            "run", "f.jsonl", "--base-url", "http://127.0.0.1:9/v1", "--json", cwd=tmp_path
        ).stdout
    )
    assert (summary["truncated"], summary["content_filtered"]) == (0, 0)  # this run sent none


def test_on_truncated_dead_dead_letters_them_with_the_reply_and_what_to_do(tmp_path: Path) -> None:
    _write(tmp_path / "f.jsonl", LINES)
    with FakeServer() as server:
        done = run_aiq(
            "run", "f.jsonl", "--base-url", server.base_url, "--on-truncated", "dead",
            "--json", cwd=tmp_path,
        )  # fmt: skip
        sent = len(server.requests)
    assert done.returncode == 1, done.stderr  # finished, some dead
    summary = json.loads(done.stdout)
    assert (summary["truncated"], summary["content_filtered"]) == (4, 1)
    assert summary["dead_now"] == 4 and sent == len(LINES)  # dead at once, never retried

    dead = {d["custom_id"]: d for d in read_jsonl(tmp_path / "f.dead.jsonl")}
    assert set(dead) == CUT
    for d in dead.values():
        assert d["attempts"] == 1
        assert d["error"]["type"] == "truncated" and d["error"]["status_code"] == 200
        message = d["error"]["message"]
        assert "cut off at max_tokens" in message and "raise max_tokens" in message
        assert "aiq replay-dead --error truncated" in message
        assert d["response"]["status_code"] == 200 and d["response"]["request_id"]
    # The reply as the server sent it, billed tokens and all.
    cut = ChatCompletion.model_validate(dead["cut"]["response"]["body"])
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == MAX_TOKENS
    assert f"{MAX_TOKENS} tokens out" in dead["cut"]["error"]["message"]
    assert "no answer after 40 reasoning tokens" in dead["thought"]["error"]["message"]
    results = {r["custom_id"] for r in read_jsonl(tmp_path / "f.results.jsonl")}
    assert results == {"whole", "filtered"}  # a content filter's stop is always kept

    status, text = _status(tmp_path)
    assert (status["truncated"], status["truncated_dead"]) == (4, 4)
    assert status["top_errors"] == [{"type": "truncated", "count": 4}]
    assert "4 replies cut off by max_tokens were dead-lettered" in text
    # They were billed: their tokens count, in total and per model.
    by_model = {m["model"]: m for m in status["models"]}
    assert by_model["gpt-4o-mini"]["tokens_out"] >= 2 * MAX_TOKENS + 16
    assert status["cost_usd"] == summary["cost_usd"]

    replayed = run_aiq("replay-dead", "--error", "truncated", cwd=tmp_path)
    assert replayed.returncode == 0 and "replayed 4 dead jobs" in replayed.stdout


def test_the_config_key_and_anthropic_stop_reasons(tmp_path: Path) -> None:
    (tmp_path / "aiq.yaml").write_text("on_truncated: dead\n")
    prompts = [("whole", "hello"), ("cut", "saga CUT_OFF"), ("thought", "THINKS_TOO_LONG"),
               ("refused", "FILTER_ME")]  # fmt: skip
    _write(
        tmp_path / "f.jsonl", [{"custom_id": c, "prompt": p, "max_tokens": 30} for c, p in prompts]
    )
    with FakeServer() as server:
        done = run_aiq(
            "run", "f.jsonl", "--provider", "anthropic", "--base-url", server.base_url,
            "--model", "claude-sonnet-4-5", cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    dead = {d["custom_id"]: d for d in read_jsonl(tmp_path / "f.dead.jsonl")}
    assert set(dead) == {"cut", "thought"}
    assert 'stop_reason "max_tokens"' in dead["cut"]["error"]["message"]
    assert dead["cut"]["response"]["body"]["stop_reason"] == "max_tokens"
    results = {r["custom_id"]: r for r in read_jsonl(tmp_path / "f.results.jsonl")}
    assert results["refused"]["response"]["body"]["stop_reason"] == "refusal"
    status, _ = _status(tmp_path)
    assert (status["truncated_dead"], status["content_filtered"]) == (2, 1)


def test_a_bad_on_truncated_value_is_a_usage_error(tmp_path: Path) -> None:
    _write(tmp_path / "f.jsonl", LINES[:1])
    done = run_aiq("run", "f.jsonl", "--on-truncated", "drop", cwd=tmp_path)
    assert done.returncode == 2
    assert "--on-truncated: 'drop' is unknown; use keep | dead" in done.stderr
