"""Benchmark: what one claim costs the store, as the dispatcher makes it.

A store of N queued jobs (added by ``add_file``, not timed), then cycles as a run makes them:
each writes the last claim's outcomes (done; not timed: a run writes them in the claim's
transaction, and they cost the same whatever the claim) and claims ``--limit`` more. Timed:
the ``claim`` call, its own transaction and commit, in µs per claim and per job claimed.
Three stores:

  plain      every job at priority 0 (the common case)
  priorities a tenth of the lines at priority 10, spread through the file
  deferred   plain, with ``--deferred`` jobs put back by a rate limiter, not due for an hour
             (their index entries sit between the due and the untried ones)

    .venv/bin/python bench/claim_cost.py [--jobs 100000] [--limit 512] [--cycles 100]
    .venv/bin/python bench/claim_cost.py --src /tmp/aiq-main/src   # another checkout's aiq

With ``--src``, the aiq under that directory is imported: the same script measures before
and after a change (``git archive main | tar -x -C /tmp/aiq-main``). A store of the old
schema has no priorities: its ``priorities`` store is ``plain`` with the field ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def _cycles(db: Path, path: Path, args: argparse.Namespace, deferred: int) -> list[float]:
    from aiq.enqueue import add_file
    from aiq.inputs import Defaults
    from aiq.records import DONE, Outcome
    from aiq.requestfile import read_requests
    from aiq.store import JobStore

    async with await JobStore.open(db) as store:
        source = await store.add_source(str(path), out_path="o", dead_path="d")
        await add_file(store, source, read_requests(path, Defaults(model="m")))
        now = time.time()
        if deferred:
            jobs = await store.claim(deferred, now=now)
            await store.record([], deferred=[(now + 3600, j.id) for j in jobs])
        times, outcomes = [], list[Outcome]()
        for _ in range(args.cycles):
            await store.record(outcomes)  # apart: its cost is the outcomes', not the claim's
            start = time.perf_counter()
            jobs = await store.claim(args.limit, now=now)
            times.append(time.perf_counter() - start)
            outcomes = [Outcome(j.id, DONE, 1, now, finished_at=now) for j in jobs]
        return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--limit", type=int, default=512)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--deferred", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--src", type=Path, default=ROOT / "src")
    args = parser.parse_args()
    sys.path.insert(0, str(args.src))
    import aiq

    print(f"aiq from {Path(aiq.__file__).parent}; {args.jobs:,} jobs, claims of {args.limit}")
    with tempfile.TemporaryDirectory() as tmp:
        plain, mixed = Path(tmp) / "plain.jsonl", Path(tmp) / "mixed.jsonl"
        with plain.open("w") as p, mixed.open("w") as m:
            for i in range(args.jobs):
                line = {"custom_id": f"c{i}", "prompt": f"question {i}"}
                p.write(json.dumps(line) + "\n")
                m.write(json.dumps({**line, "priority": 10} if i % 10 == 0 else line) + "\n")
        for name, path, deferred in [
            ("plain", plain, 0), ("priorities", mixed, 0), ("deferred", plain, args.deferred)
        ]:  # fmt: skip
            medians = []
            for r in range(args.repeat):
                db = Path(tmp) / f"{name}-{r}.db"
                times = asyncio.run(_cycles(db, path, args, deferred))
                medians.append(statistics.median(times))
            cycle = statistics.median(medians)
            print(
                f"{name:>10}: {cycle * 1e6:8.0f} µs a claim, {cycle / args.limit * 1e6:5.2f} µs "
                f"a job (medians of {args.cycles} cycles, median of {args.repeat} stores: "
                + ", ".join(f"{m * 1e6:.0f}" for m in medians)
                + ")"
            )


if __name__ == "__main__":
    main()
