"""Benchmark: one model's slow rate limit must not hold up another model's jobs.

A batch mixes two models, interleaved line by line: ``slow``, which aiq is told is limited
(``model_limits: slow: {rpm: …}``), and ``fast``, which is not. ``tests/fakeserver``'s
``FakeServer`` answers every request after a fixed latency (0.5 s: a real API's order) and
enforces nothing itself; aiq's own pacing is what is measured. ``aiq run`` runs as a
subprocess with ``PYTHONPATH`` set to this checkout's ``src/`` (run from a ``git worktree``
of another commit to compare).

Reported per run, from the server's log:

- **fast done**: when the last ``fast`` request arrived, seconds after the first request, next
  to the least time the senders allow for the fast jobs alone (jobs x latency / senders).
- **slow utilization**: the least time the slow model's limit allows for its requests, over
  the time they took (as bench/limits.py): 0.98 is the pace aiq keeps.
- **slow max/s**: the most slow requests in any one second (the limit per second is rpm/60).

    .venv/bin/python bench/mixed_models.py [--repeat 3] [--concurrency 32,auto]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakeserver import FakeServer  # noqa: E402

API_KEY = "sk-test"
LATENCY_S = 0.5
SLOW_RPM = 600
SLOW_JOBS = 200  # 20 s at 600/min
FAST_JOBS = 1600


def write_batch(workdir: Path) -> Path:
    """The two models' jobs interleaved, ``fast`` lines filling in after the slow ones end."""
    lines = []
    for i in range(max(SLOW_JOBS, FAST_JOBS)):
        for model, n in (("slow", SLOW_JOBS), ("fast", FAST_JOBS)):
            if i < n:
                lines.append({"custom_id": f"{model}{i}", "model": model, "prompt": f"{model} {i}"})
    path = workdir / "mixed.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (workdir / "aiq.yaml").write_text(f"model_limits:\n  slow: {{rpm: {SLOW_RPM}}}\n")
    return path


def run_once(concurrency: str, workdir: Path) -> dict[str, float]:
    batch = write_batch(workdir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIQ_", "OPENAI_"))}
    env.update({"OPENAI_API_KEY": API_KEY, "NO_COLOR": "1", "PYTHONPATH": str(ROOT / "src")})
    with FakeServer(latency_s=LATENCY_S, record=True) as server:
        cmd = [
            sys.executable, "-m", "aiq", "run", str(batch), "--base-url", server.base_url,
            "--concurrency", concurrency, "--quiet",
        ]  # fmt: skip
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        posts = [r for r in server.requests if r.method == "POST"]
    if done.returncode != 0:
        raise SystemExit(f"aiq run exited {done.returncode}: {done.stderr[-2000:]}")
    if len(posts) != SLOW_JOBS + FAST_JOBS:
        raise SystemExit(f"{len(posts)} requests for {SLOW_JOBS + FAST_JOBS} jobs")
    t0 = min(r.received for r in posts)
    fast = sorted(r.received - t0 for r in posts if r.body["model"] == "fast")
    slow = sorted(r.received - t0 for r in posts if r.body["model"] == "slow")
    least_slow = (len(slow) - 1) / (SLOW_RPM / 60)
    return {
        "fast_done_s": fast[-1],
        "slow_utilization": least_slow / (slow[-1] - slow[0]),
        "slow_max_per_s": max(sum(t - 1 < u <= t for u in slow) for t in slow),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", default="32,auto", help="comma-separated")
    args = parser.parse_args()
    print(
        f"{SLOW_JOBS} slow jobs (aiq told {SLOW_RPM}/min) and {FAST_JOBS} fast ones (no limit), "
        f"interleaved; server latency {LATENCY_S} s; python {sys.version.split()[0]}, "
        f"load average {os.getloadavg()}"
    )
    results: dict[str, list[dict[str, float]]] = {c: [] for c in args.concurrency.split(",")}
    for rep in range(args.repeat):
        for concurrency, runs in results.items():
            with tempfile.TemporaryDirectory(prefix="aiq-mixed-") as tmp:
                run = run_once(concurrency, Path(tmp))
            runs.append(run)
            print(f"  rep {rep + 1} --concurrency {concurrency}: {run}", file=sys.stderr)
    print(
        "\n| --concurrency | fast done, s (min-max) | fast alone, least s | slow utilization "
        "| slow max/s | wall s |\n|---|---:|---:|---:|---:|---:|"
    )
    for concurrency, runs in results.items():
        fast = [r["fast_done_s"] for r in runs]
        senders = int(concurrency) if concurrency.isdigit() else None
        least = f"{FAST_JOBS * LATENCY_S / senders:.1f}" if senders else "-"
        print(
            f"| {concurrency} | {statistics.median(fast):.1f} ({min(fast):.1f}-{max(fast):.1f}) "
            f"| {least} | {statistics.median(r['slow_utilization'] for r in runs):.3f} "
            f"| {max(r['slow_max_per_s'] for r in runs):.0f} "
            f"| {statistics.median(r['wall_s'] for r in runs):.1f} |"
        )


if __name__ == "__main__":
    main()
