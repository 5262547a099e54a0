"""Benchmark: how much of a rate limit does ``aiq run`` use, and how many of its calls get 429?

For each scenario it starts ``tests/fakeserver.py``'s ``FakeServer`` in a thread of this process
(with its request log on, which the server's command line turns off) enforcing the limits, runs
``aiq run FILE --base-url …`` against it as a subprocess, and reads the server's log afterwards.

Definitions (per run):

- **utilization**: the least time the limit allows for what was sent, over the time it took.
  Requests bound: the server admitted A requests, the first at t0 and the last at t1 (its own
  clock, at arrival); at the sustained rate ``rpm / 60`` per second, A requests need at least
  ``(A - 1) / (rpm / 60)`` seconds between the first and the last. utilization = that / (t1 -
  t0). Tokens bound: the same with the tokens the server charged (prompt + max_tokens), all but
  the last request's, over ``tpm / 60`` per second. With both limits set, the binding one (the
  higher figure) is reported. It measures the sending phase only: interpreter start, enqueue
  and export are outside it (``e2e`` gives the whole subprocess against ``A / rate``).
  A server enforcing per minute would also take a whole minute's quota at once; the issue's
  "least time the quota allows, N / RPM minutes" is the sustained rate, and so is this.
- **429 share**: the POSTs answered 429 over all POSTs the server saw.

    .venv/bin/python bench/limits.py                  # every scenario, 3 repetitions
    .venv/bin/python bench/limits.py --scenarios rpm-second --repeat 1
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # fakeserver.py imports fake_anthropic as a sibling

from fakeserver import FakeServer, LoggedRequest  # noqa: E402

API_KEY = "sk-test"
UTILIZATION_TARGET = 0.97
SHARE_429_TARGET = 0.005


@dataclass(frozen=True)
class Scenario:
    """A server's limits, what aiq is told of them, and a batch sized to last ~40 s."""

    description: str
    jobs: int
    rpm: int | None = None
    tpm: int | None = None
    window_s: float = 60.0
    aiq_flags: tuple[str, ...] = ()
    prompt_chars: int = 40  # ~10 tokens; the TPM scenarios use long prompts
    max_tokens: int | None = None
    latency_s: float = 0.5


# 2,000 tokens a request (1,000 prompt + 1,000 max_tokens): 6M TPM is 50 requests/s.
_LONG: dict[str, Any] = {"prompt_chars": 4000, "max_tokens": 1000}
SCENARIOS: dict[str, Scenario] = {
    "rpm-minute": Scenario(
        "6,000 RPM per minute, aiq --rpm 6000", 4000, rpm=6000, aiq_flags=("--rpm", "6000")
    ),
    "rpm-second": Scenario(
        "6,000 RPM enforced per second (100/s), aiq --rpm 6000",
        4000,
        rpm=6000,
        window_s=1.0,
        aiq_flags=("--rpm", "6000"),
    ),
    "rpm-learned": Scenario(
        "6,000 RPM enforced per second, aiq told nothing (limits from headers)",
        4000,
        rpm=6000,
        window_s=1.0,
    ),
    "tpm-minute": Scenario(
        "6M TPM per minute, 2,000-token requests, aiq --tpm 6000000",
        2000,
        tpm=6_000_000,
        aiq_flags=("--tpm", "6000000"),
        **_LONG,
    ),
    "tpm-second": Scenario(
        "6M TPM enforced per second (100k/s), 2,000-token requests, aiq --tpm 6000000",
        2000,
        tpm=6_000_000,
        window_s=1.0,
        aiq_flags=("--tpm", "6000000"),
        **_LONG,
    ),
}


@dataclass
class Run:
    """What one run measured."""

    utilization: float
    e2e: float  # least time for the admitted requests over the whole subprocess's wall time
    share_429: float
    posts: int
    n_429: int
    sending_s: float
    wall_s: float
    first_429s: list[float] = field(default_factory=list)  # s after the first request


def write_prompts(path: Path, scenario: Scenario) -> None:
    # Distinct prompts of the scenario's length: a job per line, none deduplicated away.
    with path.open("w") as f:
        for i in range(scenario.jobs):
            head = f"Item {i}: "
            line: dict[str, Any] = {
                "custom_id": f"q{i}",
                "prompt": head + "x" * (scenario.prompt_chars - len(head)),
            }
            if scenario.max_tokens is not None:
                line["max_tokens"] = scenario.max_tokens
            f.write(json.dumps(line) + "\n")


def least_time_s(admitted: list[LoggedRequest], scenario: Scenario) -> float:
    """The least time the binding limit allows between the first and last admitted request."""
    times = []
    if scenario.rpm is not None:
        times.append((len(admitted) - 1) / (scenario.rpm / 60))
    if scenario.tpm is not None:
        times.append(sum(r.tokens for r in admitted[:-1]) / (scenario.tpm / 60))
    return max(times)


