"""--via auto's watch and its order of things (aiq.auto_run), in process over a real store:
what remains is the queue and the open batches' unfinished lines; the switch is recorded
before the cancel, and a run for the same deadline goes on online."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiq.auto_run import SWITCHED_META, DeadlineWatch, run_auto
from aiq.batch_files import LINE_OVERHEAD
from aiq.config import Config
from aiq.run_records import BatchRun, Progress, RunSummary
from aiq.runner import add_file
from aiq.store import JobStore, open_store

NOW = 1_800_000_000.0


def _store_with(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "in.jsonl"
    lines = [{"custom_id": f"c{i}", "prompt": f"q {i}"} for i in range(n)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    db = tmp_path / "aiq.db"
    asyncio.run(add_file(Config(db=db, model="m"), path))
    return db


async def _plan(store: JobStore, requests: int, completed: int) -> None:
    batch = await store.plan_batch(
        "openai", now=NOW, max_requests=requests, max_bytes=10**6, overhead=LINE_OVERHEAD
    )
    assert batch is not None
    await store.save_step(batch.id, "created", provider_batch_id="b1", counts={
        "total": requests, "completed": completed, "failed": 0})  # fmt: skip


def test_the_watch_counts_the_queue_and_what_open_batches_have_not_done(tmp_path: Path) -> None:
    db = _store_with(tmp_path, 10)
    notes: list[str] = []
    clock = [NOW]

    async def go() -> tuple[float, float, float]:
        async with open_store(db) as store:
            await _plan(store, 4, 2)  # 6 queued + 2 of 4 not done: 8 left
            config = Config(db=db, model="m", rpm=60)
            watch = DeadlineWatch(store, config, NOW + 100, notes.append, wall=lambda: clock[0])
            first = await watch()  # 8 s online, 10 s with the margin, 10 s allowance
            again = await watch()
            clock[0] = NOW + 81  # 19 s left: under the 20 s it needs
            return first, again, await watch()

    first, again, last = asyncio.run(go())
    assert first == again == 80.0 and last == 0.0
    assert len(notes) == 2  # the plan once, then the switch
    assert "8 left would take 8s online at 60/min: batch first" in notes[0]
    assert notes[1].endswith("cancelling 1 open batch, finishing online")


def _summary(batch: BatchRun | None = None) -> RunSummary:
    return RunSummary(added=None, progress=Progress(), stats=None, batch=batch)  # type: ignore[arg-type]


def test_the_switch_is_recorded_then_the_batches_cancelled_then_online(tmp_path: Path) -> None:
    db = _store_with(tmp_path, 3)
    calls: list[str] = []
    deadline = NOW + 3600

    async def go() -> tuple[list[str], str | None]:
        async with open_store(db) as store:
            await _plan(store, 3, 0)

            async def by_batch(config: Config, **kw: Any) -> tuple[RunSummary, None]:
                assert config.via == "batch"
                switched = await store.meta(SWITCHED_META)
                if kw.get("cancel"):
                    calls.append(f"cancel (switch recorded: {switched is not None})")
                    await store.close_batch(1, "cancelled", {"cancelled": [1, 2, 3]})
                    return _summary(BatchRun(collected=[1])), None
                calls.append("batch")
                return _summary(BatchRun(submitted=[1], switched_online=True)), None

            async def online(config: Config) -> tuple[RunSummary, None]:
                calls.append(f"online via {config.via}")
                return _summary(), None

            config = Config(db=db, model="m", via="auto", deadline=deadline)
            summary, _ = await run_auto(
                store, config, by_batch=by_batch, online=online, note=calls.append,
                wall=lambda: NOW,
            )  # fmt: skip
            assert summary.batch is not None and summary.batch.collected == [1]
            assert summary.batch.submitted == [1] and summary.batch.switched_online
            # the next run for the same deadline: online at once, no batch
            await run_auto(
                store, config, by_batch=by_batch, online=online, note=calls.append,
                wall=lambda: NOW + 60,
            )  # fmt: skip
            # a passed deadline: by batch, said once
            await run_auto(
                store, config, by_batch=by_batch, online=online, note=calls.append,
                wall=lambda: deadline + 1,
            )  # fmt: skip
            return calls, await store.meta(SWITCHED_META)

    calls, recorded = asyncio.run(go())
    assert recorded == repr(deadline)
    assert calls[:3] == ["batch", "cancel (switch recorded: True)", "online via online"]
    assert calls[3].endswith("online, as this store switched for it")
    assert calls[4:] == ["online via online", calls[5], "batch"]
    assert "has passed, so by batch" in calls[5]
