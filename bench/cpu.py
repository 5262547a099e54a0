"""Benchmark: is aiq's own process the bottleneck at 500 requests/s (issue 12, item 6)?

30,000 requests a minute with ~1,500 in flight (3 s latency), 2 KB prompts and 2 KB replies.
The fake server (``tests/fakeserver``) runs in a process of its own, so its CPU is not
counted: a ``PerSecond`` limit mode at 30,000 rpm (a bucket of 500 refilled at 500/s, OpenAI's
``x-ratelimit-*`` headers saying 30000), every reply's content padded to ``--reply-bytes``.
``aiq run FILE`` runs as a subprocess on this checkout's ``src/``, told ``--rpm 30000`` or
told nothing (``--learned``: the limit comes from the headers).

aiq's CPU share is its process's CPU seconds (user + system, read from ``/proc/PID/stat``
every 50 ms) over the wall seconds of the sending phase: from the server's first request to
its last; and in its steady state, from two latencies after the first request (connections
open, the size settled) to the last. The whole run's figure (start-up, enqueue and export
included, from ``getrusage``) is reported beside them, and CPU µs per request, which moves
less with how busy the machine is.

    .venv/bin/python bench/cpu.py                         # told --rpm 30000, 12,000 jobs
    .venv/bin/python bench/cpu.py --learned
    .venv/bin/python bench/cpu.py --profile py-spy.txt   # sample aiq with py-spy (raw stacks)
    .venv/bin/python bench/cpu.py --profile aiq.prof     # or cProfile (.prof; slows aiq ~2x)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakeserver import (  # noqa: E402
    FakeServer,
    _Exchange,
    modes,
)

API_KEY = "sk-test"
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


class PaddedServer(FakeServer):
    """A FakeServer whose chat replies carry ``reply_bytes`` of content, and which keeps only
    what this benchmark reads: arrival times of counted requests and a count per status."""

    def __init__(self, *, reply_bytes: int, **knobs: Any) -> None:
        self._reply_bytes = reply_bytes
        self.arrivals: list[float] = []
        self.statuses: dict[int, int] = {}
        super().__init__(**knobs)

    def _build(self, path: str, body: Any, prompt: str, cost: Any = None) -> dict:
        payload = super()._build(path, body, prompt, cost)
        message = payload["choices"][0]["message"]
        text = message["content"]
        message["content"] = (text + " " + "lorem ipsum " * (self._reply_bytes // 12))[
            : self._reply_bytes
        ]
        return payload

    def _note(self, ex: _Exchange, status: int) -> int | None:
        if ex.counted:
            self.arrivals.append(ex.received)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        return None


def serve(args: argparse.Namespace) -> None:
    """The server process: print ``READY <port>``, serve until stdin closes, print stats."""
    rpm = None if args.server_mode == "headerless" else args.rpm  # headerless: no limit at all
    mode = modes.build(args.server_mode, rpm=rpm)
    with PaddedServer(
        reply_bytes=args.reply_bytes, latency_s=args.latency, limit_mode=mode, record=False
    ) as server:
        print(f"READY {server.port}", flush=True)
        sys.stdin.read()
        arrived = sorted(server.arrivals)
        stats = {
            "first": arrived[0] if arrived else None,
            "last": arrived[-1] if arrived else None,
            "counted": len(arrived),
            "statuses": server.statuses,
            "max_in_flight": server.max_in_flight,
        }
    print(json.dumps(stats), flush=True)


def _cpu_s(pid: int) -> tuple[float, float] | None:
    """User + system CPU seconds of process ``pid`` so far, and of its main thread alone
    (None once it is gone). The rest is aiq's SQLite thread, the parser thread of enqueue."""

    def ticks(stat: Path) -> int:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)

    try:
        return ticks(Path(f"/proc/{pid}/stat")) * _TICK_S, ticks(
            Path(f"/proc/{pid}/task/{pid}/stat")
        ) * _TICK_S
    except (FileNotFoundError, ProcessLookupError):
        return None


def _cpu_at(samples: list[tuple[float, float, float]], at: float) -> tuple[float, float]:
    """The CPU seconds (process, main thread) at monotonic time ``at``, interpolated."""
    before = max((s for s in samples if s[0] <= at), default=samples[0])
    after = min((s for s in samples if s[0] >= at), default=samples[-1])
    if after[0] == before[0]:
        return before[1], before[2]
    f = (at - before[0]) / (after[0] - before[0])
    return (
        before[1] + (after[1] - before[1]) * f,
        before[2] + (after[2] - before[2]) * f,
    )


