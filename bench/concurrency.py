"""Benchmark: does ``--concurrency auto`` reach a high tier's quota at seconds of latency, keep
a one-slot server at about one in flight, and cut hangs without waiting them out?

Each scenario starts ``tests/fakeserver``'s ``FakeServer`` in a thread of this process and
runs ``aiq run FILE --json`` against it as a subprocess (``PYTHONPATH`` = this checkout's
``src/``). Reported: efficiency (the least time the limit allows for the requests, plus one mean
latency, over the subprocess's wall time: **e2e**; over the server's first request to its last
reply, as bench/limit_modes.py measures: **run**; and of the sending phase alone, first request
to last at the server: **send**), the share of 429s, the most in flight (aiq's
``max_in_flight``), and aiq's CPU (user + system of the subprocess over its wall time) and peak
memory.

    .venv/bin/python bench/concurrency.py                      # every scenario
    .venv/bin/python bench/concurrency.py --scenarios high-tier
    .venv/bin/python bench/concurrency.py --src /tmp/base/src   # another checkout, for A/B
    .venv/bin/python bench/concurrency.py --scenarios hang --fault-seeds 0   # one draw

Which attempts hang is drawn by the fake from each prompt and its seed: one seed is one draw,
and a hang among a run's last sends (about one draw in two) costs it ~0.25 s of ~2.1, so the
hang row is read over ten seeds by default (``--fault-seeds``), with a line for them together.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakeserver import FakeServer, modes  # noqa: E402

API_KEY = "sk-test"


class SpreadServer(FakeServer):
    """A FakeServer whose latency is drawn for each request: uniform in mean ± spread."""

    def __init__(
        self, *, mean_s: float, spread_s: float, seed: int = 0, fault_seed: int = 0, **knobs: object
    ) -> None:
        self._mean_s, self._spread_s = mean_s, spread_s
        self._rng = random.Random(seed)
        super().__init__(seed=fault_seed, **knobs)  # (which prompts' attempts hang)

    @property
    def latency_s(self) -> float:  # read once per request by the handler
        return self._rng.uniform(self._mean_s - self._spread_s, self._mean_s + self._spread_s)

    @latency_s.setter
    def latency_s(self, _value: float) -> None:
        pass


@dataclass(frozen=True)
class Scenario:
    description: str
    jobs: int
    mean_s: float
    spread_s: float = 0.0
    rpm: int | None = None  # the server's limit, and what aiq is told with --rpm
    max_parallel: int | None = None
    aiq_flags: tuple[str, ...] = ()
    hang_rate: float = 0.0  # the share of calls the server never answers (for 30 s)
    per_second: bool = False  # the server enforces rpm per second (modes.PerSecond)
    learned: bool = False  # OpenAI's bucket (modes.OpenAIBucket), full at start; aiq not told
    seed: int = 0  # of the latencies drawn


SCENARIOS = {
    "high-tier": Scenario(
        "30,000 RPM, 3 s ± 1 s latency, aiq --rpm 30000", 12_000, 3.0, 1.0, rpm=30_000
    ),
    "long-latency": Scenario(
        "6,000 RPM, 20 s ± 5 s latency, aiq --rpm 6000", 3000, 20.0, 5.0, rpm=6000
    ),
    # The case: 1% of calls hang 30 s, replies in 50 ms, "about 3 s of work": at
    # 20,000 rpm enforced per second, 1,000 take 3 s, so what a hang costs is what shows.
    "hang": Scenario(
        "20,000 RPM per second, 50 ms, 1% of calls hang 30 s, --rpm 20000",
        1000,
        0.05,
        rpm=20_000,
        hang_rate=0.01,
        per_second=True,
    ),
    "hang-control": Scenario("as hang, no call hangs", 1000, 0.05, rpm=20_000, per_second=True),
    # Outputs of different lengths, all at once: the first replies are the fastest, and a
    # timeout learned from them alone cut half the batch (aiq.timeouts OUT_SHARE).
    "spread-burst": Scenario(
        "OpenAI bucket 10,000 RPM, 0.2-4 s latency, 300 at once, aiq told nothing",
        300,
        2.1,
        1.9,
        rpm=10_000,
        learned=True,
        seed=15,  # the first request, sent alone to read the limits, is answered fast
    ),
    "one-slot-auto": Scenario(
        "one slot (llama.cpp), 0.2 s, no limits, auto", 60, 0.2, max_parallel=1
    ),
    "one-slot-fixed-1": Scenario(
        "one slot (llama.cpp), 0.2 s, no limits, --concurrency 1",
        60,
        0.2,
        max_parallel=1,
        aiq_flags=("--concurrency", "1"),
    ),
}


def run(name: str, s: Scenario, src: Path = ROOT / "src", fault_seed: int = 0) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.jsonl"
        path.write_text(
            "".join(
                json.dumps({"custom_id": f"c{i}", "prompt": f"prompt number {i}"}) + "\n"
                for i in range(s.jobs)
            )
        )
        knobs: dict[str, object] = {"require_key": API_KEY, "record": True}
        if s.rpm and s.per_second:
            knobs["limit_mode"] = modes.PerSecond(rpm=s.rpm)
        elif s.rpm and s.learned:
            knobs["limit_mode"] = modes.OpenAIBucket(rpm=s.rpm)
        elif s.rpm:
            knobs["rpm"] = s.rpm
        if s.max_parallel:
            knobs["max_parallel"] = s.max_parallel
        if s.hang_rate:
            knobs.update(hang_rate=s.hang_rate, hang_s=30.0)
        with SpreadServer(
            mean_s=s.mean_s, spread_s=s.spread_s, seed=s.seed, fault_seed=fault_seed, **knobs
        ) as server:
            told = s.rpm and not s.learned
            flags = [*s.aiq_flags, *(("--rpm", str(s.rpm)) if told else ())]
            db = str(Path(tmp) / "aiq.db")
            cmd = [sys.executable, "-m", "aiq", "run", str(path), "--base-url", server.base_url,
                   "--model", "gpt-4o-mini", "--json", "--db", db, *flags]  # fmt: skip
            env = {**os.environ, "OPENAI_API_KEY": API_KEY, "PYTHONPATH": str(src)}
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.monotonic()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            wall_s = time.monotonic() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            requests = server.requests
    if proc.returncode != 0:
        raise SystemExit(f"{name}: aiq exited {proc.returncode}: {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rate = (s.rpm / 60) if s.rpm else (s.max_parallel or 1) / s.mean_s
    # A per-second server's bucket (a second's worth) may go at once; the rest at its pace.
    burst = rate if s.per_second else 0.0
    least_s = max(0.0, s.jobs - burst) / rate + s.mean_s
    refused = sum(1 for r in requests if r.status == 429)
    # The sending phase alone, on the server's clock (as bench/limits.py measures it): the
    # least time the pace allows from the first request to the last, over the time it took.
    arrived = sorted(r.received for r in requests if r.counted or r.admitted_at is not None)
    arrived = arrived or sorted(r.received for r in requests if r.method == "POST")
    send_s = arrived[-1] - arrived[0]
    least_send_s = max(0.0, len(arrived) - 1 - burst) / rate
    # A hung call's log entry is written when the server gives up on it, 30 s on.
    replied = [r.monotonic for r in requests if r.status == 200 and r.fault != "hang"]
    run_s = max(replied) - arrived[0]
    return {
        "scenario": name,
        **({"fault_seed": fault_seed} if s.hang_rate else {}),
        "wall_s": round(wall_s, 1),
        "least_s": round(least_s, 1),
        "efficiency": round(least_s / wall_s, 3),
        "run_s": round(run_s, 1),
        "run_efficiency": round(least_s / run_s, 3),
        "send_efficiency": round(least_send_s / send_s, 3) if send_s else None,
        "share_429": round(refused / max(1, len(requests)), 4),
        "hangs": sum(1 for r in requests if r.fault == "hang"),
        "timed_out": summary.get("timed_out"),
        "max_in_flight": summary["max_in_flight"],
        "held_by": summary["held_by"],
        "aiq_cpu": round(cpu_s / wall_s, 2),
        "aiq_peak_rss_mb": round(after.ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument(
        "--src", type=Path, default=ROOT / "src", help="aiq from another checkout's src/ (A/B)"
    )
    parser.add_argument(
        "--fault-seeds",
        type=int,
        nargs="*",
        default=list(range(10)),
        help="the fake's seeds for which attempts hang: one run of each hang scenario per seed",
    )
    args = parser.parse_args()
    for name in args.scenarios:
        s = SCENARIOS[name]
        runs = []
        for seed in args.fault_seeds if s.hang_rate else [0]:
            runs.append(run(name, s, args.src, seed))
            print(json.dumps(runs[-1]), flush=True)
        if len(runs) > 1:  # the draws together
            effs = [float(str(r["run_efficiency"])) for r in runs]
            print(json.dumps({
                "scenario": name, "fault_seeds": len(runs),
                "run_efficiency_median": round(statistics.median(effs), 3),
                "run_efficiency_mean": round(statistics.fmean(effs), 3),
                "run_efficiency_min": min(effs),
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
