"""What aiq promises a user about stopping, where jobs go, skipped input and leftover state."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from conftest import aiq_env, read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def _wait_for_requests(server: FakeServer, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(server.requests) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(server.requests) >= n, "the requests never reached the server"


def test_a_second_signal_abandons_what_is_in_flight_at_once(tmp_path: Path) -> None:
    write_prompts(tmp_path / "h.jsonl", [(f"h{i}", f"hangs {i}") for i in range(4)])
    with FakeServer(hang_rate=1.0, hang_s=600.0) as server:
        args = ["--base-url", server.base_url, "--model", "m", "--concurrency", "2"]
        proc = start_aiq("run", "h.jsonl", *args, "--timeout", "600", cwd=tmp_path, capture=True)
        _wait_for_requests(server, 2)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        out, err = proc.communicate(timeout=15)
        # The grace for a drain is 30 s: only the second signal ends it this soon.
        assert time.monotonic() - started < 5
    assert proc.returncode == 130, err
    assert "aiq resume" in out


def test_a_drain_that_finishes_every_job_exits_as_a_finished_run(tmp_path: Path) -> None:
    write_prompts(tmp_path / "d.jsonl", [(f"d{i}", f"slow {i}") for i in range(4)])
    with FakeServer(latency_s=2.0) as server:
        args = ["--base-url", server.base_url, "--model", "m", "--concurrency", "4"]
        proc = start_aiq("run", "d.jsonl", *args, cwd=tmp_path, capture=True)
        assert proc.stderr is not None
        # The server logs a request once answered: the progress line says when all are out.
        while "in flight 4" not in (line := proc.stderr.readline()):
            assert line, "the run ended before its requests were in flight"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    assert "interrupted" not in out
    assert len(read_jsonl(tmp_path / "d.results.jsonl")) == 4


def _no_key_env() -> dict[str, str]:
    env = aiq_env()
    del env["OPENAI_API_KEY"]  # a local server needs none: resume must not ask for one
    return env


def test_resume_goes_where_the_run_went_without_repeating_flags(tmp_path: Path) -> None:
    write_prompts(tmp_path / "r.jsonl", [(f"r{i}", f"resume me {i}") for i in range(40)])
    env = _no_key_env()
    with FakeServer(latency_s=0.2) as server:
        args = ["--base-url", server.base_url, "--model", "m", "--concurrency", "2"]
        first = run_aiq("run", "r.jsonl", *args, "--max-runtime", "1", cwd=tmp_path, env=env)
        assert first.returncode == 5, first.stderr
        sent_before = len(server.requests)
        assert 0 < sent_before < 40

        server.latency_s = 0.01  # the rest at once: where they go is the point, not how fast
        resumed = run_aiq("resume", cwd=tmp_path, env=env)  # no flags at all, as from cron
        assert resumed.returncode == 0, resumed.stderr
        assert len(server.requests) == 40  # the rest went to the same server
    assert len(read_jsonl(tmp_path / "r.results.jsonl")) == 40


def test_a_real_store_refuses_the_simulated_provider(tmp_path: Path) -> None:
    write_prompts(tmp_path / "s.jsonl", [(f"s{i}", f"real job {i}") for i in range(20)])
    env = _no_key_env()
    with FakeServer(latency_s=0.2) as server:
        args = ["--base-url", server.base_url, "--model", "m", "--concurrency", "1"]
        first = run_aiq("run", "s.jsonl", *args, "--max-runtime", "1", cwd=tmp_path, env=env)
        assert first.returncode == 5, first.stderr
    before = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)["counts"]

    fake = run_aiq("resume", "--provider", "simulated", cwd=tmp_path, env=env)
    assert fake.returncode == 2
    assert fake.stderr.startswith("error: ") and "simulated" in fake.stderr
    assert "--db" in fake.stderr  # what to do instead
    again = run_aiq("run", "s.jsonl", "--provider", "simulated", cwd=tmp_path, env=env)
    assert again.returncode == 2, again.stderr
    after = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)["counts"]
    assert after == before  # not one job answered by the simulation


def test_a_simulated_store_refuses_a_real_provider(tmp_path: Path, server: FakeServer) -> None:
    write_prompts(tmp_path / "demo.jsonl", [(f"d{i}", f"demo {i}") for i in range(3)])
    demo = ["--provider", "simulated", "--concurrency", "3"]
    assert run_aiq("run", "demo.jsonl", *demo, cwd=tmp_path).returncode in (0, 1)
    real = run_aiq("run", "demo.jsonl", "--base-url", server.base_url, cwd=tmp_path)
    assert real.returncode == 2
    assert "simulated" in real.stderr and "--db" in real.stderr
    assert not server.requests


def test_another_base_url_needs_reroute_for_unfinished_jobs(tmp_path: Path) -> None:
    write_prompts(tmp_path / "m.jsonl", [(f"m{i}", f"move me {i}") for i in range(30)])
    env = _no_key_env()
    with FakeServer(latency_s=0.2) as old, FakeServer() as new:
        args = ["--model", "m", "--concurrency", "1"]
        first = run_aiq(
            "run", "m.jsonl", "--base-url", old.base_url, *args, "--max-runtime", "1",
            cwd=tmp_path, env=env,
        )  # fmt: skip
        assert first.returncode == 5, first.stderr
        sent_to_old = len(old.requests)

        refused = run_aiq("resume", "--base-url", new.base_url, cwd=tmp_path, env=env)
        assert refused.returncode == 2
        assert "--reroute" in refused.stderr and old.base_url in refused.stderr
        assert not new.requests

        moved = run_aiq("resume", "--base-url", new.base_url, "--reroute", cwd=tmp_path, env=env)
        assert moved.returncode == 0, moved.stderr
        assert len(old.requests) == sent_to_old
        assert len(new.requests) == 30 - sent_to_old
        # The store now goes to the new server: a plain resume or run needs no flag.
        again = run_aiq("run", "m.jsonl", cwd=tmp_path, env=env)
        assert again.returncode == 0, again.stderr


def test_a_later_file_gets_the_stores_default_model(tmp_path: Path) -> None:
    write_prompts(tmp_path / "a.jsonl", [("a1", "first file")])
    write_prompts(tmp_path / "b.jsonl", [("b1", "second file")])
    env = _no_key_env()
    with FakeServer() as server:
        args = ["--base-url", server.base_url, "--model", "nightly-model"]
        assert run_aiq("run", "a.jsonl", *args, cwd=tmp_path, env=env).returncode == 0
        later = run_aiq("run", "b.jsonl", cwd=tmp_path, env=env)  # a cron line with no flags
        assert later.returncode == 0, later.stderr
        assert [r.body["model"] for r in server.requests] == ["nightly-model"] * 2


def _mixed_file(path: Path) -> None:
    write_prompts(path, [("ok1", "a good line"), ("ok2", "another good line")])
    with path.open("a") as f:
        f.write('{"custom_id": "bad1", "prompt": 42}\n')
        f.write("not json at all\n")


def test_skipped_lines_are_reported_before_sending_and_exit_6(
    tmp_path: Path, server: FakeServer
) -> None:
    _mixed_file(tmp_path / "types.jsonl")
    proc = run_aiq("run", "types.jsonl", "--base-url", server.base_url, "--model", "m",
                   "--json", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert len(server.requests) == 2
    invalid = [n for n, line in enumerate(proc.stderr.splitlines()) if line.startswith("invalid:")]
    assert len(invalid) == 2 and "types.jsonl:3" in proc.stderr and "types.jsonl:4" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["exit_code"] == 6 and summary["invalid_lines"] == 2

    text = run_aiq("run", "types.jsonl", "--base-url", server.base_url, cwd=tmp_path)
    assert text.returncode == 6  # a re-run still skips them, and says so
    assert "skipped 2 invalid input lines" in text.stdout


def test_invalid_lines_come_before_any_progress(tmp_path: Path) -> None:
    _mixed_file(tmp_path / "slow.jsonl")
    with FakeServer(latency_s=1.0) as server:
        proc = run_aiq("run", "slow.jsonl", "--base-url", server.base_url, "--model", "m",
                       cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    lines = proc.stderr.splitlines()
    first_progress = next(n for n, line in enumerate(lines) if " done " in line)
    assert max(n for n, line in enumerate(lines) if line.startswith("invalid:")) < first_progress


def test_add_exits_6_when_lines_were_skipped(tmp_path: Path) -> None:
    _mixed_file(tmp_path / "a.jsonl")
    proc = run_aiq("add", "a.jsonl", "--model", "m", cwd=tmp_path)
    assert proc.returncode == 6, proc.stderr
    assert "2 new" in proc.stdout and "2 invalid" in proc.stdout


@pytest.mark.parametrize("content", ["", "\n\n   \n"])
def test_an_empty_input_warns_and_exits_7(tmp_path: Path, server: FakeServer, content: str) -> None:
    (tmp_path / "empty.jsonl").write_text(content)
    proc = run_aiq("run", "empty.jsonl", "--base-url", server.base_url, cwd=tmp_path)
    assert proc.returncode == 7, proc.stderr
    assert "warning: empty.jsonl has no lines" in proc.stderr
    assert not server.requests
    assert run_aiq("add", "empty.jsonl", cwd=tmp_path).returncode == 7
    dry = run_aiq("run", "empty.jsonl", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 7, dry.stderr


# -- what failed or read-only commands leave behind -----------------------------------------


def test_a_missing_or_garbage_input_leaves_no_store(tmp_path: Path) -> None:
    assert run_aiq("add", "nosuch.jsonl", "--model", "m", cwd=tmp_path).returncode == 2
    (tmp_path / "p.csv").write_text("custom_id,prompt\na1,what is 2+2?\n")
    proc = run_aiq("run", "p.csv", "--provider", "simulated", cwd=tmp_path)
    assert proc.returncode == 2 and "no valid line" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"]


def test_a_mistyped_db_directory_is_an_error_not_a_new_store(
    tmp_path: Path, server: FakeServer
) -> None:
    write_prompts(tmp_path / "f.jsonl", [("a", "hello")])
    missing = tmp_path / "no" / "such" / "dir" / "aiq.db"
    for command in (("run", "f.jsonl", "--base-url", server.base_url), ("add", "f.jsonl")):
        proc = run_aiq(*command, "--model", "m", "--db", missing, cwd=tmp_path)
        assert proc.returncode == 2
        assert f"directory {missing.parent} does not exist" in proc.stderr
    assert not (tmp_path / "no").exists() and not server.requests


def test_run_says_when_it_makes_a_new_store(tmp_path: Path, server: FakeServer) -> None:
    write_prompts(tmp_path / "f.jsonl", [("a", "hello")])
    args = ["--base-url", server.base_url, "--model", "m"]
    first = run_aiq("run", "f.jsonl", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert f"new store at {Path('.aiq') / 'aiq.db'}" in first.stderr
    again = run_aiq("run", "f.jsonl", *args, cwd=tmp_path)
    assert again.returncode == 0 and "new store" not in again.stderr


def test_read_only_commands_leave_no_wal_or_shm(tmp_path: Path, server: FakeServer) -> None:
    write_prompts(tmp_path / "f.jsonl", [("a", "hello")])
    args = ["--base-url", server.base_url, "--model", "m"]
    assert run_aiq("run", "f.jsonl", *args, cwd=tmp_path).returncode == 0
    store_files = sorted(p.name for p in (tmp_path / ".aiq").iterdir())
    run_aiq("check", *args, cwd=tmp_path)
    assert run_aiq("status", cwd=tmp_path).returncode == 0
    assert run_aiq("export", cwd=tmp_path).returncode == 0
    assert sorted(p.name for p in (tmp_path / ".aiq").iterdir()) == store_files
    assert not any(name.endswith(("-wal", "-shm")) for name in store_files)


def test_a_metrics_file_in_a_missing_directory_is_refused(
    tmp_path: Path, server: FakeServer
) -> None:
    write_prompts(tmp_path / "f.jsonl", [("a", "hello")])
    proc = run_aiq("run", "f.jsonl", "--base-url", server.base_url, "--model", "m",
                   "--metrics-file", "nodir/aiq.prom", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2
    assert "nodir" in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "nodir").exists() and not server.requests


def test_check_looks_where_the_store_sends(tmp_path: Path, server: FakeServer) -> None:
    write_prompts(tmp_path / "f.jsonl", [("a", "hello")])
    args = ["--base-url", server.base_url, "--model", "m"]
    assert run_aiq("run", "f.jsonl", *args, cwd=tmp_path).returncode == 0
    plain = run_aiq("check", cwd=tmp_path)  # no flags: the store's base URL, not OpenAI's
    assert f"base URL {server.base_url}, model m" in plain.stdout, plain.stdout
    other = run_aiq("check", "--provider", "simulated", cwd=tmp_path)
    assert other.returncode == 2
    assert any(line.startswith("FAIL store") for line in other.stdout.splitlines()), other.stdout
