"""A calendar minute's turn against LiteLLM's router, end to end: an ``aiq run`` subprocess
and the fake server's LiteLLMRouter (limit and ``remaining`` headers, no reset, N-1 a UTC
minute: tests/fakeserver/modes/providers.py).

The router's minute is the UTC minute of its clock, and a client can only find it from its
own wall clock (aiq.window_sync). So that a run crosses a turn a few seconds in, both
clocks are shifted alike: the fake's ``limit_clock``, and aiq's ``time.time`` by a
``sitecustomize`` on its path (the one thing here that is not real: a wall clock that turns
a minute on cue). At 200 a minute told ``--rpm 200``, 240 jobs: 199 at once, the 200th
refused, and the other 41 at the turn. Replies take 2 s and 429s milliseconds, so the first
request past the turn is let in long before its reply (aiq.pause_test's rule): the rest go
within a fraction of a second of it, where waiting for its reply took the whole latency.

(Sized for a loaded CI machine: the rule lets in only where a 429 comes back in under an
eighth of a reply's time, here 250 ms. One CI run, with 599 requests at once against a 1 s
reply and three test workers on two cores, waited the reply out: the burst's 429 was slow.)
"""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import pytest
from conftest import aiq_cmd, aiq_env, write_prompts
from fakeserver import FakeServer
from fakeserver import modes as fl

LATENCY_S = 2.0
# From the test's start to the minute's turn, on both shifted clocks: room for a loaded
# machine to start aiq and have the old minute's 199 back before it (9 s: the last came
# 0.42 s after the turn with the test run three at once beside two CPU burners).
LEAD_S = 12.0

SITECUSTOMIZE = """\
import os
import time

_offset = float(os.environ["TEST_WALL_OFFSET_S"])
_real = time.time
time.time = lambda: _real() + _offset
"""


@pytest.mark.slow
def test_the_minute_after_a_turn_goes_at_once_not_a_reply_later(tmp_path: Path) -> None:
    clock_dir = tmp_path / "clock"
    clock_dir.mkdir()
    (clock_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    write_prompts(tmp_path / "p.jsonl", [(f"p{i}", f"turn prompt {i}") for i in range(240)])
    now = time.time()
    offset_s = (math.floor(now / 60) + 1) * 60 - LEAD_S - now
    turn = time.monotonic() + LEAD_S  # the shifted minute's turn, on the monotonic clock
    server = FakeServer(
        limit_mode=fl.LiteLLMRouter(rpm=200),
        latency_s=LATENCY_S,
        limit_clock=lambda: time.time() + offset_s,
        record=True,
    )
    env = aiq_env(TEST_WALL_OFFSET_S=repr(offset_s), PYTHONPATH=str(clock_dir))
    with server:
        cmd = aiq_cmd("run", "p.jsonl", "--provider", "openai", "--model", "gpt-4o-mini",
                      "--base-url", server.base_url, "--rpm", "200", "--quiet")  # fmt: skip
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        posts = [r for r in server.requests if r.method == "POST"]
    assert proc.returncode == 0, proc.stderr
    before = [r for r in posts if r.received < turn]
    after = sorted(r.received for r in posts if r.received >= turn and r.status == 200)
    assert before, "the run began after the turn: the machine was too slow to test this"
    # (Every reply of the old minute back before the turn: one after it would show the new
    # minute's count and let the rest go itself.)
    assert max(r.monotonic for r in before) < turn, "the first minute's replies were late"
    assert sum(r.status == 200 for r in before) == 199  # the minute's count, at once
    assert len(after) == 41 and sum(r.status == 429 for r in posts) == 1
    # The first past the turn a hair after it; the rest long before its reply could be back.
    assert after[0] - turn < 0.5, after[0] - turn
    assert after[-1] - after[0] < LATENCY_S / 2, after[-1] - after[0]
