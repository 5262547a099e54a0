"""One model that always fails is that model's problem, not the provider's (issue 13, item 5).

Real `aiq` subprocesses against the fake server, which answers every request naming one model
with a 500 (a gateway whose deployment of that model is down) and serves the other. Measured
before the breaker was per model, with 100 jobs of each and --max-outage 20: exit 4 after 41 s
("failed every call"), 61 of the healthy model's 100 done, none of the broken one's dead-lettered
(attempts 1-3); after: exit 1 in 16 s, the healthy model's 100 done by 2.6 s, the broken one's
100 dead after 5 attempts each.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import read_jsonl, run_aiq
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

N = 30
ATTEMPTS = 3


def _mixed(path: Path) -> None:
    with path.open("w") as f:
        for i in range(N):
            for model in ("good-model", "bad-model"):
                line = {"custom_id": f"{model}-{i}", "prompt": f"{model} {i}", "model": model}
                f.write(json.dumps(line) + "\n")


def test_a_broken_models_jobs_are_dead_lettered_while_the_others_finish(tmp_path: Path) -> None:
    _mixed(tmp_path / "f.jsonl")
    (tmp_path / "aiq.yaml").write_text("backoff_base_s: 0.05\nbackoff_cap_s: 0.2\n")
    with FakeServer(status_for_model={"bad-model": 500}, latency_s=0.02) as server:
        started = time.monotonic()
        done = run_aiq(
            "run", "f.jsonl", "--base-url", server.base_url, "--concurrency", "8",
            "--max-attempts", str(ATTEMPTS), "--max-outage", "60", cwd=tmp_path,
        )  # fmt: skip
        elapsed = time.monotonic() - started
        requests = server.requests
        dead = read_jsonl(tmp_path / "f.dead.jsonl")
        results = read_jsonl(tmp_path / "f.results.jsonl")
        # The model's deployment is back: its jobs replay and finish.
        server.status_for_model = {}
        replayed = run_aiq("replay-dead", "--error", "server", cwd=tmp_path)
        resumed = run_aiq("resume", cwd=tmp_path)
    assert replayed.returncode == 0 and f"replayed {N} dead jobs" in replayed.stdout
    assert resumed.returncode == 0, resumed.stderr
    assert len(read_jsonl(tmp_path / "f.results.jsonl")) == 2 * N

    assert done.returncode == 1, done.stderr  # finished, some jobs dead (DESIGN.md)
    assert "max-outage" not in done.stderr and "failed every call" not in done.stderr
    assert elapsed < 20  # not --max-outage's 60 s
    good = [r for r in requests if r.prompt.startswith("good-model")]
    assert len(good) == N and all(r.status == 200 for r in good)  # each sent once, promptly
    assert max(r.monotonic for r in good) - started < 10
    bad = [r for r in requests if r.prompt.startswith("bad-model")]
    assert len(bad) == N * ATTEMPTS and all(r.status == 500 for r in bad)
    assert f"finished {N} and dead-lettered {N}" in done.stdout
    assert sorted(r["custom_id"] for r in results) == sorted(f"good-model-{i}" for i in range(N))
    assert sorted(d["custom_id"] for d in dead) == sorted(f"bad-model-{i}" for i in range(N))
    assert {(d["attempts"], d["error"]["type"], d["error"]["status_code"]) for d in dead} == {
        (ATTEMPTS, "server", 500)
    }
    # Each says why: its model failed alone, so look at it, then replay.
    late = [
        d["error"]["message"]
        for d in dead
        if "while other models answered" in d["error"]["message"]
    ]
    assert len(late) >= N // 2  # those that died after the model's breaker opened
    assert all("bad-model" in m and "aiq replay-dead --error server" in m for m in late)


def test_when_every_model_fails_it_is_still_an_outage(tmp_path: Path) -> None:
    # Both models down: the provider is, and no job is charged for it (exit 4, all kept).
    _mixed(tmp_path / "f.jsonl")
    down = {"good-model": 503, "bad-model": 500}
    with FakeServer(status_for_model=down) as server:
        started = time.monotonic()
        done = run_aiq(
            "run", "f.jsonl", "--base-url", server.base_url, "--concurrency", "4",
            "--max-outage", "2", cwd=tmp_path,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 4, done.stderr
    assert "failed every call" in done.stderr and "--max-outage" in done.stderr
    assert elapsed < 15
    with sqlite3.connect(tmp_path / ".aiq" / "aiq.db") as conn:
        states = conn.execute("SELECT state, max(attempts) FROM jobs GROUP BY state").fetchall()
    assert [s for s, _ in states] == [0]  # every job queued, none dead
    assert states[0][1] < 5  # attempts before the breakers opened, never used up
