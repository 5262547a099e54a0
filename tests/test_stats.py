"""JobStore.stats, one scan grouped three ways, against a plain query for each figure; and the
requests in flight against what the test sent."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.contract import JobError
from aiq.enqueue import add_file
from aiq.inputs import Defaults
from aiq.records import DEAD, DONE, QUEUED, STATE_NAMES, Outcome
from aiq.requestfile import read_requests
from aiq.stats import Stats
from aiq.store import JobStore
from aiq.usage import Usage

NOW = 2_000_000.0
MODELS = ["a", "b", None]
ERRORS: list[JobError] = [
    "server",
    "timeout",
    "rate_limit",
    "invalid_request",
    "auth",
    "bad_response",
]


async def _plain(store: JobStore, now: float, since: float | None) -> dict[str, Any]:
    """Each figure by its own query, the obvious way. The rate is of the last minute, or of
    the time since the run began sending when that is shorter (but at least a second)."""
    window = 60.0 if since is None else max(1.0, min(60.0, now - since))

    async def rows(sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await store._db.execute_fetchall(sql, params)]

    counts = dict.fromkeys(STATE_NAMES, 0)
    for state, n in await rows("SELECT state, count(*) FROM jobs GROUP BY state"):
        counts[STATE_NAMES[state]] = n
    ((recent, tin, tout),) = await rows(
        "SELECT count(CASE WHEN finished_at > ? AND state = ? THEN 1 END), "
        "coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0) FROM jobs",
        now - window,
        DONE,
    )
    ((oldest,),) = await rows("SELECT min(created_at) FROM jobs WHERE state = ?", QUEUED)
    errors = await rows(
        "SELECT error_type, count(*) AS n FROM jobs WHERE error_type IS NOT NULL "
        "AND state != ? GROUP BY error_type ORDER BY n DESC, error_type LIMIT 5",
        DONE,
    )
    models = await rows(
        "SELECT model, count(*), coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0), "
        "sum(cost_usd), count(*) - count(cost_usd), count(*) - count(tokens_in), "
        "coalesce(sum(tokens_cached), 0), coalesce(sum(tokens_cache_write), 0), "
        "coalesce(sum(tokens_cache_read), 0), coalesce(sum(tokens_reasoning), 0) "
        "FROM jobs WHERE state = ? GROUP BY model ORDER BY model",
        DONE,
    )
    return {
        "counts": counts,
        "recent": recent,
        "window": window,
        "tokens": (tin, tout),
        "oldest": None if oldest is None else round(max(0.0, now - oldest), 1),
        "errors": errors,
        "models": models,
    }


def _figures(s: Stats) -> dict[str, Any]:
    return {
        "counts": s.counts,
        "recent": s.done_recent,
        "window": s.rate_window_s,
        "in_flight": s.in_flight,
        "tokens": (s.tokens_in, s.tokens_out),
        "oldest": s.oldest_queued_s,
        "errors": s.top_errors,
        "models": [
            (
                m.model,
                m.done,
                m.tokens_in,
                m.tokens_out,
                m.cost_usd,
                m.unpriced,
                m.unusable,
                m.kinds.cached,
                m.kinds.cache_write,
                m.kinds.cache_read,
                m.kinds.reasoning,
            )
            for m in s.models
        ],
    }


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 60),
    since=st.none() | st.floats(NOW - 120, NOW + 1),  # a clock a little off too
)
def test_stats_agree_with_a_plain_query_for_each_figure(
    tmp_path_factory: Any, seed: int, n: int, since: float | None
) -> None:
    rng = random.Random(seed)
    tmp = tmp_path_factory.mktemp("stats")
    path = tmp / "p.jsonl"
    lines = []
    for i in range(n):
        line: dict[str, Any] = {"custom_id": f"q{i}", "prompt": f"p{i}"}
        if (model := rng.choice(MODELS)) is not None:
            line["model"] = model
        lines.append(orjson.dumps(line) + b"\n")
    path.write_bytes(b"".join(lines))

    def outcome(job_id: int) -> Outcome | None:
        kind = rng.choice(["done", "done", "dead", "retry", "running", "queued"])
        started = NOW - rng.uniform(0, 200)
        if kind == "done":
            cost = rng.choice([None, rng.uniform(0, 0.01)])
            parts = [rng.randint(0, 10) for _ in range(4)]
            usage = rng.choice(
                [
                    None,
                    Usage(
                        sum(parts[:3]) + rng.randint(0, 50),
                        parts[3] + rng.randint(0, 50),
                        cached=parts[0],
                        cache_write=parts[1],
                        cache_write_1h=parts[2],
                        reasoning=parts[3],
                    ),
                ]
            )  # None: unusable
            cost = None if usage is None else cost
            return Outcome(job_id, DONE, 1, started_at=started, finished_at=started + 1,
                           usage=usage, model=rng.choice(MODELS), cost_usd=cost,
                           response=b"{}")  # fmt: skip
        if kind in ("dead", "retry"):
            dead = kind == "dead"
            return Outcome(job_id, DEAD if dead else QUEUED, 2, started_at=started,
                           finished_at=started + 1 if dead else None,
                           next_at=0.0 if dead else NOW + rng.choice([-5, 5]),
                           error_type=rng.choice(ERRORS), error_message="x")  # fmt: skip
        return None  # left running or queued as claimed

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with await JobStore.open(tmp / "aiq.db") as store:
            source = await store.add_source(str(path), out_path="o", dead_path="d")
            await add_file(store, source, read_requests(path, Defaults(model="m")))
            jobs = await store.claim(n, now=NOW)
            sent = {j.id for j in jobs if rng.random() < 0.5}  # requests gone out
            await store.record([], sent=sorted(sent))
            outcomes = [o for j in jobs if (o := outcome(j.id)) is not None]
            await store.record(outcomes)
            recorded = {o.job_id for o in outcomes}
            back = [j for j in jobs if rng.random() < 0.3 and j.id not in recorded]
            await store.release(back)  # some running ones released
            # Claimed again (released ones, retries due): not in flight until sent again.
            again = await store.claim(rng.randint(0, n), now=NOW)
            resent = {j.id for j in again if rng.random() < 0.5}
            await store.record([], sent=sorted(resent))
            flying = len(sent - recorded - {j.id for j in back}) + len(resent)
            got = _figures(await store.stats(now=NOW, since=since))
            return got, {**await _plain(store, NOW, since), "in_flight": flying}

    got, want = asyncio.run(scenario())
    assert got["counts"] == want["counts"]
    assert got["recent"] == want["recent"]
    assert got["window"] == want["window"]
    assert got["in_flight"] == want["in_flight"] <= got["counts"]["running"]
    assert got["tokens"] == want["tokens"]
    assert got["oldest"] == want["oldest"]
    assert got["errors"] == want["errors"]
    assert len(got["models"]) == len(want["models"])
    for g, w in zip(got["models"], want["models"], strict=True):
        assert g[:4] == w[:4] and g[5:] == w[5:]
        assert (g[4] is None) == (w[4] is None)
        if g[4] is not None:
            assert abs(g[4] - w[4]) < 1e-12
    assert sum(got["counts"].values()) == n
