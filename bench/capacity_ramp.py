"""Benchmark: how long ``--concurrency auto`` takes to find a server's capacity when no limit is
known, on the simulated server of tests/test_capacity.py (a fake clock: the figures are the
same on any machine, under any load).

Each scenario is a server with a number of slots, each serving one request at a time for a
drawn latency (gauss, mean ± a third, at least 0.1 s), a queue in front of them, and a batch of
jobs; a client keeps :class:`aiq.capacity.CapacityProbe`'s limit in flight. Reported over
``--seeds`` draws: the time the batch took against the least the slots allow (jobs / slots x
mean latency), the worst of them, and the most in flight.

    .venv/bin/python bench/capacity_ramp.py               # --seeds 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from test_capacity import simulate  # noqa: E402

SCENARIOS = (  # slots, mean latency s, jobs
    (1, 0.8, 300),
    (4, 0.2, 400),
    (64, 1.0, 5_000),
    (256, 5.0, 20_000),
    (1_000, 3.0, 60_000),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    print("| slots | latency | jobs | least s | took s (median) | worst "
          "| efficiency (median, worst) | most in flight |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for slots, mean, jobs in SCENARIOS:
        took, most = [], 0
        for seed in range(args.seeds):
            run, _ = simulate(
                slots, lambda rng, m=mean: max(0.1, rng.gauss(m, m / 3)), jobs, seed=seed
            )
            took.append(run.took_s)
            most = max(most, run.most_in_flight)
        least = jobs / slots * mean
        median = statistics.median(took)
        print(
            f"| {slots:,} | {mean} s ± {mean / 3:.2g} | {jobs:,} | {least:.0f} | {median:.0f} "
            f"| {max(took):.0f} | {least / median:.2f}, {least / max(took):.2f} | {most:,} |"
        )


if __name__ == "__main__":
    main()
