"""What keeping the counts by state costs the worker's store cycle, and an add: triggers (as
aiq ships) against explicit updates against none (migration 0008_tallies; aiq.tallies).

Runs the store's side of a run alone, in process: a store of N jobs, then cycles of claim
(with the last batch's sends and outcomes written in the same transaction, as the worker
does) until every job is done; the figure is the process's CPU time a job, every thread
(the SQLite thread's too), steadier than wall time on a shared machine. Three variants
over the same work, interleaved:

  none      the triggers dropped: what the cycle cost before counts were kept
  triggers  as aiq ships (the update trigger runs on every claim and outcome; its WHEN
            skips the claims' statements)
  explicit  the triggers dropped; per batch of outcomes one statement folds their jobs out
            of the tallies before the write and one folds them back in after

Then the inserts of an add (5,000-row statements, as enqueue runs them), with the count
kept once a statement (as aiq does) or by an insert trigger.

    .venv/bin/python bench/tally_cost.py [--jobs 20000] [--batch 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from aiq import tallies  # noqa: E402
from aiq.bulk import jobs_sql  # noqa: E402
from aiq.database import _statements  # noqa: E402
from aiq.enqueue import add_lines  # noqa: E402
from aiq.inputs import Defaults, custom_id_hash, parse_line  # noqa: E402
from aiq.migrations import MIGRATIONS  # noqa: E402
from aiq.records import DONE, Outcome  # noqa: E402
from aiq.store import JobStore  # noqa: E402
from aiq.usage import Usage  # noqa: E402

_FIGURES = tallies._FIGURES
_SUMS = ", ".join(
    f"?1 * {f}"
    for f in (
        "count(*)", "count(tokens_in)", "count(cost_usd)", "coalesce(sum(cost_usd), 0)",
        "sum(timeouts)", *(f"coalesce(sum({c}), 0)" for c in _FIGURES[5:]),
    )
)  # fmt: skip


async def _fold(store: JobStore, sign: int, ids: list[int]) -> None:
    """Explicit updates: the jobs with these ids folded in (1) or out (-1) of the tallies."""
    await store._db.execute(
        f"INSERT INTO tallies (state, model, error_type, {', '.join(_FIGURES)}) "
        f"SELECT CASE state WHEN 1 THEN 0 ELSE state END, model, error_type, {_SUMS} "
        f"FROM jobs WHERE id IN ({', '.join('?' * len(ids))}) GROUP BY 1, 2, 3 "
        f"{tallies._UPSERT}",
        (sign, *ids),
    )


async def cycle(path: Path, jobs: int, batch: int, variant: str) -> float:
    lines = [
        parse_line(b'{"custom_id": "c%d", "prompt": "p%d"}' % (i, i), i + 1, Defaults(model="m"))
        for i in range(jobs)
    ]
    async with await JobStore.open(path) as store:
        source = await store.add_source("p.jsonl", out_path="o", dead_path="d")
        await add_lines(store, source, lines)
        if variant != "triggers":
            await store._db.execute("DROP TRIGGER jobs_tally_update")
        if variant == "explicit":
            write = store._write_outcomes

            async def explicit(outcomes: Sequence[Outcome]) -> None:
                ids = [o.job_id for o in outcomes]
                await _fold(store, -1, ids)
                await write(outcomes)
                await _fold(store, 1, ids)

            store._write_outcomes = explicit  # type: ignore[method-assign]
        usage = Usage(20, 30, 0)
        outcomes: list[Outcome] = []
        sent: list[int] = []
        started = time.process_time()  # every thread's: the SQLite thread's too
        while True:
            claimed = await store.claim(batch, now=1e12, record=outcomes, sent=sent)
            if not claimed and not outcomes:
                break
            sent = [j.id for j in claimed]
            outcomes = [
                Outcome(j.id, DONE, 1, started_at=1.0, finished_at=2.0, usage=usage, model="m",
                        cost_usd=1e-5, response=b"{}")
                for j in claimed
            ]  # fmt: skip
        elapsed = time.process_time() - started
        stats = await store.stats()
        assert variant == "none" or stats.counts["done"] == jobs, stats.counts
    return elapsed / jobs * 1e6


_INSERT_TRIGGER = (
    "CREATE TRIGGER jobs_tally_insert AFTER INSERT ON jobs BEGIN "
    f"INSERT INTO tallies (state, model, error_type, {', '.join(_FIGURES)}) "
    f"SELECT 0, NULL, NULL, 1, {', '.join(['0'] * (len(_FIGURES) - 1))} WHERE true "
    f"{tallies._UPSERT}; END"
)


def inserts(path: Path, rows: int, variant: str) -> float:
    """CPU µs a row of an add's job inserts, the count kept once a statement or a row."""
    db = sqlite3.connect(path, isolation_level=None)
    db.create_function("aiq_custom_id_hash", 1, custom_id_hash, deterministic=True)
    for _, sql in MIGRATIONS:
        for statement in _statements(sql):
            db.execute(statement)
    if variant == "trigger":
        db.execute(_INSERT_TRIGGER)
    per = 5_000
    started = time.process_time()
    db.execute("BEGIN")
    for b in range(rows // per):
        params: list[object] = [1.0]
        for i in range(b * per, (b + 1) * per):
            k64 = i * 7919 % (1 << 62)
            params += [k64, bytearray(32), "/v1/chat/completions", bytearray(200), 0]
        db.execute(jobs_sql(per), params)
        if variant == "statement":
            db.execute(
                f"INSERT INTO tallies (state, model, error_type, {', '.join(_FIGURES)}) "
                f"VALUES (0, NULL, NULL, ?, {', '.join(['0'] * (len(_FIGURES) - 1))}) "
                f"{tallies._UPSERT}",
                (per,),
            )
    db.execute("COMMIT")
    elapsed = time.process_time() - started
    db.close()
    return elapsed / rows * 1e6


def _show(title: str, results: dict[str, list[float]]) -> None:
    print(title)
    base = statistics.median(next(iter(results.values())))
    for variant, us in results.items():
        med = statistics.median(us)
        print(f"  {variant:9} median {med:6.1f}  ({', '.join(f'{u:.1f}' for u in us)})"
              f"  {med - base:+.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cycles: dict[str, list[float]] = {"none": [], "triggers": [], "explicit": []}
    adds: dict[str, list[float]] = {"statement": [], "trigger": []}
    with tempfile.TemporaryDirectory(prefix="aiq-tally-") as tmp:
        for rep in range(args.repeat):
            for variant in cycles:
                db = Path(tmp) / f"{variant}{rep}.db"
                cycles[variant].append(asyncio.run(cycle(db, args.jobs, args.batch, variant)))
            for variant in adds:
                adds[variant].append(
                    inserts(Path(tmp) / f"add-{variant}{rep}.db", 100_000, variant)
                )
    _show(f"store cycle, {args.jobs} jobs, claims of {args.batch}: CPU µs a job", cycles)
    _show("an add's job inserts, 100,000 rows: CPU µs a row", adds)


if __name__ == "__main__":
    main()
