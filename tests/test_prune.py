"""`aiq prune`: exported jobs out of the store, the file shrunk, the outputs' lines kept, and a
re-run sending nothing (or, with --forget, everything pruned again). Real `aiq` subprocesses
against the fake server, real SQLite files."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer

from aiq.durations import parse_age

pytestmark = pytest.mark.slow  # every test here runs aiq and a server in real time

_N = 30
_LONG = "lorem ipsum dolor sit amet " * 40  # ~1 KB a prompt: requests worth pruning


def _run(cwd: Path, server: FakeServer, name: str = "b.jsonl", code: int = 0) -> None:
    proc = run_aiq("run", name, "--base-url", server.base_url, "--model", "m", cwd=cwd)
    assert proc.returncode == code, proc.stderr


def _status(cwd: Path) -> dict:
    proc = run_aiq("status", "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _by_id(path: Path) -> dict[str, dict]:
    return {r["custom_id"]: r for r in read_jsonl(path)}


@pytest.fixture
def ran(tmp_path: Path, server: FakeServer) -> Path:
    """A store whose run did _N prompts and exported them."""
    write_prompts(tmp_path / "b.jsonl", [(f"p{i}", f"{i} {_LONG}") for i in range(_N)])
    _run(tmp_path, server)
    return tmp_path


def test_prune_shrinks_the_store_keeps_the_results_and_a_rerun_sends_nothing(
    ran: Path, server: FakeServer
) -> None:
    db = ran / ".aiq" / "aiq.db"
    results = ran / "b.results.jsonl"
    written = _by_id(results)
    before = _status(ran)
    sent = len(server.requests)
    assert sent == _N and before["size_bytes"] > 0

    proc = run_aiq("prune", "--done-older-than", "0s", cwd=ran)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"pruned {_N} done jobs: "), proc.stdout
    assert "(VACUUM)" in proc.stdout
    after = _status(ran)
    assert after["size_bytes"] < before["size_bytes"] * 0.7, (before, after)
    assert after["counts"] == before["counts"] and after["total"] == _N
    assert after["tokens_in"] == before["tokens_in"]  # the tallies are untouched
    with sqlite3.connect(db) as conn:
        ((left,),) = conn.execute(
            "SELECT count(*) FROM jobs WHERE length(body) > 0 OR response IS NOT NULL"
        )
    assert left == 0

    _run(ran, server)  # the same file again: nothing sent, the file as it was
    assert len(server.requests) == sent
    assert _by_id(results) == written

    # New lines make the export write the file again: the pruned lines are carried over.
    write_prompts(ran / "b.jsonl", [("q0", "new one"), ("q1", "another")], mode="a")
    _run(ran, server)
    assert len(server.requests) == sent + 2
    now = _by_id(results)
    assert set(now) == set(written) | {"q0", "q1"}
    assert {c: now[c] for c in written} == written
    assert len(read_jsonl(results)) == _N + 2  # one line each, none twice

    proc = run_aiq("export", cwd=ran)  # `aiq export` carries them too
    assert proc.returncode == 0, proc.stderr
    assert _by_id(results) == now and len(read_jsonl(results)) == _N + 2

    # `aiq export` wrote files no run stamped (it may run beside one): a prune leaves them
    # until a run or resume has exported again, as it says.
    proc = run_aiq("prune", "--done-older-than", "0s", cwd=ran)
    assert "left 2 jobs old enough but not in their output files yet" in proc.stdout
    assert "run `aiq resume` to export them" in proc.stdout
    assert run_aiq("resume", cwd=ran).returncode == 0
    proc = run_aiq("prune", "--done-older-than", "0s", cwd=ran)  # the two new ones
    assert proc.stdout.startswith("pruned 2 done jobs: "), proc.stdout
    write_prompts(ran / "b.jsonl", [("q2", "third")], mode="a")
    _run(ran, server)
    assert set(_by_id(results)) == set(now) | {"q2"}
    assert len(read_jsonl(results)) == _N + 3


def test_jobs_not_in_their_files_yet_are_never_pruned(ran: Path, server: FakeServer) -> None:
    results = ran / "b.results.jsonl"
    db = ran / ".aiq" / "aiq.db"

    # Too young.
    proc = run_aiq("prune", "--done-older-than", "30d", cwd=ran)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("nothing to prune"), proc.stdout

    # Finished after the export began (as a job of a run that died before exporting would).
    with sqlite3.connect(db) as conn:
        ((value,),) = conn.execute("SELECT value FROM meta WHERE name LIKE 'export:%'")
        at = json.loads(value)["at"]
        conn.execute(
            "UPDATE jobs SET finished_at = ? WHERE k64 = "
            "(SELECT job_k64 FROM items WHERE custom_id = 'p3')",
            (at + 0.001,),
        )
    # It must also be old enough for `0s`: a fast run, export and prune can all fall inside
    # a delay larger than this (a CI run's prune came 0.5 s after the export began).
    while time.time() <= at + 0.01:
        time.sleep(0.01)
    proc = run_aiq("prune", "--done-older-than", "0s", cwd=ran)
    assert proc.stdout.startswith(f"pruned {_N - 1} done jobs"), proc.stdout
    assert "left 1 job old enough but not in their output files yet" in proc.stdout

    # The results file edited since aiq wrote it: it may not hold them any more.
    write_prompts(ran / "b.jsonl", [("q0", "new one")], mode="a")
    _run(ran, server)
    with results.open("a") as f:
        f.write("\n")
    proc = run_aiq("prune", "--done-older-than", "0s", cwd=ran)
    assert proc.stdout.startswith("nothing to prune"), proc.stdout
    assert "left 2 jobs" in proc.stdout
    with sqlite3.connect(db) as conn:
        kept = {
            c
            for (c,) in conn.execute(
                "SELECT i.custom_id FROM items i JOIN jobs j ON j.k64 = i.job_k64 "
                "WHERE length(j.body) > 0 AND j.response IS NOT NULL"
            )
        }
    assert kept == {"p3", "q0"}


def test_an_export_stamp_from_before_prune_existed_prunes_nothing(ran: Path) -> None:
    with sqlite3.connect(ran / ".aiq" / "aiq.db") as conn:
        ((name, value),) = conn.execute("SELECT name, value FROM meta WHERE name LIKE 'export:%'")
        stamp = json.loads(value)
        del stamp["at"]
        conn.execute("UPDATE meta SET value = ? WHERE name = ?", (json.dumps(stamp), name))
    proc = run_aiq("prune", "--done-older-than", "0s", cwd=ran)
    assert proc.stdout.startswith("nothing to prune"), proc.stdout
    assert f"left {_N} jobs" in proc.stdout


def test_forget_deletes_the_jobs_and_a_rerun_sends_them_again(
    ran: Path, server: FakeServer
) -> None:
    results = ran / "b.results.jsonl"
    written = _by_id(results)

    proc = run_aiq("prune", "--done-older-than", "0s", "--forget", cwd=ran)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"forgot {_N} done jobs"), proc.stdout
    st = _status(ran)
    assert st["total"] == 0 and st["counts"]["done"] == 0  # the delete trigger's tallies
    assert run_aiq("export", cwd=ran).returncode == 0
    assert _by_id(results) == written  # the lines stay until they are done again

    _run(ran, server)

    assert len(server.requests) == 2 * _N
    st = _status(ran)
    assert st["total"] == _N and st["counts"]["done"] == _N
    assert set(_by_id(results)) == set(written) and len(read_jsonl(results)) == _N


def test_dead_jobs_are_pruned_with_their_dead_letters_kept(
    tmp_path: Path, server: FakeServer
) -> None:
    prompts = [(f"p{i}", f"{'FAIL_PERMANENT ' if i < 3 else ''}{i} {_LONG}") for i in range(8)]
    write_prompts(tmp_path / "b.jsonl", prompts)
    _run(tmp_path, server, code=1)
    dead = tmp_path / "b.dead.jsonl"
    letters = _by_id(dead)
    assert set(letters) == {"p0", "p1", "p2"}

    proc = run_aiq("prune", "--done-older-than", "1d", "--dead-older-than", "0s", cwd=tmp_path)

    assert proc.stdout.startswith("pruned 3 dead jobs"), proc.stdout
    assert _status(tmp_path)["counts"] == {"queued": 0, "running": 0, "done": 5, "dead": 3}
    replay = run_aiq("replay-dead", cwd=tmp_path)  # their requests are gone: nothing to send
    assert replay.returncode == 0 and "nothing to replay" in replay.stdout, replay.stdout
    assert run_aiq("export", cwd=tmp_path).returncode == 0
    assert _by_id(dead) == letters and len(read_jsonl(dead)) == 3
    assert len(read_jsonl(tmp_path / "b.results.jsonl")) == 5


def test_a_prune_waits_for_no_run_it_refuses_while_one_works(ran: Path) -> None:
    write_prompts(ran / "b.jsonl", [(f"s{i}", f"slow {i}") for i in range(50)], mode="a")
    with FakeServer(latency_s=0.5) as slow:
        run = start_aiq("run", "b.jsonl", "--base-url", slow.base_url, "--model", "m", cwd=ran)
        try:
            deadline = time.monotonic() + 20
            while not slow.requests and time.monotonic() < deadline:  # it holds the lock
                time.sleep(0.05)
            proc = run_aiq("prune", "--done-older-than", "0s", cwd=ran)
        finally:
            run.kill()
            run.wait(timeout=30)
    assert proc.returncode == 3, proc.stderr
    assert "another aiq run holds" in proc.stderr and "--wait SECONDS" in proc.stderr
    assert _status(ran)["size_bytes"] > 0


def test_lines_no_file_holds_after_a_prune_are_counted(ran: Path, server: FakeServer) -> None:
    assert run_aiq("prune", "--done-older-than", "0s", cwd=ran).returncode == 0
    sent = len(server.requests)
    # Another file asking for three of the pruned requests: sent once, their replies are in
    # b.results.jsonl only.
    write_prompts(ran / "c.jsonl", [(f"c{i}", f"{i} {_LONG}") for i in range(3)])
    proc = run_aiq("run", "c.jsonl", "--base-url", server.base_url, "--model", "m", cwd=ran)
    assert proc.returncode == 0, proc.stderr
    assert len(server.requests) == sent
    assert "pruned: 3 lines of " in proc.stdout and "c.jsonl are in neither file" in proc.stdout
    assert (ran / "c.results.jsonl").read_text() == ""
    # A results file removed after the prune: its lines are gone, and said to be.
    (ran / "b.results.jsonl").unlink()
    proc = run_aiq("export", cwd=ran)
    assert f"pruned: {_N} lines of " in proc.stdout, proc.stdout
    assert "pruned: 3 lines of " in proc.stdout


def test_bad_ages_are_refused(ran: Path) -> None:
    for bad in ("30", "d", "-1d", "thirty days"):
        proc = run_aiq("prune", "--done-older-than", bad, cwd=ran)
        assert proc.returncode == 2, proc.stdout
        assert f"{bad!r} is not an age" in proc.stderr and "30d" in proc.stderr


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45s", 45), ("90m", 5400), ("12h", 43200), ("30d", 2592000), ("2w", 1209600), ("1.5h", 5400)],
)
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds
