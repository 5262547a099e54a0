"""A run-wide streak of 429s: each round backs off more, and a streak over --max-outage ends
the run (issue 13). A 429 costs a job no attempt, so without the streak a provider that
refuses everything and names no delay was asked again about once a second, forever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_aiq, write_prompts
from fakes import FakeClock
from fakeserver import FakeServer
from fakeserver import modes as fl

from aiq.refusals import RefusalStreak


def test_refusals_of_calls_in_flight_together_are_one_round() -> None:
    clock = FakeClock(100.0)
    streak = RefusalStreak(clock)
    assert [streak.refused() for _ in range(3)] == [1, 2, 3]  # no pause yet: each a round
    streak.pausing(2.0)
    clock.now += 1.0
    assert streak.refused() == 3  # sent before the pause ended: the same round
    clock.now += 1.5
    assert streak.refused() == 4
    assert streak.lasted_s() == 2.5
    streak.succeeded()
    assert (streak.rounds, streak.lasted_s()) == (0, 0.0)
    assert streak.refused() == 1


@pytest.mark.slow
def test_a_provider_refusing_every_call_with_no_delay_ends_the_run(tmp_path: Path) -> None:
    # Every call answered 429 with no retry header at all (a model that always fails behind a
    # gateway: ../shared/PROVIDERS.md, LiteLLM row).
    write_prompts(tmp_path / "p.jsonl", [(f"r{i}", f"refused prompt {i}") for i in range(20)])
    with FakeServer(limit_mode=fl.Headerless(rpm=0, hint=None)) as server:
        proc = run_aiq(
            "run", "p.jsonl", "--base-url", server.base_url, "--model", "m",
            "--concurrency", "4", "--max-outage", "4", cwd=tmp_path, timeout=60,
        )  # fmt: skip
        posts = [r for r in server.requests if r.method == "POST"]
    assert proc.returncode == 4, proc.stderr
    assert "answered every call with 429" in proc.stderr, proc.stderr
    assert "--max-outage" in proc.stderr
    # Rounds back off exponentially (1, 2, 4, 8 s caps, jittered): a few dozen calls at most,
    # where a pause of at most a second each time asks ~8 a second of 4 senders.
    assert len(posts) < 60, len(posts)
    counts = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)["counts"]
    assert counts["queued"] == 20 and counts.get("dead", 0) == 0
