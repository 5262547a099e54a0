"""--via batch end to end: real `aiq` subprocesses against the fake's Files and Batches API
(tests/fakeserver/batches.py) on 127.0.0.1, real SQLite stores; kill -9 at each step of a
batch's life, then `aiq resume`, with the fake's log showing no line submitted twice."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from conftest import aiq_env, read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer
from openai.types.chat import ChatCompletion

pytestmark = pytest.mark.slow  # every test here runs aiq and a server in real time


def _prompts(n: int, *, marks: dict[int, str] | None = None) -> list[tuple[str, str]]:
    marks = marks or {}
    return [(f"c{i}", f"{marks.get(i, '')}batch question {i}".strip()) for i in range(n)]


def _args(server: FakeServer, *extra: str) -> list[str]:
    return ["--via", "batch", "--base-url", server.base_url, "--model", "m", *extra]


def _check_results(tmp_path: Path, server: FakeServer, prompts: list[tuple[str, str]]) -> None:
    """One result per custom_id, each the reply the server gave its prompt."""
    by_id = dict(prompts)
    results = read_jsonl(tmp_path / "in.results.jsonl")
    assert len(results) == len({r["custom_id"] for r in results})
    for r in results:
        body = ChatCompletion.model_validate(r["response"]["body"])
        assert body.choices[0].message.content == server.reply_text(by_id[r["custom_id"]])
        assert r["response"]["status_code"] == 200 and r["error"] is None


def test_a_batch_run_writes_one_result_per_custom_id_and_dead_letters(
    tmp_path: Path, server: FakeServer
) -> None:
    prompts = _prompts(30, marks={3: "FAIL_PERMANENT ", 17: "FAIL_PERMANENT "})
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = run_aiq("run", "in.jsonl", *_args(server), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # finished, two dead
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 28
    dead = read_jsonl(tmp_path / "in.dead.jsonl")
    assert sorted(d["custom_id"] for d in dead) == ["c17", "c3"]
    assert all(d["error"]["type"] == "invalid_request" for d in dead)
    assert server.batches.created() == 1 and not server.batches.submitted_twice()
    assert not [r for r in server.requests if r.path.endswith("/chat/completions")]  # no online
    assert "batch 1: created" in proc.stderr and "completed, 28/30 done, 2 failed" in proc.stderr
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    (batch,) = status["batches"]
    assert batch["state"] == "completed" and batch["step"] == "ingested"
    assert batch["requests"] == 30 and batch["provider_batch_id"].startswith("batch-")
    # The store keeps the way: a resume (or cron's next run) sends by batch again.
    write_prompts(tmp_path / "in.jsonl", [("new", "one more question")], mode="a")
    again = run_aiq("run", "in.jsonl", "--base-url", server.base_url, "--model", "m", cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    assert server.batches.created() == 2
    assert not [r for r in server.requests if r.path.endswith("/chat/completions")]


def test_an_expired_batch_keeps_its_finished_lines_and_requeues_the_rest(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.expire_after_lines = 5
    prompts = _prompts(12)
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = run_aiq("run", "in.jsonl", *_args(server), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 12
    # 12 -> 5 done, 7 again -> 5 done, 2 again -> done: the finished lines never went twice.
    assert server.batches.created() == 3
    twice = server.batches.submitted_twice()
    assert set(twice) == {p for _, p in prompts[5:]}
    status = run_aiq("status", cwd=tmp_path).stdout
    assert "re-queued from batches: 9 expired" in status
    results = read_jsonl(tmp_path / "in.results.jsonl")
    assert all(r["attempts"] == 1 for r in results) if "attempts" in results[0] else True


def test_a_line_the_provider_never_returns_is_sent_again_then_dead(
    tmp_path: Path, server: FakeServer
) -> None:
    prompts = _prompts(6, marks={2: "DROP_LINE "})
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = run_aiq("run", "in.jsonl", *_args(server, "--max-attempts", "2"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 5
    (dead,) = read_jsonl(tmp_path / "in.dead.jsonl")
    assert (
        dead["custom_id"] == "c2"
        and "no result for this request in 2 batches" in (dead["error"]["message"])
    )
    assert server.batches.submitted_twice() == {prompts[2][1]: 2}


def test_a_refused_creation_waits_and_retries_losing_nothing(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.create_429 = 2
    prompts = _prompts(8)
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = run_aiq("run", "in.jsonl", *_args(server), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 8
    assert server.batches.created() == 1
    assert proc.stderr.count("trying again") == 2
    uploads = [c for c in server.batches.calls if c[:2] == ("POST", "/v1/files")]
    assert len(uploads) == 1  # the file was not sent again


def test_a_validation_failure_dead_letters_its_lines_and_resubmits_the_rest(
    tmp_path: Path, server: FakeServer
) -> None:
    prompts = _prompts(7, marks={4: "INVALID_LINE "})
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = run_aiq("run", "in.jsonl", *_args(server), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (dead,) = read_jsonl(tmp_path / "in.dead.jsonl")
    assert dead["custom_id"] == "c4"
    assert "line 5: invalid_request" in dead["error"]["message"]  # its line in the input file
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 6
    assert server.batches.created() == 2
    assert "re-queued from batches: 6 failed" in run_aiq("status", cwd=tmp_path).stdout


def test_a_batch_failed_on_the_enqueued_token_limit_is_sent_again_at_no_attempt(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.token_limit_batches = 1
    prompts = _prompts(4)
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = run_aiq("run", "in.jsonl", *_args(server, "--max-attempts", "1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # not dead, though one attempt is all they have
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 4
    assert server.batches.created() == 2
    assert "enqueued-token limit is reached: next batch in 1 s" in proc.stderr
    assert "re-queued from batches: 4 token_limit" in run_aiq("status", cwd=tmp_path).stdout


def test_a_refused_key_stops_the_run_keeping_every_job(tmp_path: Path, server: FakeServer) -> None:
    prompts = _prompts(3)
    write_prompts(tmp_path / "in.jsonl", prompts)
    wrong = aiq_env(OPENAI_API_KEY="sk-wrong-0123456789abcdef")
    proc = run_aiq("run", "in.jsonl", *_args(server), cwd=tmp_path, env=wrong)
    assert proc.returncode == 4, proc.stderr
    assert "refused batch 1" in proc.stderr and "sk-wrong" not in proc.stderr + proc.stdout
    assert server.batches.created() == 0
    resumed = run_aiq("resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 3


def _wait_for(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the step was never reached"
        time.sleep(0.02)


@pytest.mark.parametrize(
    "step",
    ["upload", "upload-answer", "create", "create-answer", "get", "content", "error-content"],
)
def test_kill_9_at_each_step_then_resume_submits_nothing_twice(
    tmp_path: Path, server: FakeServer, step: str
) -> None:
    prompts = _prompts(10, marks={6: "FAIL_PERMANENT "})
    write_prompts(tmp_path / "in.jsonl", prompts)
    server.batches.hold = {step}
    proc = start_aiq("run", "in.jsonl", *_args(server), cwd=tmp_path)
    try:
        _wait_for(lambda: server.batches.held[step] >= 1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    server.batches.hold = set()
    if step == "error-content":  # killed mid-ingest: the output file's lines are in
        status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
        assert status["counts"]["done"] == 9 and status["in_batches"] == 1
    resumed = run_aiq("resume", cwd=tmp_path)
    assert resumed.returncode == 1, resumed.stderr  # finished, one dead
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 9
    assert [d["custom_id"] for d in read_jsonl(tmp_path / "in.dead.jsonl")] == ["c6"]
    assert server.batches.created() == 1, server.batches.calls
    assert not server.batches.submitted_twice()
    if step != "upload":
        stored = [f for f in server.batches.files.values() if f["purpose"] == "batch"]
        assert len(stored) == 1  # the upload whose answer was lost was found, not repeated


def test_detach_submits_and_exits_then_resume_collects(tmp_path: Path, server: FakeServer) -> None:
    server.batches.processing_s = 1.0
    prompts = _prompts(9)
    write_prompts(tmp_path / "in.jsonl", prompts)
    first = run_aiq("run", "in.jsonl", *_args(server, "--detach"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "submitted 1 (9 requests)" in first.stdout and "1 still open" in first.stdout
    assert read_jsonl(tmp_path / "in.results.jsonl") == []
    status = run_aiq("status", cwd=tmp_path).stdout
    assert "batches: 1 open" in status
    # cron's next run, before the batch is done: collects nothing, submits nothing new
    again = run_aiq("run", "in.jsonl", *_args(server, "--detach"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert server.batches.created() == 1
    last = run_aiq("resume", cwd=tmp_path)  # waits for it
    assert last.returncode == 0, last.stderr
    assert "collected 1" in last.stdout
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 9


def test_a_cancelled_batch_keeps_its_finished_lines_and_sends_the_rest_again(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.processing_s = 30.0
    server.batches.cancel_after_lines = 3
    prompts = _prompts(8)
    write_prompts(tmp_path / "in.jsonl", prompts)
    assert run_aiq("run", "in.jsonl", *_args(server, "--detach"), cwd=tmp_path).returncode == 0
    server.batches.cancel_all()  # as a user would, in the dashboard
    server.batches.processing_s = 0.0
    proc = run_aiq("resume", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 8
    assert set(server.batches.submitted_twice()) == {p for _, p in prompts[3:]}
    assert "5 cancelled" in proc.stdout


def test_ctrl_c_while_waiting_leaves_the_batch_open_for_resume(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.processing_s = 60.0
    prompts = _prompts(5)
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = start_aiq("run", "in.jsonl", *_args(server), cwd=tmp_path, capture=True)
    _wait_for(lambda: any(c[0] == "GET" and "/batches/" in c[1] for c in server.batches.calls))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "interrupted" in out and "1 still open" in out
    assert "batches: 1 open" in run_aiq("status", cwd=tmp_path).stdout
    server.batches.processing_s = 0.0
    resumed = run_aiq("resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 5
    assert server.batches.created() == 1 and not server.batches.submitted_twice()


def test_an_online_run_leaves_open_batches_to_batch_and_detach_needs_batch(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.processing_s = 60.0
    write_prompts(tmp_path / "in.jsonl", _prompts(3))
    assert run_aiq("run", "in.jsonl", *_args(server, "--detach"), cwd=tmp_path).returncode == 0
    online = run_aiq("resume", "--via", "online", cwd=tmp_path)
    assert online.returncode == 0, online.stderr
    assert "3 jobs are in open provider batches" in online.stderr
    assert not [r for r in server.requests if r.path.endswith("/chat/completions")]
    detached = run_aiq("resume", "--detach", cwd=tmp_path)  # the store now says online
    assert detached.returncode == 2 and "--detach works with --via batch" in detached.stderr
    server.batches.processing_s = 0.0
    assert run_aiq("resume", "--via", "batch", cwd=tmp_path).returncode == 0
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 3


def test_max_runtime_stops_the_wait_and_max_cost_is_refused(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.processing_s = 60.0
    write_prompts(tmp_path / "in.jsonl", _prompts(2))
    capped = run_aiq("run", "in.jsonl", *_args(server, "--max-cost", "5"), cwd=tmp_path)
    assert capped.returncode == 2 and "--max-cost is not built for --via batch" in capped.stderr
    proc = run_aiq("run", "in.jsonl", *_args(server, "--max-runtime", "0.5"), cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert "batches: 1 open" in run_aiq("status", cwd=tmp_path).stdout
    assert server.batches.created() == 1
