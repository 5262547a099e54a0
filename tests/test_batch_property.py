"""Every line of a batch run ends exactly once, whatever the provider does to each: a
property over random mixes of answered, rejected, dropped and expired lines, through the
library (aiq.run_batch) against the fake's Batches API on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from conftest import API_KEY
from fakeserver import FakeServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiq import Config, run_batch

pytestmark = pytest.mark.slow  # a server and a run per example

_FATES = st.sampled_from(["ok", "ok", "ok", "FAIL_PERMANENT", "DROP_LINE"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fates=st.lists(_FATES, min_size=1, max_size=30), expire=st.none() | st.integers(1, 8))
def test_every_line_ends_exactly_once(fates: list[str], expire: int | None) -> None:
    prompts = {
        f"c{i}": (f"{fate} line {i}" if fate != "ok" else f"line {i}")
        for i, fate in enumerate(fates)
    }
    with tempfile.TemporaryDirectory() as tmp, FakeServer(require_key=API_KEY) as server:
        server.batches.expire_after_lines = expire
        path = Path(tmp) / "in.jsonl"
        path.write_text("".join(json.dumps({"custom_id": c, "prompt": p}) + "\n"
                                for c, p in prompts.items()))  # fmt: skip
        config = Config(
            db=Path(tmp) / "aiq.db", base_url=server.base_url, api_key=API_KEY, model="m",
            via="batch", max_attempts=2, max_runtime_s=30.0,  # a loop fails, not hangs
            backoff_base_s=0.01, backoff_cap_s=0.05,  # a dropped line retried at once
        )  # fmt: skip
        summary = asyncio.run(run_batch(config, input_path=path))
        results = [json.loads(x) for x in (Path(tmp) / "in.results.jsonl").read_text().splitlines()]
        dead = [json.loads(x) for x in (Path(tmp) / "in.dead.jsonl").read_text().splitlines()]
        submitted = Counter(server.batches.submitted)
        answered = server.batches.created()
    ended = Counter([r["custom_id"] for r in results] + [d["custom_id"] for d in dead])
    assert ended == Counter(prompts.keys())  # each exactly once, done or dead
    assert summary.stats.remaining == 0 and summary.stats.in_batches == 0
    for r in results:
        assert r["response"]["body"]["choices"][0]["message"]["content"] == server.reply_text(
            prompts[r["custom_id"]]
        )
    for d in dead:
        fate = fates[int(d["custom_id"][1:])]
        assert fate in ("FAIL_PERMANENT", "DROP_LINE")
        assert d["error"]["type"] == (
            "invalid_request" if fate == "FAIL_PERMANENT" else "bad_response"
        )
    # A line answered in a batch (done or dead) was in no batch after it; a dropped one was
    # sent once per attempt; only an expired line goes again otherwise.
    for c, p in prompts.items():
        fate = fates[int(c[1:])]
        if fate == "DROP_LINE":
            assert submitted[p] == 2
        elif expire is None:
            assert submitted[p] == 1
    assert answered >= 1


_ANTHROPIC_FATES = st.sampled_from(
    ["ok", "ok", "ok", "FAIL_PERMANENT", "DROP_LINE", "BATCH_API_ERROR", "N3"]
)
_DEAD_AS = {"FAIL_PERMANENT": "invalid_request", "DROP_LINE": "bad_response",
            "BATCH_API_ERROR": "server", "N3": "invalid_request"}  # fmt: skip


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fates=st.lists(_ANTHROPIC_FATES, min_size=1, max_size=30),
    expire=st.none() | st.integers(1, 8),
)
def test_every_line_ends_exactly_once_through_message_batches(
    fates: list[str], expire: int | None
) -> None:
    """The same through Anthropic's Message Batches: results in any order, errored lines by
    the online table, lines with no Messages translation dead before they are sent."""
    prompts = {f"c/{i}": f"{fate} line {i}" for i, fate in enumerate(fates)}
    with tempfile.TemporaryDirectory() as tmp, FakeServer(require_key=API_KEY) as server:
        server.message_batches.expire_after_lines = expire
        path = Path(tmp) / "in.jsonl"
        path.write_text("".join(
            json.dumps({"custom_id": c, "prompt": p, **({"n": 3} if "N3" in p else {})}) + "\n"
            for c, p in prompts.items()
        ))  # fmt: skip
        config = Config(
            db=Path(tmp) / "aiq.db", provider="anthropic", base_url=server.base_url,
            api_key=API_KEY, model="claude-x", via="batch", max_attempts=2,
            max_runtime_s=30.0, backoff_base_s=0.01, backoff_cap_s=0.05,  # retried at once
        )  # fmt: skip
        summary = asyncio.run(run_batch(config, input_path=path))
        results = [json.loads(x) for x in (Path(tmp) / "in.results.jsonl").read_text().splitlines()]
        dead = [json.loads(x) for x in (Path(tmp) / "in.dead.jsonl").read_text().splitlines()]
        submitted = Counter(server.message_batches.submitted)
    ended = Counter([r["custom_id"] for r in results] + [d["custom_id"] for d in dead])
    assert ended == Counter(prompts.keys())  # each exactly once, done or dead
    assert summary.stats.remaining == 0 and summary.stats.in_batches == 0
    for r in results:
        assert fates[int(r["custom_id"][2:])] == "ok"
        text = r["response"]["body"]["content"][0]["text"]
        assert text == server.reply_text(prompts[r["custom_id"]])
    for d in dead:
        fate = fates[int(d["custom_id"][2:])]
        assert d["error"]["type"] == _DEAD_AS[fate], d
    for c, p in prompts.items():
        fate = fates[int(c[2:])]
        if fate == "N3":
            assert submitted[p] == 0  # refused before anything was sent
        elif fate == "DROP_LINE" or (fate == "BATCH_API_ERROR" and expire is None):
            assert submitted[p] == 2  # once per attempt (an expired one goes again besides)
        elif expire is None:
            assert submitted[p] == 1
