"""Cost per tier (issue 15, item 9): each done job's tier recorded with its cost (migration
0011_tiers), and `status` and the run summary saying what each tier cost. End to end against
the fake server's online, flex and batch replies (OpenAI's Batch API and Anthropic's Message
Batches), every figure held against the jobs' own costs and prices worked by hand; a store
from before the migration upgraded in place, its jobs' tier unknown."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from pathlib import Path

import pytest
from conftest import API_KEY, aiq_env, run_aiq, undo_tiers, write_prompts
from fakeserver import FakeServer
from test_cost import CONFIG, _cost
from test_tallies import assert_kept_equal_scan

from aiq.contract import StateName, Tier
from aiq.database import StoreOutdated
from aiq.enqueue import add_file
from aiq.inputs import Defaults
from aiq.records import DEAD, DONE, Outcome
from aiq.report import run_summary_json, run_summary_lines, status_lines
from aiq.requestfile import read_requests
from aiq.run_records import Progress, RunSummary
from aiq.stats import Stats, TierUsage
from aiq.stops import TRUNCATED
from aiq.store import JobStore
from aiq.usage import Usage

# A job's own tier and cost, by custom_id.
_OWN = (
    "SELECT i.custom_id, j.tier, j.cost_usd FROM items i JOIN jobs j ON j.k64 = i.job_k64 "
    "WHERE j.state = 2"
)


def _own(db: Path) -> dict[str, tuple[str | None, float | None]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(_OWN).fetchall()
    conn.close()
    return {c: (tier, cost) for c, tier, cost in rows}


def _status(tmp_path: Path, *, env: dict[str, str] | None = None) -> dict:
    proc = run_aiq("status", "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _by_tier(own: dict[str, tuple[str | None, float | None]]) -> dict[str, dict]:
    """The jobs' own figures summed per tier, as status's ``tiers``."""
    tiers: dict[str, dict] = {}
    for tier, cost in own.values():
        t = tiers.setdefault(tier or "unknown", {"done": 0, "cost_usd": 0.0, "unpriced": 0})
        t["done"] += 1
        t["cost_usd"] += cost or 0.0
        t["unpriced"] += cost is None
    return tiers


def _close(got: dict[str, dict], want: dict[str, dict]) -> None:
    assert got.keys() == want.keys()
    for tier, t in got.items():
        assert (t["done"], t["unpriced"]) == (want[tier]["done"], want[tier]["unpriced"]), tier
        assert math.isclose(t["cost_usd"], want[tier]["cost_usd"], rel_tol=1e-9), tier


@pytest.mark.slow
def test_cost_per_tier_online_flex_and_batch_is_the_jobs_own(
    tmp_path: Path, server: FakeServer
) -> None:
    # Three nights into one store: online, at the flex tier, by batch; each a file's new lines.
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    nights = {
        "online": [(f"o{i}", f"online question {i}") for i in range(4)],
        "flex": [(f"f{i}", f"flex question number {i}") for i in range(3)],
        "batch": [(f"b{i}", f"a batch question, this one {i}") for i in range(5)],
    }
    summaries = {}
    for via, prompts in nights.items():
        write_prompts(tmp_path / "in.jsonl", prompts, mode="a")
        args = ("--via", via, "--base-url", server.base_url, "--model", "m", "--json")
        proc = run_aiq("run", "in.jsonl", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        summaries[via] = json.loads(proc.stdout)
    own = _own(tmp_path / ".aiq" / "aiq.db")
    # Each job's tier is the way it went, its cost its prompt's priced by hand at that tier.
    for via, prompts in nights.items():
        share = 1.0 if via == "online" else 0.5
        for custom_id, prompt in prompts:
            tier, cost = own[custom_id]
            assert tier == via and cost is not None
            assert math.isclose(cost, _cost(prompt) * share, rel_tol=1e-9), custom_id
        # Each run's summary says what it did at its one tier.
        _close(summaries[via]["tiers"], _by_tier({c: own[c] for c, _ in prompts}))
    status = _status(tmp_path)
    _close(status["tiers"], _by_tier(own))
    assert list(status["tiers"]) == ["online", "flex", "batch"]
    assert math.isclose(
        sum(t["cost_usd"] for t in status["tiers"].values()), status["cost_usd"], rel_tol=1e-9
    )
    text = run_aiq("status", cwd=tmp_path).stdout
    (line,) = [x for x in text.splitlines() if x.startswith("  by tier: ")]
    assert line == (
        "  by tier: "
        f"online ${status['tiers']['online']['cost_usd']:.6f} (4 done), "
        f"flex ${status['tiers']['flex']['cost_usd']:.6f} (3 done), "
        f"batch ${status['tiers']['batch']['cost_usd']:.6f} (5 done)"
    )
    # A run at one tier says nothing more than its cost line.
    again = run_aiq("run", "in.jsonl", "--base-url", server.base_url, cwd=tmp_path)
    assert again.returncode == 0 and "by tier" not in again.stdout


@pytest.mark.slow
def test_anthropic_online_and_message_batches_cost_per_tier(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "aiq.yaml").write_text("prices:\n  claude-x: {input: 1000, output: 2000}\n")
    env = aiq_env(ANTHROPIC_API_KEY=API_KEY)
    args = ("--provider", "anthropic", "--base-url", server.base_url, "--model", "claude-x")
    write_prompts(tmp_path / "in.jsonl", [(f"o{i}", f"online {i}") for i in range(3)])
    assert run_aiq("run", "in.jsonl", *args, cwd=tmp_path, env=env).returncode == 0
    write_prompts(tmp_path / "in.jsonl", [(f"b{i}", f"batch {i}") for i in range(4)], mode="a")
    proc = run_aiq("run", "in.jsonl", *args, "--via", "batch", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    own = _own(tmp_path / ".aiq" / "aiq.db")
    assert {c: t for c, (t, _) in own.items()} == {
        **{f"o{i}": "online" for i in range(3)},
        **{f"b{i}": "batch" for i in range(4)},
    }
    status = _status(tmp_path, env=env)
    _close(status["tiers"], _by_tier(own))
    assert status["tiers"]["batch"]["cost_usd"] > 0
    assert "  by tier: online $" in run_aiq("status", cwd=tmp_path, env=env).stdout


def _lines(path: Path, prefix: str, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"{prefix}{i}"}) + "\n" for i in range(n)))
    return path


async def _do(store: JobStore, path: Path, tier: Tier | None, *, cost: float) -> None:
    """Add ``path``'s lines and record every job claimed done at ``tier`` (and one dead, cut
    off, billed), each at ``cost``."""
    source = await store.add_source(str(path), out_path=str(path) + ".o", dead_path="d")
    await add_file(store, source, read_requests(path, Defaults(model="m")))
    jobs = await store.claim(100, now=1e9)
    done = [
        Outcome(j.id, DONE, 1, started_at=1.0, finished_at=2.0, usage=Usage(3, 4, 0),
                model="m", cost_usd=cost, tier=tier, response=b"{}")
        for j in jobs[1:]
    ]  # fmt: skip
    cut = Outcome(jobs[0].id, DEAD, 1, started_at=1.0, finished_at=2.0, usage=Usage(3, 4, 0),
                  model="m", cost_usd=cost, tier=tier, error_type=TRUNCATED,
                  response=b"{}")  # fmt: skip
    await store.record([*done, cut])


def test_a_store_from_before_tiers_is_upgraded_in_place_its_jobs_tier_unknown(
    tmp_path: Path,
) -> None:
    db = tmp_path / "aiq.db"

    async def before() -> None:
        async with await JobStore.open(db) as store:
            await _do(store, _lines(tmp_path / "a.jsonl", "a", 5), "batch", cost=0.25)

    asyncio.run(before())
    with sqlite3.connect(db) as conn:  # as aiq at 0010_batches left it
        undo_tiers(conn)
        assert "tier" not in [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
    conn.close()

    async def after() -> tuple[list[TierUsage], list[TierUsage]]:
        with pytest.raises(StoreOutdated, match="store needs upgrading"):
            await JobStore.open(db, readonly=True)  # status's open: it writes nothing
        async with await JobStore.open(db) as store:  # a writing command's: upgrades
            upgraded = (await store.stats()).tiers
            await _do(store, _lines(tmp_path / "b.jsonl", "b", 3), "online", cost=0.5)
            return upgraded, (await store.stats()).tiers

    upgraded, then = asyncio.run(after())
    # The four done (and the dead one's billed reply) at a tier no longer known.
    assert upgraded == [TierUsage("unknown", 4, 1.25, 0)]
    assert then == [TierUsage("online", 2, 1.5, 0), TierUsage("unknown", 4, 1.25, 0)]
    with sqlite3.connect(db) as conn:
        assert_kept_equal_scan(conn)  # the tallies, tier and all, as a scan of the jobs
        applied = [r[0] for r in conn.execute("SELECT name FROM migrations ORDER BY name")]
    conn.close()
    assert applied[-1] == "0011_tiers"


@pytest.mark.slow
def test_status_on_a_store_at_the_previous_version_then_upgraded(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "aiq.yaml").write_text(CONFIG)
    write_prompts(tmp_path / "in.jsonl", [(f"o{i}", f"old question {i}") for i in range(4)])
    args = ("--base-url", server.base_url, "--model", "m")
    assert run_aiq("run", "in.jsonl", *args, cwd=tmp_path).returncode == 0
    before = _status(tmp_path)
    db = tmp_path / ".aiq" / "aiq.db"
    with sqlite3.connect(db) as conn:
        undo_tiers(conn)
    conn.close()
    old = run_aiq("status", cwd=tmp_path)
    assert old.returncode != 0 and "store needs upgrading; run any writing aiq command" in (
        old.stderr
    )
    assert run_aiq("add", "in.jsonl", "--model", "m", cwd=tmp_path).returncode == 0  # upgrades
    upgraded = _status(tmp_path)
    assert upgraded["tiers"] == {"unknown": before["tiers"]["online"]}
    assert upgraded["cost_usd"] == before["cost_usd"]
    assert "by tier" not in run_aiq("status", cwd=tmp_path).stdout  # one tier: no line
    write_prompts(
        tmp_path / "in.jsonl", [(f"n{i}", f"new question {i}") for i in range(2)], mode="a"
    )
    assert run_aiq("run", "in.jsonl", *args, cwd=tmp_path).returncode == 0
    now = _status(tmp_path)
    _close(now["tiers"], _by_tier(_own(db)))
    assert list(now["tiers"]) == ["online", "unknown"] and now["tiers"]["online"]["done"] == 2
    text = run_aiq("status", cwd=tmp_path).stdout
    assert "(4 done, before aiq recorded tiers)" in text and "  by tier: online $" in text


def test_the_summary_says_each_tier_of_a_run_that_used_more_than_one() -> None:
    batch, online = Progress(), Progress()
    for _ in range(5):
        batch.billed("batch", 0.001)
        batch.done_now += 1
    online.billed("online", 0.004)
    online.billed("online", None)  # no price: counted, of unknown cost
    online.billed("online", 0.002, done=False)  # dead, cut off: billed, not done
    online.done_now += 2
    online.absorb(batch)  # --via auto: its batches, then online
    assert online.done_now == 7
    tiers = online.tier_usage()
    assert [(t.tier, t.done, t.unpriced) for t in tiers] == [("online", 2, 1), ("batch", 5, 0)]
    assert [t.cost_usd for t in tiers] == [pytest.approx(0.006), pytest.approx(0.005)]
    stats = _stats(online.tier_usage())
    summary = RunSummary(added=None, progress=online, stats=stats)
    lines = run_summary_lines(summary)
    assert (
        "  by tier: online $0.006000 (2 done, 1 of unknown cost), batch $0.005000 (5 done)" in lines
    )
    assert run_summary_json(summary)["tiers"] == {
        "online": {"done": 2, "cost_usd": pytest.approx(0.006), "unpriced": 1},
        "batch": {"done": 5, "cost_usd": pytest.approx(0.005), "unpriced": 0},
    }
    assert "  by tier: online $0.006000 (2 done" in "\n".join(status_lines(stats, now=0.0))
    one = Progress()
    one.billed("flex", None)
    assert not any("by tier" in x for x in run_summary_lines(RunSummary(
        added=None, progress=one, stats=_stats(one.tier_usage())
    )))  # fmt: skip
    assert run_summary_json(RunSummary(added=None, progress=one, stats=_stats([])))["tiers"] == {
        "flex": {"done": 1, "cost_usd": None, "unpriced": 1}
    }


def _stats(tiers: list[TierUsage]) -> Stats:
    counts: dict[StateName, int] = {
        "queued": 0, "running": 0, "done": sum(t.done for t in tiers), "dead": 0
    }  # fmt: skip
    return Stats(
        total=counts["done"], counts=counts, done_recent=0, tokens_in=0, tokens_out=0,
        oldest_queued_s=None, top_errors=[], tiers=tiers,
    )  # fmt: skip
