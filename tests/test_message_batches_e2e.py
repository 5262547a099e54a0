"""--via batch --provider anthropic end to end: real `aiq` subprocesses against the fake's
Message Batches (tests/fakeserver/message_batches.py) on 127.0.0.1, real SQLite stores;
kill -9 around creation, then `aiq resume`, with the fake's log showing no request
submitted twice. The OpenAI side of each is in test_batch_e2e.py."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from anthropic.types import Message
from conftest import API_KEY, aiq_env, read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq and a server in real time

ENV = aiq_env(ANTHROPIC_API_KEY=API_KEY)


def _prompts(n: int, *, marks: dict[int, str] | None = None) -> list[tuple[str, str]]:
    marks = marks or {}
    # custom_ids Anthropic's pattern would refuse: aiq derives its own for the provider
    return [(f"c/{i} é", f"{marks.get(i, '')}batch question {i}".strip()) for i in range(n)]


def _run_args(server: FakeServer) -> list[str]:
    """``aiq run in.jsonl`` by Message Batches to ``server``."""
    return ["run", "in.jsonl", "--via", "batch", "--provider", "anthropic",
            "--base-url", server.base_url, "--model", "claude-x"]  # fmt: skip


def _run(tmp_path: Path, server: FakeServer, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_aiq(*_run_args(server), *extra, cwd=tmp_path, env=ENV)


def _check_results(tmp_path: Path, server: FakeServer, prompts: list[tuple[str, str]]) -> None:
    """One result per custom_id, each the Message the server gave its prompt."""
    by_id = dict(prompts)
    results = read_jsonl(tmp_path / "in.results.jsonl")
    assert len(results) == len({r["custom_id"] for r in results})
    for r in results:
        message = Message.model_validate(r["response"]["body"])
        assert message.content[0].text == server.reply_text(by_id[r["custom_id"]])  # type: ignore[union-attr]
        assert r["response"]["status_code"] == 200 and r["error"] is None


def test_a_batch_writes_one_result_per_custom_id_and_dead_letters(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "aiq.yaml").write_text("prices:\n  claude-x: {input: 1000, output: 1000}\n")
    prompts = _prompts(12, marks={3: "FAIL_PERMANENT ", 7: "BATCH_API_ERROR "})
    write_prompts(tmp_path / "in.jsonl", prompts)
    with (tmp_path / "in.jsonl").open("a") as f:  # no faithful Messages translation
        f.write(json.dumps({"custom_id": "n3", "prompt": "three of them", "n": 3}) + "\n")
    proc = _run(tmp_path, server, "--max-attempts", "2")
    assert proc.returncode == 1, proc.stderr
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 10
    dead = {d["custom_id"]: d["error"] for d in read_jsonl(tmp_path / "in.dead.jsonl")}
    assert set(dead) == {"c/3 é", "c/7 é", "n3"}
    assert dead["c/3 é"]["type"] == "invalid_request" and dead["c/3 é"]["status_code"] == 400
    assert dead["c/7 é"]["type"] == "server"  # api_error, retried once, as online
    assert "n=3" in dead["n3"]["message"]
    mb = server.message_batches
    assert mb.created() == 2 and mb.submitted_twice() == {prompts[7][1]: 2}
    assert not [r for r in server.requests if r.path == "/v1/messages"]  # nothing online
    assert "of its requests refused" in proc.stderr and "ended, 10/12 done, 2 failed" in proc.stderr
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path, env=ENV).stdout)
    # $1,000 per 1M tokens, at half the list price, from each reply's usage.
    usage = [r["response"]["body"]["usage"] for r in read_jsonl(tmp_path / "in.results.jsonl")]
    tokens = sum(u["input_tokens"] + u["output_tokens"] for u in usage)
    assert status["cost_usd"] == pytest.approx(tokens * 1000 / 1e6 / 2)
    first = status["batches"][0]
    assert first["provider"] == "anthropic" and first["provider_batch_id"].startswith("msgbatch_")
    assert first["state"] == "ended" and first["counts"]["succeeded"] == 10


@pytest.mark.parametrize("how", ["expired", "missing", "canceled"])
def test_unfinished_lines_come_back_at_no_attempt_and_finished_ones_are_kept(
    tmp_path: Path, server: FakeServer, how: str
) -> None:
    mb = server.message_batches
    prompts = _prompts(8, marks={2: "DROP_LINE "} if how == "missing" else None)
    write_prompts(tmp_path / "in.jsonl", prompts)
    if how == "expired":
        mb.expire_after_lines = 5
        proc = _run(tmp_path, server, "--max-attempts", "1")
    elif how == "missing":
        proc = _run(tmp_path, server, "--max-attempts", "2")
    else:
        mb.processing_s, mb.cancel_after_lines = 30.0, 3
        assert _run(tmp_path, server, "--detach").returncode == 0
        mb.cancel_all()  # as a user would, in the Console
        mb.processing_s = 0.0
        proc = run_aiq("resume", cwd=tmp_path, env=ENV)
    status = run_aiq("status", cwd=tmp_path, env=ENV).stdout
    if how == "missing":
        assert proc.returncode == 1, proc.stderr
        (dead,) = read_jsonl(tmp_path / "in.dead.jsonl")
        assert (
            dead["custom_id"] == "c/2 é"
            and "no result for this request in 2" in (dead["error"]["message"])
        )
        assert mb.submitted_twice() == {prompts[2][1]: 2}
        assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 7
        return
    assert proc.returncode == 0, proc.stderr  # not dead, though one attempt is all they have
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 8
    done_first = 5 if how == "expired" else 3
    assert set(mb.submitted_twice()) == {p for _, p in prompts[done_first:]}
    reason = "expired" if how == "expired" else "cancelled"
    assert f"re-queued from batches: {8 - done_first} {reason}" in status, status


def test_a_refused_creation_waits_and_retries_losing_nothing(
    tmp_path: Path, server: FakeServer
) -> None:
    server.message_batches.create_429 = 1  # Anthropic's retry-after is whole seconds
    prompts = _prompts(5)
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = _run(tmp_path, server)
    assert proc.returncode == 0, proc.stderr
    _check_results(tmp_path, server, prompts)
    assert server.message_batches.created() == 1 and "trying again in 1 s" in proc.stderr
    assert not server.message_batches.submitted_twice()


def _wait_for(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the step was never reached"
        time.sleep(0.02)


def _foreign_batch(server: FakeServer, n: int) -> None:
    """Another client's batch of ``n`` requests on the same workspace."""
    url = server.base_url.removesuffix("/v1") + "/v1/messages/batches"
    requests = [
        {"custom_id": f"theirs-{i}", "params": {"model": "m", "max_tokens": 5,
         "messages": [{"role": "user", "content": f"their question {i}"}]}}
        for i in range(n)
    ]  # fmt: skip
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    assert httpx.post(url, json={"requests": requests}, headers=headers).status_code == 200


