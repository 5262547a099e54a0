"""`aiq export` time and memory as the results grow: peak RSS must not grow with them.

    .venv/bin/python bench/export_bench.py [--results 50000,200000,600000]

For each size, in a fresh temporary directory: writes that many prompt lines, runs them to
done with `aiq run FILE --provider simulated` (no latency, no faults; not timed), then runs
the export in a fresh process and reports its seconds and peak RSS (VmHWM). The export orders
every result by finishing time, reply bodies and all, so how SQLite sorts decides its memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "provider: simulated\nsimulated_latency_s: 0\nsimulated_error_rate: 0\n"


def child(db: str) -> None:
    """One export, in this process; prints seconds and peak RSS as JSON."""
    sys.path.insert(0, str(ROOT / "src"))
    from aiq.config import Config
    from aiq.store_commands import export_outputs

    started = time.perf_counter()
    exports = asyncio.run(export_outputs(Config(db=Path(db))))
    seconds = time.perf_counter() - started
    with open("/proc/self/status") as f:
        rss_kb = next(int(row.split()[1]) for row in f if row.startswith("VmHWM:"))
    print(json.dumps({"seconds": seconds, "rss_mb": rss_kb / 1024, "results": exports[0].results}))


def measure(workdir: Path, n: int) -> dict[str, float]:
    prompts = workdir / "p.jsonl"
    with prompts.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"q{i}", "prompt": f"Summarise item {i}."}) + "\n")
    (workdir / "aiq.yaml").write_text(CONFIG)
    env = {**os.environ, "NO_COLOR": "1"}
    aiq = [sys.executable, "-m", "aiq"]
    cmd = [*aiq, "run", "p.jsonl", "--concurrency", "64", "--quiet"]
    run = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"aiq run failed: {run.stderr[-2000:]}")
    cmd = [sys.executable, __file__, "--child", str(workdir / ".aiq" / "aiq.db")]
    return json.loads(subprocess.run(cmd, cwd=workdir, check=True, capture_output=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="50000,200000,600000", help="comma-separated")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    print("| results | export seconds | µs per result | peak RSS |\n|---:|---:|---:|---:|")
    for n in (int(x) for x in args.results.split(",")):
        with tempfile.TemporaryDirectory(prefix="aiq-export-bench-") as tmp:
            r = measure(Path(tmp), n)
        assert r["results"] == n, r
        us = r["seconds"] / n * 1e6
        print(f"| {n:,} | {r['seconds']:.2f} | {us:.1f} | {r['rss_mb']:.0f} MB |", flush=True)


if __name__ == "__main__":
    main()
