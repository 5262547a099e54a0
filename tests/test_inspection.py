"""`aiq errors` and `aiq show` against a store with known failures: real `aiq` subprocesses, a
real fake server on 127.0.0.1, a real SQLite file."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import API_KEY, run_aiq
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # a run in real time, then the commands


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run: 3 done, 2 dead of a 400 (one attempt each), 2 dead of a 500 retried
    until --max-attempts 3."""
    cwd = tmp_path_factory.mktemp("inspection")
    lines = [{"custom_id": f"ok{i}", "prompt": f"fine {i}"} for i in range(3)]
    lines += [{"custom_id": f"bad{i}", "prompt": f"FAIL_PERMANENT {i}"} for i in range(2)]
    lines += [{"custom_id": f"down{i}", "prompt": f"x {i}", "model": "broken"} for i in range(2)]
    (cwd / "b.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (cwd / "aiq.yaml").write_text("backoff_base_s: 0.01\nbackoff_cap_s: 0.02\n")
    with FakeServer(require_key=API_KEY, status_for_model={"broken": 500}) as server:
        args = ("--base-url", server.base_url, "--model", "m", "--max-attempts", "3")
        done = run_aiq("run", "b.jsonl", *args, "--concurrency", "1", cwd=cwd)
    assert done.returncode == 1, done.stderr  # finished, some dead
    return cwd


def test_errors_groups_dead_jobs_by_type_with_counts_messages_and_ids(store: Path) -> None:
    proc = run_aiq("errors", "--json", cwd=store)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["dead"] == 4
    by_type = {t["type"]: t for t in out["types"]}
    assert set(by_type) == {"invalid_request", "server"}
    assert by_type["server"]["count"] == 2 and "500" in by_type["server"]["last_message"]
    assert sorted(by_type["server"]["custom_ids"]) == ["down0", "down1"]
    assert sorted(by_type["invalid_request"]["custom_ids"]) == ["bad0", "bad1"]
    assert by_type["invalid_request"]["last_at"].endswith("+00:00")

    text = run_aiq("errors", "--type", "server", "--limit", "1", cwd=store)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "2 dead jobs, 1 error type:"
    assert lines[1].startswith("server: 2 jobs, the latest at ")
    assert "HTTP 500" in lines[2]
    assert lines[3] in ("  custom_ids: down0 and 1 more", "  custom_ids: down1 and 1 more")


def test_errors_refuses_a_type_no_dead_job_has_naming_those_they_have(store: Path) -> None:
    proc = run_aiq("errors", "--type", "serve", cwd=store)
    assert proc.returncode == 2
    assert "no dead job has the error type 'serve' (did you mean 'server'?)" in proc.stderr
    assert "invalid_request 2" in proc.stderr and "--type" in proc.stderr


def test_show_gives_every_recorded_error_and_the_request_as_sent(store: Path) -> None:
    proc = run_aiq("show", "down0", "--json", cwd=store)
    assert proc.returncode == 0, proc.stderr
    (shown,) = json.loads(proc.stdout)["lines"]
    assert (shown["state"], shown["attempts"], shown["priority"]) == ("dead", 3, 0)
    assert [(e["type"], e["status_code"], e["attempts"], e["then"]) for e in shown["errors"]] == [
        ("server", 500, 1, "retried"),
        ("server", 500, 2, "retried"),
        ("server", 500, 3, "dead"),
    ]
    assert shown["errors_complete"] is True
    assert shown["request"]["url"] == "/v1/chat/completions"
    assert shown["request"]["body"] == {
        "model": "broken",
        "messages": [{"role": "user", "content": "x 0"}],
    }
    assert shown["line"] == {"custom_id": "down0", "prompt": "x 0", "model": "broken"}
    assert shown["file"].endswith("b.jsonl") and shown["line_no"] == 6
    assert shown["first_attempt_at"] <= shown["finished_at"]
    assert API_KEY not in proc.stdout


def test_show_of_a_done_job_gives_its_reply_and_request_id(store: Path) -> None:
    proc = run_aiq("show", "ok1", cwd=store)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith("ok1 · ")
    assert "  state: done, 1 attempt, priority 0" in text
    assert "  errors: none" in text
    assert '  request: POST /v1/chat/completions {"messages":' in text
    assert "  reply: {" in text and FakeServer.reply_text("fine 1") in text
    assert "  request id: " in text and "status 200" in text


def test_show_says_when_only_the_last_error_is_known(store: Path, tmp_path: Path) -> None:
    # As a store from before 0009: no history, the job failed before it was kept.
    old = tmp_path / "old.db"
    with sqlite3.connect(store / ".aiq" / "aiq.db") as src, sqlite3.connect(old) as dst:
        src.backup(dst)
    with sqlite3.connect(old) as conn:
        conn.execute("DELETE FROM errors")
        conn.execute("UPDATE migrations SET applied_at = 4e9 WHERE name = '0009_priority'")
    proc = run_aiq("show", "bad0", "--db", old, cwd=store)
    assert proc.returncode == 0, proc.stderr
    assert "errors: 1 (only the last is known: the job failed before this store kept" in (
        proc.stdout
    )
    assert "invalid_request (HTTP 400), dead: HTTP 400" in proc.stdout


def test_show_refuses_an_unknown_custom_id(store: Path) -> None:
    proc = run_aiq("show", "nope", cwd=store)
    assert proc.returncode == 2
    assert "custom_id 'nope': not in any input file of this store" in proc.stderr
