"""`aiq add` throughput and memory: a million-line prompt file, added, re-added, grown, edited.

    .venv/bin/python bench/add_bench.py [--lines 1000000] [--repeat 3]

Phases, each in a fresh Python process on the same store (so one phase's memory never counts
against the next, and each reports its own peak RSS):

1. first add      the file into an empty store
2. re-add         the same file again (nothing new)
3. append 10,000  10,000 lines appended, then added (the nightly-cron case)
4. edit line 1    the first line changed, then added: the stored prefix no longer matches,
                  so the whole file is read and looked up again

A phase times JobStore.open + add_source + enqueue(read_requests(...)) + close, as
`aiq add` does, without interpreter start-up. Lines/s is lines in the file over that time;
peak RSS is the phase process's VmHWM. The disks are synced before each phase.
Targets (the issue): first add >= 100,000 lines/s with peak RSS < 200 MB; re-add at least as
fast. Other processes on the machine skew the figures: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("first add", "re-add", "append 10,000", "edit line 1")
APPEND = 10_000
TARGET_LINES_S = 100_000
TARGET_RSS_MB = 200


def prompt_line(i: int) -> bytes:
    obj = {"custom_id": f"req-{i}", "prompt": f"Summarise item number {i} in one sentence, please."}
    return json.dumps(obj).encode() + b"\n"


def generate(path: Path, start: int, count: int, mode: str = "wb") -> None:
    with path.open(mode) as f:
        for lo in range(start, start + count, 10_000):
            f.write(b"".join(prompt_line(i) for i in range(lo, min(lo + 10_000, start + count))))


def edit_first_line(path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    with path.open("rb") as src, tmp.open("wb") as dst:
        dst.write(src.readline().replace(b"item number 0 ", b"item number zero "))
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    tmp.replace(path)


def child(db: str, path: str) -> None:
    """One phase, in this process: add ``path`` to the store at ``db``, print a JSON report."""
    from aiq.enqueue import add_file
    from aiq.inputs import Defaults
    from aiq.requestfile import read_requests
    from aiq.store import JobStore

    async def add() -> dict[str, int]:
        store = await JobStore.open(db)
        try:
            source = await store.add_source(path, out_path=path + ".out", dead_path=path + ".dead")
            c = await add_file(store, source, read_requests(path, Defaults(model="m")))
        finally:
            await store.close()
        return {"new": c.new, "known": c.known, "changed": c.changed, "invalid": c.invalid}

    started = time.perf_counter()
    counts = asyncio.run(add())
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "rss_mb": peak_rss_mb(), **counts}))


def peak_rss_mb() -> float:
    """This process's peak RSS. Not getrusage's ru_maxrss: Linux carries that across exec, so
    a child would report its parent's peak if that was higher."""
    with open("/proc/self/status") as f:
        for row in f:
            if row.startswith("VmHWM:"):
                return int(row.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: KiB or B


def run_phase(db: Path, path: Path) -> dict[str, float]:
    os.sync()  # no writeback of the previous phase (or of the new file) competing with this one
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(db), str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def run_all(workdir: Path, lines: int) -> dict[str, dict[str, float]]:
    """The four phases on a fresh store and file; each result gains "lines" and "lines_s"."""
    path, db = workdir / "prompts.jsonl", workdir / "aiq.db"
    for leftover in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        leftover.unlink(missing_ok=True)
    generate(path, 0, lines)
    results: dict[str, dict[str, float]] = {}
    total = lines
    for phase in PHASES:
        if phase == "append 10,000":
            generate(path, lines, APPEND, mode="ab")
            total += APPEND
        elif phase == "edit line 1":
            edit_first_line(path)
        r = run_phase(db, path)
        r["lines"] = total
        r["lines_s"] = total / r["seconds"]
        results[phase] = r
    return results


def report(runs: list[dict[str, dict[str, float]]]) -> None:
    print(f"{'phase':<15}{'lines':>10}{'seconds':>9}{'lines/s':>11}{'peak RSS':>10}   counts")
    for phase in PHASES:
        rs = [run[phase] for run in runs]
        med = sorted(rs, key=lambda r: r["seconds"])[len(rs) // 2]
        spread = ""
        if len(rs) > 1:
            lo, hi = min(r["lines_s"] for r in rs), max(r["lines_s"] for r in rs)
            spread = f"   (runs: {lo:,.0f}-{hi:,.0f} lines/s)"
        print(
            f"{phase:<15}{med['lines']:>10,.0f}{med['seconds']:>9.2f}{med['lines_s']:>11,.0f}"
            f"{max(r['rss_mb'] for r in rs):>7.0f} MB   new {med['new']:.0f}, known "
            f"{med['known']:.0f}, changed {med['changed']:.0f}, invalid {med['invalid']:.0f}"
            f"{spread}"
        )
    first = statistics.median(run["first add"]["lines_s"] for run in runs)
    readd = statistics.median(run["re-add"]["lines_s"] for run in runs)
    rss = max(r["rss_mb"] for run in runs for r in run.values())
    print(
        f"\ntargets: first add >= {TARGET_LINES_S:,} lines/s: {first:,.0f} "
        f"{'ok' if first >= TARGET_LINES_S else 'MISSED'}; peak RSS < {TARGET_RSS_MB} MB: "
        f"{rss:.0f} {'ok' if rss < TARGET_RSS_MB else 'MISSED'}; re-add at least as fast: "
        f"{'ok' if readd >= first else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1, help="runs; the median is shown")
    parser.add_argument("--dir", type=Path, help="work here instead of a temporary directory")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print(
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, {args.lines:,} lines"
    )
    runs = []
    with tempfile.TemporaryDirectory(prefix="aiq-add-bench-", dir=args.dir) as tmp:
        for _ in range(args.repeat):
            runs.append(run_all(Path(tmp), args.lines))
    report(runs)


if __name__ == "__main__":
    main()
