"""CLI-level behaviour of `add`, `export` and `status` (real subprocesses, real store)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
from conftest import aiq_env, read_jsonl, run_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def test_add_counts_new_known_changed_invalid(tmp_path: Path) -> None:
    f = tmp_path / "in.jsonl"
    write_prompts(f, [("a", "one"), ("b", "two"), ("c", "three")])
    first = run_aiq("add", f.name, "--model", "m", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "3 new, 0 known, 0 changed, 0 invalid (3 new requests to send)" in first.stdout

    write_prompts(f, [("a", "one"), ("b", "two, fixed"), ("c", "three"), ("d", "four")])
    with f.open("a") as out:
        out.write("{oops\n")
    second = run_aiq("add", f.name, "--model", "m", cwd=tmp_path)
    assert second.returncode == 6, second.stderr
    assert "1 new, 2 known, 1 changed, 1 invalid (2 new requests to send)" in second.stdout
    assert "in.jsonl:5: not valid JSON" in second.stderr

    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    # b's old request was never sent, so it is dropped: 4 jobs, all queued.
    assert status["total"] == 4 and status["counts"]["queued"] == 4


def test_export_rewrites_outputs_from_the_store(tmp_path: Path) -> None:
    write_prompts(tmp_path / "e.jsonl", [(f"id{i}", f"prompt {i}") for i in range(20)])
    with FakeServer() as server:
        args = ["--base-url", server.base_url, "--model", "m"]
        assert run_aiq("run", "e.jsonl", *args, cwd=tmp_path).returncode == 0
    results = tmp_path / "e.results.jsonl"
    results.unlink()
    proc = run_aiq("export", "--order", "input", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "e.results.jsonl (20 lines)" in proc.stdout
    assert [r["custom_id"] for r in read_jsonl(results)] == [f"id{i}" for i in range(20)]
    assert results.stat().st_mode & 0o777 == 0o600


def test_status_without_a_store_says_what_to_do(tmp_path: Path) -> None:
    proc = run_aiq("status", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "aiq run FILE" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_input_file_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_aiq("run", "nope.jsonl", "--provider", "simulated", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "nope.jsonl: no such file" in proc.stderr


def test_help_shows_where_each_path_defaults_to(tmp_path: Path) -> None:
    # Square brackets in a help string are rich markup: "[default: …]" vanished from --help.
    proc = run_aiq("run", "--help", cwd=tmp_path, env=aiq_env(COLUMNS="200"))

    assert proc.returncode == 0, proc.stderr
    for shown in (".aiq/aiq.db", "aiq.yaml", "<input>.results.jsonl", "<input>.dead.jsonl"):
        assert shown in proc.stdout, shown
    assert "$OPENAI_BASE_URL" in proc.stdout


def test_version_is_the_installed_packages(tmp_path: Path) -> None:
    # Two places say the version (pyproject.toml, aiq.__version__): they must agree.
    proc = run_aiq("--version", cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"aiq {importlib.metadata.version('aiq')}\n"