def run_once(scenario: Scenario, workdir: Path) -> Run:
    prompts = workdir / "prompts.jsonl"
    write_prompts(prompts, scenario)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIQ_", "OPENAI_"))}
    # The aiq of this checkout, not whatever is installed: run from a clean worktree
    # (`git worktree add`) to measure a commit while others edit the main tree.
    env.update({"OPENAI_API_KEY": API_KEY, "NO_COLOR": "1", "PYTHONPATH": str(ROOT / "src")})
    server = FakeServer(
        rpm=scenario.rpm,
        tpm=scenario.tpm,
        limit_window_s=scenario.window_s,
        latency_s=scenario.latency_s,
        record=True,
    )
    with server:
        cmd = [
            sys.executable, "-m", "aiq", "run", str(prompts), "--db", str(workdir / "aiq.db"),
            "--base-url", server.base_url, "--model", "gpt-4o-mini", "--quiet", "--json",
            *scenario.aiq_flags,
        ]  # fmt: skip
        start = time.monotonic()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - start
        log = server.requests
    if done.returncode != 0:
        raise SystemExit(f"aiq run exited {done.returncode}: {done.stderr[-2000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    if summary["done_now"] != scenario.jobs:
        raise SystemExit(f"aiq run finished {summary['done_now']} of {scenario.jobs} jobs")
    posts = [r for r in log if r.method == "POST"]
    admitted = sorted((r for r in posts if r.counted), key=lambda r: r.received)
    rejected = [r for r in posts if r.status == 429]
    t0, t1 = admitted[0].received, admitted[-1].received
    least = least_time_s(admitted, scenario)
    per_request = least / (len(admitted) - 1)
    return Run(
        utilization=least / (t1 - t0),
        e2e=(least + per_request) / wall,  # A requests at the allowed rate, start-up and all
        share_429=len(rejected) / len(posts),
        posts=len(posts),
        n_429=len(rejected),
        sending_s=t1 - t0,
        wall_s=wall,
        first_429s=sorted(round(r.received - t0, 2) for r in rejected)[:8],
    )


def table(results: dict[str, list[Run]]) -> str:
    lines = [
        "| scenario | jobs | utilization median (min-max) | e2e | 429s / calls (median, max) "
        "| sending s | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        util = [r.utilization for r in runs]
        share = [r.share_429 for r in runs]
        lines.append(
            f"| {name} | {SCENARIOS[name].jobs:,} | {statistics.median(util):.3f} "
            f"({min(util):.3f}-{max(util):.3f}) | {statistics.median(r.e2e for r in runs):.3f} "
            f"| {statistics.median(share):.2%}, {max(share):.2%} "
            f"| {statistics.median(r.sending_s for r in runs):.1f} "
            f"| {statistics.median(r.wall_s for r in runs):.1f} |"
        )
    return "\n".join(lines)


def verdict(results: dict[str, list[Run]]) -> str:
    lines = []
    for name, runs in results.items():
        util = statistics.median(r.utilization for r in runs)
        share = max(r.share_429 for r in runs)
        ok_u = "met" if util >= UTILIZATION_TARGET else f"MISSED by {UTILIZATION_TARGET - util:.3f}"
        ok_s = "met" if share <= SHARE_429_TARGET else "MISSED"
        lines.append(
            f"{name}: utilization {util:.3f} (target >= {UTILIZATION_TARGET}: {ok_u}); "
            f"429s at most {share:.2%} (target <= {SHARE_429_TARGET:.1%}: {ok_s})"
        )
    return "\n".join(lines)


def checkout() -> str:
    """The commit of ROOT, and whether src/ differs from it (then the figures are not its)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "src"]).returncode != 0
    return f"{head.stdout.strip() or '?'}{' with uncommitted changes in src/' if dirty else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="jobs x this (a quick look)")
    args = parser.parse_args()
    chosen = args.scenarios.split(",")
    for name in chosen:
        SCENARIOS[name] = replace(SCENARIOS[name], jobs=round(SCENARIOS[name].jobs * args.scale))
    print(
        f"aiq at {checkout()}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"{args.repeat} repetitions, load average {os.getloadavg()}"
    )
    for name in chosen:
        print(f"  {name}: {SCENARIOS[name].description}")
    results: dict[str, list[Run]] = {name: [] for name in chosen}
    for rep in range(args.repeat):
        for name in chosen:  # interleaved, so drift on a shared machine hits all alike
            with tempfile.TemporaryDirectory(prefix="aiq-limits-") as tmp:
                run = run_once(SCENARIOS[name], Path(tmp))
            results[name].append(run)
            print(
                f"  rep {rep + 1} {name}: utilization {run.utilization:.3f}, e2e {run.e2e:.3f}, "
                f"{run.n_429} 429s of {run.posts} calls, sending {run.sending_s:.1f} s, "
                f"wall {run.wall_s:.1f} s, first 429s at {run.first_429s}",
                file=sys.stderr,
                flush=True,
            )
    print(f"\nload average after: {os.getloadavg()}")
    print(table(results))
    print()
    print(verdict(results))


if __name__ == "__main__":
    main()