@pytest.mark.parametrize("step", ["create", "create-answer", "get", "results", "foreign"])
def test_kill_9_around_creation_then_resume_submits_nothing_twice(
    tmp_path: Path, server: FakeServer, step: str
) -> None:
    mb = server.message_batches
    prompts = _prompts(6, marks={4: "FAIL_PERMANENT "})
    write_prompts(tmp_path / "in.jsonl", prompts)
    theirs = 0
    if step == "foreign":
        # Killed before its create went, and another client's batch of the same size in
        # the minute before: found for it, and found out by its lines, never ingested.
        _foreign_batch(server, 6)
        step, theirs = "create", 1
    mb.hold = {step}
    proc = start_aiq(*_run_args(server), cwd=tmp_path, env=ENV)
    try:
        _wait_for(lambda: mb.held[step] >= 1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    mb.hold = set()
    resumed = run_aiq("resume", cwd=tmp_path, env=ENV)
    assert resumed.returncode == 1, resumed.stderr  # finished, one dead
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 5
    assert [d["custom_id"] for d in read_jsonl(tmp_path / "in.dead.jsonl")] == ["c/4 é"]
    assert mb.created() == 1 + theirs, mb.calls
    assert not mb.submitted_twice()
    if theirs:
        status = run_aiq("status", cwd=tmp_path, env=ENV).stdout
        assert "re-queued from batches: 6 not_ours" in status, status


def test_detach_submits_and_exits_then_resume_collects(tmp_path: Path, server: FakeServer) -> None:
    server.message_batches.processing_s = 1.0
    prompts = _prompts(4)
    write_prompts(tmp_path / "in.jsonl", prompts)
    first = _run(tmp_path, server, "--detach")
    assert first.returncode == 0, first.stderr
    assert "submitted 1 (4 requests)" in first.stdout and "1 still open" in first.stdout
    status = run_aiq("status", cwd=tmp_path, env=ENV).stdout
    assert "batches: 1 open" in status and "(anthropic): in_progress, 0/4 done" in status
    last = run_aiq("resume", cwd=tmp_path, env=ENV)
    assert last.returncode == 0, last.stderr
    assert "collected 1" in last.stdout
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 4


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_cancel_collects_what_finished_and_queues_the_rest_at_no_attempt(
    tmp_path: Path, server: FakeServer, provider: str
) -> None:
    fake = server.message_batches if provider == "anthropic" else server.batches
    fake.processing_s, fake.cancel_after_lines = 30.0, 3
    prompts = _prompts(8, marks={1: "FAIL_PERMANENT "})
    write_prompts(tmp_path / "in.jsonl", prompts)
    args = ["--provider", provider, "--base-url", server.base_url, "--model", "claude-x"]
    run = ["run", "in.jsonl", "--via", "batch", "--detach", *args]
    assert run_aiq(*run, cwd=tmp_path, env=ENV).returncode == 0
    proc = run_aiq("cancel", cwd=tmp_path, env=ENV)
    assert proc.returncode == 1, proc.stderr  # the finished lines are in: one is dead
    cancelled = "canceling" if provider == "anthropic" else "cancelling"
    assert f": {cancelled}" in proc.stderr and "collected 1" in proc.stdout
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 2
    assert [d["custom_id"] for d in read_jsonl(tmp_path / "in.dead.jsonl")] == ["c/1 é"]
    status = run_aiq("status", cwd=tmp_path, env=ENV).stdout
    assert "queued 5 " in status and "re-queued from batches: 5 cancelled" in status
    assert fake.created() == 1  # cancel submits nothing (resending: the canceled test above)


def test_cancel_needs_a_store_and_with_no_open_batch_does_nothing(
    tmp_path: Path, server: FakeServer
) -> None:
    assert run_aiq("cancel", cwd=tmp_path, env=ENV).returncode == 2  # no store yet
    write_prompts(tmp_path / "in.jsonl", _prompts(2))
    assert _run(tmp_path, server).returncode == 0
    again = run_aiq("cancel", cwd=tmp_path, env=ENV)
    assert again.returncode == 0 and "nothing to cancel" in again.stderr, again.stderr
    assert server.message_batches.created() == 1


@pytest.mark.parametrize("step", ["create", "create-answer"])
def test_cancel_after_a_kill_around_creation_finds_or_releases_the_batch(
    tmp_path: Path, server: FakeServer, step: str
) -> None:
    mb = server.message_batches
    prompts = _prompts(4)
    write_prompts(tmp_path / "in.jsonl", prompts)
    mb.hold = {step}
    proc = start_aiq(*_run_args(server), cwd=tmp_path, env=ENV)
    try:
        _wait_for(lambda: mb.held[step] >= 1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    mb.hold = set()
    cancelled = run_aiq("cancel", cwd=tmp_path, env=ENV)
    assert cancelled.returncode == 0, cancelled.stderr
    results = read_jsonl(tmp_path / "in.results.jsonl")
    if step == "create":  # never created: its jobs straight back to the queue
        assert results == [] and mb.created() == 0
        assert "4 cancelled" in cancelled.stderr
    else:  # created, its answer lost: found, and what it finished collected
        assert "found msgbatch_" in cancelled.stderr and len(results) == 4
        _check_results(tmp_path, server, prompts)
        assert mb.created() == 1
