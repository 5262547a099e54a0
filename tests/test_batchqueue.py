"""The store's side of --via batch (aiq.batchqueue), on real SQLite files: batches of one
endpoint and model, cut at the request and byte limits; jobs in an open batch left alone by
a crash recovery; a batch's results written once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiq.batch_files import LINE_OVERHEAD, custom_id, write_input
from aiq.config import Config
from aiq.records import DONE, Outcome
from aiq.runner import add_file
from aiq.store import JobStore, open_store


def _line(cid: str, model: str, url: str = "/v1/chat/completions") -> dict:
    if url == "/v1/embeddings":
        body: dict = {"model": model, "input": cid}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": cid}]}
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def _store_with(tmp_path: Path, lines: list[dict]) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    db = tmp_path / "aiq.db"
    asyncio.run(add_file(Config(db=db), path))
    return db


def test_batches_hold_one_endpoint_and_model_each_and_stop_at_the_limits(
    tmp_path: Path,
) -> None:
    lines = [_line(f"a{i}", "m1") for i in range(5)]
    lines += [_line(f"b{i}", "m2") for i in range(2)]
    lines += [_line(f"e{i}", "m1", "/v1/embeddings") for i in range(2)]
    db = _store_with(tmp_path, lines)

    async def plan() -> list[tuple[str, str | None, int]]:
        async with open_store(db) as store:
            out = []
            while (b := await store.plan_batch(
                "openai", now=1e12, max_requests=3, max_bytes=10**6, overhead=LINE_OVERHEAD
            )) is not None:  # fmt: skip
                out.append((b.endpoint, b.model, b.requests))
            assert (
                await store.plan_batch(
                    "openai", now=1e12, max_requests=3, max_bytes=10**6, overhead=LINE_OVERHEAD
                )
                is None
            )
            assert await store.in_batches() == len(lines)
            return out

    batches = asyncio.run(plan())
    assert sorted(batches) == sorted([
        ("/v1/chat/completions", "m1", 3), ("/v1/chat/completions", "m1", 2),
        ("/v1/chat/completions", "m2", 2), ("/v1/embeddings", "m1", 2),
    ])  # fmt: skip


def test_a_batch_stops_under_its_byte_limit(tmp_path: Path) -> None:
    db = _store_with(tmp_path, [_line(f"a{i}", "m") for i in range(10)])

    async def sizes() -> list[int]:
        async with open_store(db) as store:
            rows = [b async for b in store.batch_lines(0)]
            assert rows == []
            out = []
            while (b := await store.plan_batch(
                "openai", now=1e12, max_requests=100, max_bytes=3 * 200, overhead=LINE_OVERHEAD
            )) is not None:  # fmt: skip
                path = tmp_path / f"b{b.id}.jsonl"
                size = await write_input(store, b.id, path)
                assert size <= 3 * 200  # the file is under the limit it was planned for
                written = [json.loads(x) for x in path.read_text().splitlines()]
                ids = [j for j, _, _ in (await _lines(store, b.id))]
                assert [x["custom_id"] for x in written] == [custom_id(i) for i in ids]
                out.append(b.requests)
            return out

    planned = asyncio.run(sizes())
    assert sum(planned) == 10 and max(planned) < 10


async def _lines(store: JobStore, batch_id: int) -> list[tuple[int, str, bytes]]:
    return [row async for rows in store.batch_lines(batch_id) for row in rows]


def test_recovery_leaves_jobs_in_open_batches_and_a_result_is_written_once(
    tmp_path: Path,
) -> None:
    db = _store_with(tmp_path, [_line(f"a{i}", "m") for i in range(4)])

    async def work() -> None:
        async with open_store(db) as store:
            b = await store.plan_batch(
                "openai", now=1e12, max_requests=10, max_bytes=10**6, overhead=LINE_OVERHEAD
            )
            assert b is not None
            assert await store.recover_running(5) == 0  # a dead run's: the provider has them
            jobs = await store.batch_jobs(b.id)
            first, *rest = jobs
            done = Outcome(first, DONE, 1, started_at=1.0, finished_at=2.0, response=b"{}")
            await store.ingest(b.id, [done])
            assert list(await store.batch_jobs(b.id)) == rest  # ingested: out of the batch
            await store.close_batch(b.id, "expired", {"expired": rest})
            closed = await store.batch(b.id)
            assert closed is not None and closed.step == "ingested"
            assert closed.requeued == {"expired": 3}
            assert await store.requeued_total() == {"expired": 3}
            stats = await store.stats()
            assert stats.counts["done"] == 1 and stats.counts["queued"] == 3
            assert stats.in_batches == 0 and stats.counts["running"] == 0

    asyncio.run(work())
