"""`aiq replay-dead`: what it replays, and what it refuses, against a store with known dead jobs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import run_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def _counts(cwd: Path) -> dict[str, int]:
    return json.loads(run_aiq("status", "--json", cwd=cwd).stdout)["counts"]


@pytest.fixture
def store_with_dead(tmp_path: Path, server: FakeServer) -> Path:
    """A store of five jobs: p0, p1 done; p2, p3 dead of a 400 (invalid_request); p4 dead of a
    500 after its last attempt (server: set in the store, the fake server has no per-line 500)."""
    prompts = [(f"p{i}", f"{'FAIL_PERMANENT ' if i >= 2 else ''}question {i}") for i in range(5)]
    write_prompts(tmp_path / "b.jsonl", prompts)
    ran = run_aiq("run", "b.jsonl", "--base-url", server.base_url, "--model", "m", cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr
    with sqlite3.connect(tmp_path / ".aiq" / "aiq.db") as db:
        db.execute(
            "UPDATE jobs SET error_type = 'server', status_code = 500 WHERE k64 = "
            "(SELECT job_k64 FROM items WHERE custom_id = 'p4')"
        )
    return tmp_path


def test_an_error_type_no_dead_job_has_is_refused_with_the_types_they_have(
    store_with_dead: Path,
) -> None:
    cwd = store_with_dead
    for wrong in ("nonsense_type", "invalid"):  # "invalid": a prefix is not the type
        proc = run_aiq("replay-dead", "--error", wrong, cwd=cwd)
        assert proc.returncode == 2, proc.stdout
        assert f"no dead job has the error type '{wrong}'" in proc.stderr
        assert "invalid_request 2, server 1" in proc.stderr
        assert "nothing was replayed" in proc.stderr and "resume" not in proc.stdout
    assert "did you mean 'invalid_request'?" in proc.stderr
    assert _counts(cwd)["dead"] == 3

    proc = run_aiq("replay-dead", "--error", "server", cwd=cwd)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "replayed 1 dead job; run `aiq resume` to send them\n"
    assert _counts(cwd) == {"queued": 1, "running": 0, "done": 2, "dead": 2}


def test_unknown_ids_are_named_and_ids_not_dead_are_said_to_be(store_with_dead: Path) -> None:
    cwd = store_with_dead
    proc = run_aiq("replay-dead", "--id", "nosuch", "--id", "p2", "--id", "p9", cwd=cwd)
    assert proc.returncode == 2, proc.stdout
    assert "2 unknown custom_ids 'nosuch', 'p9'" in proc.stderr
    assert "nothing was replayed" in proc.stderr
    assert _counts(cwd)["dead"] == 3

    done_only = run_aiq("replay-dead", "--id", "p0", cwd=cwd)
    assert done_only.returncode == 0, done_only.stderr
    assert "nothing to replay" in done_only.stdout and "p0 (done)" in done_only.stdout
    assert "resume" not in done_only.stdout

    # p4 is dead, but of another error than the one asked for: left as it is, and said so.
    proc = run_aiq("replay-dead", "--id", "p0", "--id", "p2", "--id", "p4",
                   "--error", "invalid_request", cwd=cwd)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "replayed 1 dead job; run `aiq resume` to send them",
        "not replayed: p0 (done), p4 (dead with error server)",
    ]
    assert _counts(cwd) == {"queued": 1, "running": 0, "done": 2, "dead": 2}


def test_a_store_without_dead_jobs_has_nothing_to_replay(
    tmp_path: Path, server: FakeServer
) -> None:
    write_prompts(tmp_path / "b.jsonl", [("a", "fine")])
    ran = run_aiq("run", "b.jsonl", "--base-url", server.base_url, "--model", "m", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr

    for args in ((), ("--error", "server")):  # a nightly `replay-dead --error server` is fine
        proc = run_aiq("replay-dead", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "nothing to replay: the store has no dead jobs\n"
