"""`--via batch` at scale: lines/s to plan and upload, lines/s to ingest, peak RSS.

    .venv/bin/python bench/batch_bench.py [--lines 200000] [--provider anthropic]

In a fresh temporary directory: starts the fake server (tests/fakeserver, its Files and
Batches API with zero processing time) as its own process, writes that many prompt lines,
then times three aiq processes, each measured alone (peak RSS from wait4's rusage):
``aiq add`` (not batch work, for scale), ``aiq run --via batch --detach`` (plan, write and
upload the input files, create the batches: 50,000 lines each; with ``--provider
anthropic``, Message Batches of 100,000 requests, created with their requests and no
upload) and, once the fake has
finished them (``PROCESSING_S``, not timed), ``aiq resume`` (poll, download the output
files, ingest every line, export the results).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Long enough that the detached run finds every batch still open (it takes one look at each),
# so the collecting run does all of the reading; waited out between the two.
PROCESSING_S = 3.0
LOG = Path("/tmp/batch_bench_collect.log")


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of one process run to completion."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    out = proc.stdout.read().decode() if proc.stdout else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out}\n{err[-3000:]}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--provider", choices=["openai", "anthropic"], default="openai")
    args = parser.parse_args()
    n = args.lines
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fake = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "fakeserver"), "--port", "0",
             "--batch-processing", str(PROCESSING_S)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert fake.stdout is not None
            port = int(fake.stdout.readline().split()[1])
            with (work / "p.jsonl").open("w") as f:
                for i in range(n):
                    f.write(json.dumps({"custom_id": f"q{i}", "prompt": f"Summarise {i}."}) + "\n")
            env = {**os.environ, "NO_COLOR": "1", "OPENAI_API_KEY": "sk-bench",
                   "ANTHROPIC_API_KEY": "sk-ant-bench"}  # fmt: skip
            aiq = [sys.executable, "-m", "aiq"]
            model = "claude-haiku-4-5" if args.provider == "anthropic" else "gpt-4o-mini"
            url = f"http://127.0.0.1:{port}" + ("" if args.provider == "anthropic" else "/v1")
            base = ["--provider", args.provider, "--base-url", url, "--model", model]
            rows = {
                "add": timed([*aiq, "add", "p.jsonl", "--model", model], work, env),
                "submit": timed(
                    [*aiq, "run", "p.jsonl", "--via", "batch", "--detach", "--quiet", *base],
                    work,
                    env,
                ),
            }
            time.sleep(PROCESSING_S + 1)  # every batch done at the provider: not timed
            rows["collect"] = timed([*aiq, "resume", "--quiet", "--log-file", str(LOG)], work, env)
            results = sum(1 for _ in (work / "p.results.jsonl").open())
        finally:
            fake.terminate()
            fake.wait()
    print(f"{n:,} lines, {results:,} results")
    for name, (seconds, rss_mb) in rows.items():
        print(f"{name:8} {seconds:6.2f} s  {n / seconds:9,.0f} lines/s  peak RSS {rss_mb:5.0f} MB")


if __name__ == "__main__":
    main()
