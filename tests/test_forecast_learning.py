"""A dry run learns from replies: the first forecast of a chat model's prompts is a rule of thumb,
the next one is at the ratio of real to estimated tokens the store kept from the run between.

The fake server counts prompts as Gemma 3 under llama.cpp does (``GEMMA3_TEMPLATE``: 9 tokens of
template for a one-message request), where aiq's rule of thumb counts OpenAI's 6: the first
forecast falls short, as the issue measured against a real server, and the second does not.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import API_KEY, run_aiq, write_prompts
from fakeserver import GEMMA3_TEMPLATE, FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

CONFIG = "prices:\n  m: {input: 1.0, output: 2.0}\n"
WORDS = ["apple", "pear", "fig", "plum", "kiwi", "lime", "date", "peach", "grape", "melon"]
MORE = ["cherry", "lemon", "mango", "olive", "quince", "guava", "papaya", "berry", "nut", "yam"]


@pytest.fixture
def gemma() -> Iterator[FakeServer]:
    with FakeServer(require_key=API_KEY, chat_template=GEMMA3_TEMPLATE) as s:
        yield s


def _estimate(word: str) -> int:
    """aiq's rule of thumb for a one-word prompt: a token per 4 characters, 3 + 3 of template."""
    return math.ceil(len(word) / 4) + 3 + 3


def _real(word: str) -> int:
    """What the fake counts: the text as 4 characters a token, and Gemma 3's 5 + 4."""
    return math.ceil(len(word) / 4) + sum(GEMMA3_TEMPLATE)


def _write(path: Path, words: list[str]) -> None:
    with path.open("w") as f:
        for w in words:
            f.write(json.dumps({"custom_id": w, "prompt": w, "max_tokens": 16}) + "\n")


def _dry_run(tmp_path: Path, file: str, args: tuple[str, ...]) -> tuple[dict, str]:
    proc = run_aiq("run", file, "--dry-run", "--json", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = run_aiq("run", file, "--dry-run", *args, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    return json.loads(proc.stdout), text.stdout


def test_the_second_dry_run_prices_prompts_at_the_ratio_the_run_learned(
    tmp_path: Path, gemma: FakeServer
) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    _write(tmp_path / "first.jsonl", WORDS)
    _write(tmp_path / "second.jsonl", MORE)
    args = ("--base-url", gemma.base_url, "--model", "m")

    before, text = _dry_run(tmp_path, "first.jsonl", args)

    (m,) = before["models"]
    first = sum(map(_estimate, WORDS))
    assert m["prompt_tokens"] == first == 74
    assert m["prompt_basis"] is None and before["cost_usd_high"] is None
    assert "prompts of m: an estimate, at about 4 characters a token plus 3 a message and 3 a " \
        "request (no replies of m in the store to learn from)" in text  # fmt: skip
    assert "(an estimate)" in text
    # Output is bounded by max_tokens; the prompts are not, and the wording says so.
    assert text.count("upper bound") == 1 and "an upper bound on output" in text

    assert run_aiq("run", "first.jsonl", *args, cwd=tmp_path).returncode == 0
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    real = sum(map(_real, WORDS))
    assert status["tokens_in"] == real == 104  # the first forecast was 74: short by 29%

    after, text = _dry_run(tmp_path, "second.jsonl", args)

    (m,) = after["models"]
    ratio = real / first
    assert m["prompt_basis"] == {"replies": 10, "ratio": ratio, "highest": 10 / 7}
    estimated = sum(map(_estimate, MORE))
    assert m["estimated_prompt_tokens"] == estimated
    assert m["prompt_tokens"] == round(estimated * ratio)
    assert m["prompt_tokens_high"] == round(estimated * 10 / 7)
    assert math.isclose(m["cost_usd"], (round(estimated * ratio) + 160 * 2.0) / 1e6)
    assert "prompts of m: an estimate, at the ratio learned from 10 replies of m (x1.41 the " \
        "rule of thumb; the highest one reply showed: x1.43)" in text  # fmt: skip
    assert "a margin, not a bound" in text
    assert text.count("upper bound") == 1

    # And the run bears it out: its prompts come within 5% of the learned figure (110 for
    # 108), where the rule of thumb alone (78) fell 28% short.
    assert run_aiq("run", "second.jsonl", *args, cwd=tmp_path).returncode == 0
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    spent = status["tokens_in"] - real
    assert spent == sum(map(_real, MORE)) == 108
    assert abs(m["prompt_tokens"] - spent) <= 0.05 * spent < spent - estimated


def test_what_is_learned_adds_up_across_runs_and_a_dry_run_changes_nothing(
    tmp_path: Path, gemma: FakeServer
) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    args = ("--base-url", gemma.base_url, "--model", "m")
    write_prompts(tmp_path / "p.jsonl", [(w, w) for w in WORDS[:4]])
    assert run_aiq("run", "p.jsonl", *args, cwd=tmp_path).returncode == 0
    write_prompts(tmp_path / "p.jsonl", [(w, w) for w in WORDS[4:]], mode="a")
    assert run_aiq("run", "p.jsonl", *args, cwd=tmp_path).returncode == 0
    assert run_aiq("resume", cwd=tmp_path).returncode == 0  # nothing new: nothing counted
    db = tmp_path / ".aiq" / "aiq.db"
    stamp = db.read_bytes()

    _write(tmp_path / "q.jsonl", MORE)
    f, _ = _dry_run(tmp_path, "q.jsonl", args)

    assert f["models"][0]["prompt_basis"]["replies"] == 10  # 4 then 6, each reply once
    assert db.read_bytes() == stamp


def test_replies_the_store_has_not_learned_from_are_read_by_the_dry_run(
    tmp_path: Path, gemma: FakeServer
) -> None:
    """A store whose runs kept nothing learned (an older aiq's, or a run killed before its end)
    still teaches the forecast: its done jobs' replies are read, and nothing is written."""
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    args = ("--base-url", gemma.base_url, "--model", "m")
    _write(tmp_path / "p.jsonl", WORDS)
    assert run_aiq("run", "p.jsonl", *args, cwd=tmp_path).returncode == 0
    db = tmp_path / ".aiq" / "aiq.db"
    with sqlite3.connect(db) as con:
        assert con.execute("DELETE FROM meta WHERE name LIKE 'prompt_ratio%'").rowcount == 2
    con.close()
    stamp = db.read_bytes()

    _write(tmp_path / "q.jsonl", MORE)
    f, text = _dry_run(tmp_path, "q.jsonl", args)

    assert f["models"][0]["prompt_basis"]["replies"] == 10
    assert "the ratio learned from 10 replies of m" in text
    assert db.read_bytes() == stamp
