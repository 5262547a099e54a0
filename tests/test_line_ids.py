"""End to end, real `aiq` against the fake server: lines without a custom_id are named line-N (one
result line each, identical lines sharing one call), stores that named them k-<hex> are renamed
without sending anything again, and config defaults are applied only where a request takes them.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import read_jsonl, run_aiq
from fakeserver import FakeServer

from aiq.inputs import custom_id_hash

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

ROOT = Path(__file__).parent.parent


def _write(path: Path, *prompts: str) -> None:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))


def _run(tmp_path: Path, server: FakeServer, *extra: str) -> str:
    proc = run_aiq("run", "p.jsonl", "--base-url", server.base_url, "--model", "m", *extra,
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _results(tmp_path: Path) -> dict[str, str]:
    """custom_id → the prompt its answer answers (the fake server echoes it)."""
    out = {}
    for r in read_jsonl(tmp_path / "p.results.jsonl"):
        content = r["response"]["body"]["choices"][0]["message"]["content"]
        out[r["custom_id"]] = content
    return out


def _sent(server: FakeServer) -> list[str]:
    return [r.prompt for r in server.requests]


def test_each_line_gets_its_number_and_its_own_result_line(
    tmp_path: Path, server: FakeServer
) -> None:
    _write(tmp_path / "p.jsonl", "a", "b", "a", "c")
    _run(tmp_path, server)
    assert sorted(_sent(server)) == ["a", "b", "c"]  # the two identical lines: one call
    first = _results(tmp_path)
    assert sorted(first) == ["line-1", "line-2", "line-3", "line-4"]
    assert first["line-1"] == first["line-3"]  # the same answer, a line each

    out = _run(tmp_path, server)  # again: nothing sent, the same results
    assert "0 new, 4 known" in out and len(server.requests) == 3
    assert _results(tmp_path) == first

    with (tmp_path / "p.jsonl").open("a") as f:
        f.write(json.dumps({"prompt": "d"}) + "\n")
    _run(tmp_path, server)  # appended: only the new line is sent, the old ids stay
    assert _sent(server)[3:] == ["d"]
    assert _results(tmp_path) == {**first, "line-5": _results(tmp_path)["line-5"]}

    # A line inserted in the middle renumbers the lines after it: their ids follow the file
    # (line-3 is now the inserted line), their requests are known, so only it is sent.
    _write(tmp_path / "p.jsonl", "a", "b", "new", "a", "c", "d")
    out = _run(tmp_path, server)
    assert "1 new, 2 known, 3 changed" in out, out
    assert _sent(server)[4:] == ["new"]
    now = _results(tmp_path)
    assert sorted(now) == [f"line-{n}" for n in range(1, 7)]
    assert now["line-4"] == first["line-3"] and now["line-6"] != now["line-3"]


def test_a_store_that_named_lines_k_hex_is_renamed_and_sends_nothing_again(
    tmp_path: Path, server: FakeServer
) -> None:
    _write(tmp_path / "p.jsonl", "a", "b", "a", "c")
    _run(tmp_path, server)
    answers = _results(tmp_path)
    _make_it_old(tmp_path / ".aiq" / "aiq.db")

    out = _run(tmp_path, server)

    assert len(server.requests) == 3  # nothing sent again
    # Three items renamed in place; the identical line 3, which had none, has one now.
    assert "1 new, 3 known, 0 changed" in out, out
    assert _results(tmp_path) == answers
    with sqlite3.connect(tmp_path / ".aiq" / "aiq.db") as db:
        ids = sorted(r[0] for r in db.execute("SELECT custom_id FROM items"))
    assert ids == ["line-1", "line-2", "line-3", "line-4"]


def _make_it_old(db_path: Path) -> None:
    """The store as aiq wrote it before line ids: k-<24 hex digits of the key> per distinct
    request, the later of two identical lines with no item, migration 0004 not applied."""
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "SELECT i.id, i.job_k64, lower(hex(substr(j.key, 1, 12))) FROM items i "
            "JOIN jobs j ON j.k64 = i.job_k64 ORDER BY i.line_no"
        ).fetchall()
        seen = set()
        for item_id, job, digits in rows:
            if job in seen:
                db.execute("DELETE FROM items WHERE id = ?", (item_id,))
                continue
            seen.add(job)
            old = f"k-{digits}"
            db.execute(
                "UPDATE items SET custom_id = ?, ck = ? WHERE id = ?",
                (old, custom_id_hash(old), item_id),
            )
        db.execute("DELETE FROM migrations WHERE name = '0005_line_ids'")
        db.execute("UPDATE prefixes SET rules = 'read under rules 3'")


def test_defaults_reach_the_wire_only_where_the_request_takes_them(
    tmp_path: Path, server: FakeServer
) -> None:
    user = [{"role": "user", "content": "dev"}]
    lines: list[dict[str, Any]] = [
        {"custom_id": "plain", "prompt": "plain"},
        {"custom_id": "mct", "prompt": "mct", "max_completion_tokens": 9},
        {"custom_id": "dev", "messages": [{"role": "developer", "content": "Be terse."}, *user]},
        {"custom_id": "o4", "prompt": "o4", "model": "o4-mini"},
        {"custom_id": "batch", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": "batch"}]}},
    ]  # fmt: skip
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "aiq.yaml").write_text("max_tokens: 50\ntemperature: 0.3\nsystem: House style.\n")

    add = run_aiq("add", "p.jsonl", "--model", "m", cwd=tmp_path)
    dry = run_aiq("run", "p.jsonl", "--dry-run", "--json", "--model", "m", cwd=tmp_path)
    _run(tmp_path, server)

    assert add.returncode == 0 and add.stderr.startswith("config: aiq.yaml\n"), add.stderr
    applied = (
        "defaults applied: model to 3 lines, max_tokens to 2 lines, max_tokens (as "
        "max_completion_tokens) to 1 line, temperature to 3 lines, system to 3 lines; "
        "temperature not added to 1 line (reasoning models)"
    )
    assert applied in add.stdout, add.stdout
    assert json.loads(dry.stdout)["defaults_applied"] == {
        "model": 3,
        "max_tokens": 2,
        "max_tokens (as max_completion_tokens)": 1,
        "temperature": 3,
        "system": 3,
        "temperature withheld": 1,
    }
    sent = {r.prompt: r.body for r in server.requests}
    house = {"role": "system", "content": "House style."}
    assert sent["plain"] == {"model": "m", "max_tokens": 50, "temperature": 0.3,
                             "messages": [house, {"role": "user", "content": "plain"}]}  # fmt: skip
    assert "max_tokens" not in sent["mct"] and sent["mct"]["max_completion_tokens"] == 9
    assert [m["role"] for m in sent["dev"]["messages"]] == ["developer", "user"]
    assert sent["o4"]["max_completion_tokens"] == 50
    assert "temperature" not in sent["o4"] and "max_tokens" not in sent["o4"]
    assert sent["batch"] == lines[4]["body"]  # byte for byte what the Batch API would get


def test_the_example_config_changes_no_request(tmp_path: Path, server: FakeServer) -> None:
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"prompt": p, "model": "m"}) + "\n" for p in ("a", "b"))
    )
    shutil.copy(ROOT / "config.example.yaml", tmp_path / "aiq.yaml")
    with_example = run_aiq("run", "p.jsonl", "--base-url", server.base_url, cwd=tmp_path)
    assert with_example.returncode == 0, with_example.stderr
    assert "config: aiq.yaml" in with_example.stderr
    (tmp_path / "aiq.yaml").unlink()

    without = run_aiq("run", "p.jsonl", "--base-url", server.base_url, cwd=tmp_path)

    assert without.returncode == 0, without.stderr
    assert "config:" not in without.stderr
    assert "0 new, 2 known" in without.stdout  # the same requests: nothing sent again
    assert len(server.requests) == 2
    assert all(set(r.body) == {"model", "messages"} for r in server.requests)
