"""--via auto and --deadline end to end: real `aiq` subprocesses against the fake's Files and
Batches API on 127.0.0.1. Batch without a deadline or while it can still be met; the switch
to online (cancel, finished lines kept, the rest online, nothing sent twice) when it cannot,
and a later run before that deadline going on online."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer
from test_batch_e2e import _check_results, _prompts, _wait_for

pytestmark = pytest.mark.slow  # every test here runs aiq and a server in real time


def _args(server: FakeServer, *extra: str) -> list[str]:
    return ["--via", "auto", "--base-url", server.base_url, "--model", "m", *extra]


def _online(server: FakeServer) -> list[str]:
    """The prompts sent online, one call each."""
    return [r.prompt for r in server.requests if r.path.endswith("/chat/completions")]


def test_auto_without_a_deadline_is_batch_and_a_deadline_needs_auto(
    tmp_path: Path, server: FakeServer
) -> None:
    prompts = _prompts(6)
    write_prompts(tmp_path / "in.jsonl", prompts)
    wrong = run_aiq("run", "in.jsonl", "--via", "batch", "--deadline", "6h", cwd=tmp_path)
    assert wrong.returncode == 2 and "--deadline 6h works with --via auto only" in wrong.stderr
    past = run_aiq("run", "in.jsonl", *_args(server, "--deadline", "2020-01-01"), cwd=tmp_path)
    assert past.returncode == 2 and "--deadline: '2020-01-01' is in the past" in past.stderr
    proc = run_aiq("run", "in.jsonl", *_args(server), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("via auto: no --deadline, so by batch") == 1
    _check_results(tmp_path, server, prompts)
    assert server.batches.created() == 1 and not _online(server)


def test_a_deadline_the_batch_meets_is_not_switched_for(tmp_path: Path, server: FakeServer) -> None:
    server.batches.processing_s = 0.5
    prompts = _prompts(20)
    write_prompts(tmp_path / "in.jsonl", prompts)
    proc = run_aiq(
        "run", "in.jsonl", *_args(server, "--deadline", "1m", "--rpm", "600"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "20 left would take 2s online at 600/min: batch first" in proc.stderr
    assert "finishing online" not in proc.stderr
    _check_results(tmp_path, server, prompts)
    assert server.batches.created() == 1 and not _online(server)
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    assert status["batches"][0]["state"] == "completed"


def test_a_deadline_the_batch_cannot_meet_switches_to_online_once(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.processing_s = 60.0  # held: the batch would finish long after
    server.batches.cancel_after_lines = 5  # what it finished by the cancel
    prompts = _prompts(20)
    write_prompts(tmp_path / "in.jsonl", prompts)
    # 20 at 300/min take 4 s online, 5 s with the margin, 5.8 s with the allowance: inside
    # 8 s at the start, so batch first; about 2 s later, online.
    args = _args(server, "--deadline", "8s", "--rpm", "300")
    proc = run_aiq("run", "in.jsonl", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    (switch,) = [line for line in lines if line.endswith("finishing online")]
    assert "20 left would take 4s online at 300/min: cancelling 1 open batch" in switch
    assert "cancelled, 5/20 done" in proc.stderr and "re-queued 15 cancelled" in proc.stdout
    # the summary is of the whole run: the batch's five and the online fifteen, by tier
    assert "finished 20 and dead-lettered 0" in proc.stdout
    assert "  by tier: online ? (15 done), batch ? (5 done)" in proc.stdout  # (m: no price)
    _check_results(tmp_path, server, prompts)
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 20
    # the five the batch finished are kept, never sent again; the rest online, once each
    assert sorted(_online(server)) == sorted(p for _, p in prompts[5:])
    assert server.batches.created() == 1 and not server.batches.submitted_twice()


def test_killed_while_cancelling_for_the_deadline_resume_goes_on_online(
    tmp_path: Path, server: FakeServer
) -> None:
    server.batches.processing_s = 60.0
    server.batches.cancel_after_lines = 5
    server.batches.hold.add("cancel")  # the switch is recorded, the batch is still open
    prompts = _prompts(20)
    write_prompts(tmp_path / "in.jsonl", prompts)
    args = _args(server, "--deadline", "8s", "--rpm", "300")
    proc = start_aiq("run", "in.jsonl", *args, cwd=tmp_path)
    _wait_for(lambda: server.batches.held["cancel"] >= 1)
    proc.kill()
    proc.wait(timeout=10)
    server.batches.hold.clear()
    # cron's next run before that deadline, with a line more and no flags: it cancels the
    # batch the killed run left open and goes on online, not to batch again
    write_prompts(tmp_path / "in.jsonl", [("new", "one more question")], mode="a")
    again = run_aiq("run", "in.jsonl", "--base-url", server.base_url, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "online, as this store switched for it" in again.stderr
    assert "cancelled, 5/20 done" in again.stderr
    _check_results(tmp_path, server, [*prompts, ("new", "one more question")])
    assert len(read_jsonl(tmp_path / "in.results.jsonl")) == 21
    assert sorted(_online(server)) == sorted([*(p for _, p in prompts[5:]), "one more question"])
    assert server.batches.created() == 1 and not server.batches.submitted_twice()