def prompts(path: Path, jobs: int, prompt_bytes: int) -> None:
    """``jobs`` distinct prompts of about ``prompt_bytes`` each."""
    filler = "the quick brown fox jumps over the lazy dog " * (prompt_bytes // 44 + 1)
    with path.open("w") as f:
        for i in range(jobs):
            text = (f"prompt {i}: " + filler)[:prompt_bytes]
            f.write(json.dumps({"custom_id": f"c{i}", "prompt": text}) + "\n")


def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.jsonl"
        prompts(path, args.jobs, args.prompt_bytes)
        server_cmd = [sys.executable, __file__, "--serve", "--rpm", str(args.rpm),
                      "--latency", str(args.latency), "--reply-bytes", str(args.reply_bytes),
                      "--server-mode", args.server_mode]  # fmt: skip
        server = subprocess.Popen(
            server_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert server.stdout is not None and server.stdin is not None
        port = int(server.stdout.readline().split()[1])
        base_url = f"http://127.0.0.1:{port}/v1"
        db = str(Path(tmp) / "aiq.db")
        aiq = [sys.executable]
        if args.profile and args.profile.endswith(".prof"):
            aiq += ["-m", "cProfile", "-o", str(Path(args.profile).resolve())]
        aiq += ["-m", "aiq", "run", str(path), "--base-url", base_url, "--model", "gpt-4o-mini",
                "--json", "--db", db]  # fmt: skip
        if not args.learned:
            aiq += ["--rpm", str(args.rpm)]
        aiq += args.aiq_flags
        if args.profile and not args.profile.endswith(".prof"):
            # py-spy starts aiq itself (no ptrace permission needed); its own CPU is its own.
            spy = str(Path(sys.executable).with_name("py-spy"))
            aiq = [spy, "record", "--format", "raw", "--rate", "200", "--nonblocking", "--gil",
                   "-o", str(Path(args.profile).resolve()), "--", *aiq]  # fmt: skip
        env = {**os.environ, "OPENAI_API_KEY": API_KEY, "PYTHONPATH": str(args.src)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)  # the server is not reaped yet
        started = time.monotonic()
        proc = subprocess.Popen(aiq, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        samples: list[tuple[float, float, float]] = []
        target = proc.pid

        def sample() -> None:
            nonlocal target
            while proc.poll() is None:
                if args.profile and not args.profile.endswith(".prof") and target == proc.pid:
                    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                    with_kids = kids.read_text().split() if kids.exists() else []
                    if with_kids:
                        target = int(with_kids[0])  # aiq under py-spy
                    else:
                        time.sleep(0.01)
                        continue
                cpu = _cpu_s(target)
                if cpu is not None:
                    samples.append((time.monotonic(), *cpu))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, err = proc.communicate()
        wall_s = time.monotonic() - started
        sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        usage = (
            None
            if args.profile
            else (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        )
        sys_s = None if args.profile else after.ru_stime - before.ru_stime
        server.stdin.close()
        stats = json.loads(server.stdout.read().strip().splitlines()[-1])
        server.wait()
    if proc.returncode != 0:
        raise SystemExit(f"aiq exited {proc.returncode}: {err.decode()[-2000:]}")
    # py-spy writes its own lines around aiq's summary.
    summary = json.loads(next(x for x in out.decode().splitlines() if x.startswith("{")))
    first, last = stats["first"], stats["last"]
    send_s = last - first
    (end_cpu, end_main), (start_cpu, start_main) = _cpu_at(samples, last), _cpu_at(samples, first)
    send_cpu_s, main_cpu_s = end_cpu - start_cpu, end_main - start_main
    rate = stats["counted"] / send_s
    # The steady state: from two latencies after the first request (connections opened, the
    # size settled) to the last; its requests counted from the rate, as the pace is even.
    steady_from = first + 2 * args.latency
    steady_cpu_s = _cpu_at(samples, last)[0] - _cpu_at(samples, steady_from)[0]
    steady_s = last - steady_from
    return {
        "told": "nothing (learned)" if args.learned else f"--rpm {args.rpm}",
        "jobs": args.jobs,
        "done": summary.get("done_now"),
        "send_s": round(send_s, 1),
        "req_per_s": round(rate, 1),
        "send_efficiency": round((stats["counted"] - 1) / (args.rpm / 60) / send_s, 3),
        "aiq_cpu_share": round(send_cpu_s / send_s, 3),
        "main_thread_share": round(main_cpu_s / send_s, 3),
        "cpu_us_per_req": round(send_cpu_s / stats["counted"] * 1e6),
        "share_at_500_per_s": round(send_cpu_s / stats["counted"] * 500, 3),
        "steady_share": round(steady_cpu_s / steady_s, 3) if steady_s > 0 else None,
        "wall_s": round(wall_s, 1),
        "whole_run_cpu_s": round(usage, 1) if usage is not None else None,
        "whole_run_cpu_share": round(usage / wall_s, 3) if usage is not None else None,
        "whole_run_system_s": round(sys_s, 1) if sys_s is not None else None,
        "429s": stats["statuses"].get("429", 0),
        "max_in_flight": stats["max_in_flight"],
        "aiq_max_in_flight": summary.get("max_in_flight"),
        "profiled": args.profile or None,
        "src": str(args.src),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=12_000)
    parser.add_argument("--rpm", type=int, default=30_000)
    parser.add_argument("--latency", type=float, default=3.0, help="seconds per request")
    parser.add_argument("--prompt-bytes", type=int, default=2048)
    parser.add_argument("--reply-bytes", type=int, default=2048)
    parser.add_argument("--server-mode", default="per-second", choices=sorted(modes.MODES))
    parser.add_argument("--learned", action="store_true", help="tell aiq no limit")
    parser.add_argument("--profile", help="FILE.prof: cProfile; any other name: py-spy raw")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--src", default=ROOT / "src", help="aiq's source (another checkout's)")
    parser.add_argument(
        "--aiq-flags", type=lambda v: v.split(), default=[], help="more flags for aiq run"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    for _ in range(args.repeat):
        print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
