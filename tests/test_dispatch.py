"""The dispatcher driven as a second engine would drive it (aiq.dispatch): no Worker, no
provider, a real SQLite store. The engine takes claimed jobs, says it sent them, and hands
back outcomes or puts jobs off; the store ends up holding exactly that."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson

from aiq.breaker import Breakers
from aiq.contract import StateName
from aiq.dispatch import Dispatcher
from aiq.enqueue import add_file
from aiq.inputs import Defaults
from aiq.records import DONE, Job, Outcome
from aiq.requestfile import read_requests
from aiq.store import JobStore
from aiq.worker import Progress

JOBS = 40

Engine = Callable[[Dispatcher, Counter[int]], Coroutine[Any, Any, None]]


def done(job: Job) -> Outcome:
    now = time.time()
    return Outcome(job.id, DONE, job.attempts + 1, started_at=now, finished_at=now)


def drive(tmp_path: Path, engine: Engine) -> tuple[dict[StateName, int], Counter[int], Progress]:
    """Enqueue JOBS prompts, run the dispatcher with ``engine`` beside it to the end; the
    store's counts, how often each job was handed out, and the progress."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"prompt": f"p{i}"}) + b"\n" for i in range(JOBS)))

    async def scenario() -> tuple[dict[StateName, int], Counter[int], Progress]:
        store = await JobStore.open(tmp_path / "aiq.db")
        try:
            source = await store.add_source(
                str(path), out_path=str(tmp_path / "out"), dead_path=str(tmp_path / "dead")
            )
            await add_file(store, source, read_requests(path, Defaults(model="m")))
            progress = Progress(total=JOBS)
            dispatch = Dispatcher(store, progress, concurrency=4, breakers=Breakers())
            taken: Counter[int] = Counter()
            sending = asyncio.create_task(engine(dispatch, taken))
            await asyncio.wait_for(dispatch.run(), 10)
            dispatch.end(1)  # the engine's wait for a next job ends
            await asyncio.wait_for(sending, 10)
            await dispatch.close()
            return (await store.stats()).counts, taken, progress
        finally:
            await store.close()

    return asyncio.run(scenario())


def test_each_job_is_handed_out_once_and_recorded_done(tmp_path: Path) -> None:
    async def engine(dispatch: Dispatcher, taken: Counter[int]) -> None:
        while (job := await dispatch.next_job()) is not None:
            taken[job.id] += 1
            dispatch.sent(job.id)
            dispatch.finished(done(job))

    counts, taken, progress = drive(tmp_path, engine)
    assert counts == {"queued": 0, "running": 0, "done": JOBS, "dead": 0}
    assert len(taken) == JOBS and set(taken.values()) == {1}
    assert (progress.done, progress.done_now) == (JOBS, JOBS)


def test_a_deferred_job_comes_back_when_due_with_its_attempts(tmp_path: Path) -> None:
    attempts: dict[int, list[int]] = {}

    async def engine(dispatch: Dispatcher, taken: Counter[int]) -> None:
        while (job := await dispatch.next_job()) is not None:
            taken[job.id] += 1
            attempts.setdefault(job.id, []).append(job.attempts)
            if taken[job.id] == 1 and job.id % 2:  # odd ones: not now, in 20 ms
                dispatch.defer(job.id, time.time() + 0.02)
                continue
            dispatch.sent(job.id)
            dispatch.finished(done(job))

    counts, taken, _ = drive(tmp_path, engine)
    assert counts["done"] == JOBS
    odd = [i for i in taken if i % 2]
    assert odd and all(taken[i] == 2 and attempts[i] == [0, 0] for i in odd)
    assert all(taken[i] == 1 for i in taken if not i % 2)


def test_stop_ends_claiming_and_close_releases_what_was_never_sent(tmp_path: Path) -> None:
    async def engine(dispatch: Dispatcher, taken: Counter[int]) -> None:
        while (job := await dispatch.next_job()) is not None:
            if dispatch.stopping:
                continue  # claimed, never sent: close() puts it back
            taken[job.id] += 1
            dispatch.sent(job.id)
            dispatch.finished(done(job))
            if len(taken) == 10:
                dispatch.stop()

    counts, taken, progress = drive(tmp_path, engine)
    assert counts == {"queued": JOBS - 10, "running": 0, "done": 10, "dead": 0}
    assert len(taken) == progress.done_now == 10
