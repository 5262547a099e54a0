"""The cron contract: --max-runtime, --json, --quiet, --log-file, --metrics-file, SIGTERM drain."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def _prompts(n: int) -> list[tuple[str, str]]:
    return [(f"j{i}", f"cron prompt {i}") for i in range(n)]


def test_max_runtime_drains_exports_and_exits_5_then_resume_finishes(tmp_path: Path) -> None:
    # 4 in flight at 50 ms a reply: at most 80/s, so a second's run leaves most of 200 lines.
    write_prompts(tmp_path / "n.jsonl", _prompts(200))
    with FakeServer(latency_s=0.05) as server:
        args = ["--base-url", server.base_url]
        proc = run_aiq("run", "n.jsonl", "--model", "m", *args, "--concurrency", "4",
                       "--max-runtime", "1", "--json", cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 5, proc.stderr
        summary = json.loads(proc.stdout)
        assert summary["exit_code"] == 5 and summary["stopped"] == "limit"
        assert summary["status"]["counts"]["running"] == 0
        done = summary["status"]["counts"]["done"]
        assert 0 < done < 200
        assert len(read_jsonl(tmp_path / "n.results.jsonl")) == done  # exported on the way out
        assert len(server.requests) == done  # drained: everything sent was recorded

        resumed = run_aiq("resume", *args, "--concurrency", "16", "--quiet", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
    assert len(read_jsonl(tmp_path / "n.results.jsonl")) == 200
    assert len({r.prompt for r in server.requests}) == len(server.requests) == 200


def test_json_quiet_log_file_and_metrics(tmp_path: Path, server: FakeServer) -> None:
    write_prompts(tmp_path / "m.jsonl", [*_prompts(20), ("bad", "FAIL_PERMANENT please")])
    log, metrics = tmp_path / "aiq.log", tmp_path / "aiq.prom"
    proc = run_aiq(
        "run", "m.jsonl", "--model", "m", "--base-url", server.base_url, "--quiet",
        "--log-file", log, "--metrics-file", metrics, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == ""  # --quiet: only the summary, on stdout
    assert "\x1b[" not in proc.stdout
    assert "results: " in proc.stdout

    stamped = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d ")
    lines = log.read_text().splitlines()
    assert lines and all(stamped.match(line) for line in lines)
    assert any("dead letters: " in line for line in lines)

    text = metrics.read_text()
    assert 'aiq_jobs{state="done"} 20' in text
    assert 'aiq_jobs{state="dead"} 1' in text
    assert 'aiq_requests_total{outcome="dead"} 1' in text
    assert "aiq_last_run_exit_code 1" in text
    assert re.search(r"^aiq_last_run_end_timestamp_seconds \d+\.\d+$", text, re.M)
    for line in text.splitlines():  # Prometheus text format: comments or `name{labels} value`
        assert line.startswith("# ") or re.match(
            r"^[a-z_]+(\{[a-z_]+=\"[a-z_]+\"(,[a-z_]+=\"[a-z_]+\")*\})? [\d.]+$", line
        )

    again = run_aiq("run", "m.jsonl", "--model", "m", "--json", cwd=tmp_path)
    summary = json.loads(again.stdout)  # nothing new: exits quickly, still one JSON object
    assert summary["done_now"] == 0 and summary["outputs"][0]["results_count"] == 20


def test_sigterm_drains_like_sigint(tmp_path: Path) -> None:
    write_prompts(tmp_path / "t.jsonl", _prompts(300))
    with FakeServer(latency_s=0.05) as server:
        args = ["--base-url", server.base_url, "--model", "m", "--concurrency", "8"]
        proc = start_aiq("run", "t.jsonl", *args, cwd=tmp_path, capture=True)
        deadline = time.monotonic() + 30
        while len(server.requests) < 40 and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "aiq resume" in out
        sent = len(server.requests)
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    assert status["counts"]["running"] == 0
    assert status["counts"]["done"] == sent
    assert len(read_jsonl(tmp_path / "t.results.jsonl")) == sent


OUTPUTS = ("p.results.jsonl", "p.dead.jsonl")


def _identity(path: Path) -> tuple[int, int, int] | None:
    if not path.exists():
        return None
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size


def _outputs(tmp_path: Path) -> dict[str, tuple[int, int, int] | None]:
    return {name: _identity(tmp_path / name) for name in OUTPUTS}


def test_a_rerun_that_changes_nothing_leaves_the_outputs_as_they_are(
    tmp_path: Path, server: FakeServer
) -> None:
    write_prompts(tmp_path / "p.jsonl", [("a", "x"), ("b", "FAIL_PERMANENT y"), ("c", "z")])
    args = ("run", "p.jsonl", "--model", "m", "--base-url", server.base_url)
    assert run_aiq(*args, cwd=tmp_path).returncode == 1  # one dead letter
    written = _outputs(tmp_path)
    sent = len(server.requests)

    again = run_aiq(*args, cwd=tmp_path)

    assert again.returncode == 1, again.stderr
    assert "(2 lines, unchanged)" in again.stdout and "(1 line, unchanged)" in again.stdout
    as_json = json.loads(run_aiq(*args, "--json", cwd=tmp_path).stdout)
    assert [o["written"] for o in as_json["outputs"]] == [False]
    assert _outputs(tmp_path) == written  # not rewritten: same inode, mtime and size
    assert len(server.requests) == sent
    assert [r["custom_id"] for r in read_jsonl(tmp_path / "p.results.jsonl")] == ["a", "c"]


def test_any_change_to_the_store_or_the_files_rewrites_the_outputs(
    tmp_path: Path, server: FakeServer
) -> None:
    write_prompts(tmp_path / "p.jsonl", [("a", "x"), ("b", "FAIL_PERMANENT y")])
    run = ("run", "p.jsonl", "--model", "m", "--base-url", server.base_url)

    def rewritten(*cmd: str, code: int = 1) -> list[dict]:
        before = _outputs(tmp_path)
        proc = run_aiq(*cmd, cwd=tmp_path)
        assert proc.returncode == code, proc.stderr
        assert "unchanged" not in proc.stdout
        after = _outputs(tmp_path)
        assert all(after[name] not in (None, before[name]) for name in OUTPUTS)
        return read_jsonl(tmp_path / "p.results.jsonl")

    assert len(rewritten(*run)) == 1
    write_prompts(tmp_path / "p.jsonl", [("c", "z")], mode="a")  # a new line
    assert [r["custom_id"] for r in rewritten(*run)] == ["a", "c"]
    assert run_aiq("replay-dead", cwd=tmp_path).returncode == 0  # b dies again, later
    rewritten("resume", "--base-url", server.base_url)
    (tmp_path / "p.results.jsonl").write_text("")  # the user's own edit
    assert len(rewritten(*run)) == 2
    (tmp_path / "p.dead.jsonl").unlink()
    rewritten(*run)
    assert len(read_jsonl(tmp_path / "p.dead.jsonl")) == 1
    rewritten(*run, "--order", "input")
    rewritten("export", code=0)  # asked for: always written
