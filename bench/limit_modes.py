"""Benchmark: how close does ``aiq run`` come to the least time each way of counting allows?

For each row it starts ``tests/fakeserver``'s ``FakeServer`` in a thread of this process with
a rate-limit mode of ``tests/fakeserver/modes`` (OpenAI's bucket, per-second enforcement,
LiteLLM's and Azure's calendar windows, Groq's per-day header, Anthropic's buckets, a server
with no headers, another client on the key, gateways' own headers: Kong's, express-rate-
limit's), runs ``aiq run`` against it as a subprocess, told the limit (``configured``) or not
(``learned``), and reads the server's log afterwards.

- **least s**: the least time the mode allows from the first request to the last, found by
  replaying the same number of requests against a fresh copy of the mode on a fake clock that
  starts where aiq's first request arrived (so calendar windows fall alike), each sent the
  moment the mode admits it (a try it refuses is not counted: the ideal client would not
  have sent it, and Kong counts refused ones); for a server with ``slots``, no less than the
  slots' queue needs.
- **efficiency**: (least s + one latency) / wall, where wall runs from the first request's
  arrival to the last reply (interpreter start and export are outside it). A run not done by
  ``--timeout`` is killed; its efficiency is then at most the figure shown (``<=``).
- **paced**: the same against the limit's sustained rate alone, ``(jobs - 1) / rate`` + one
  latency, over wall: how near aiq comes once the burst a full bucket offers is set aside
  (rows without a rate: the same as efficiency).
- **429 share**: POSTs answered 429 over all POSTs; **after the first round**: those that
  arrived more than one latency (and ``FIRST_ROUND_S`` of aiq's own time to read it) after the
  first 429 did. A server that shows no limit until it refuses (d's per-minute requests, f)
  refuses what is in flight when its count is met, however the client paces, and that
  round's size is the rate times the latency, not a share of the batch: over a batch of a
  few hundred it is a few percent, over a night's batch none to speak of.

Rows where the whole batch fits the burst a mode allows at once (``-at-once``) have a least
time of zero: their efficiency is one latency over wall, which no client reaches without
sending the whole batch before the first reply says what may go (the one-slot server of
row f says why aiq does not). They show how many round trips aiq takes; the rows without
the suffix hold more jobs than the burst, so the limit's own pace is what they measure.

    .venv/bin/python bench/limit_modes.py                     # every row, once
    .venv/bin/python bench/limit_modes.py --rows a-openai-configured,b-per-second-learned
    .venv/bin/python bench/limit_modes.py --src /tmp/base/src   # another checkout, for A/B
    .venv/bin/python bench/limit_modes.py --tier 10 --latency 0.05  # 3,000-12,000 rpm, 50 ms
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the fakeserver package

from fakeserver import FakeServer  # noqa: E402
from fakeserver import modes as fl  # noqa: E402

API_KEY = "sk-test"
STEP_S = 0.005  # the ideal client's clock step while it waits for the mode to admit
FIRST_ROUND_S = 0.3  # aiq's own time to read the first 429 (as tests/test_limit_modes_e2e.py)


@dataclass(frozen=True)
class Row:
    """A mode (built fresh from the run's start time), a batch, and what aiq is told."""

    description: str
    jobs: int
    mode: Callable[[float], fl.Mode]
    aiq_flags: tuple[str, ...] = ()
    latency_s: float = 0.2
    provider: str = "openai"
    rpm: float | None = None  # the sustained rate the mode allows, for the "paced" column
    # The least time, where replaying the mode does not give it: with another client on the
    # key, a client that yields it its share (the replay's ideal client would outrun it).
    least: Callable[[int], float] | None = None


def yielding_s(jobs: int, rpm: float, other_rpm: float, other_s: float) -> float:
    """The least time for ``jobs`` from a bucket of ``rpm`` full at the start, beside another
    client sending ``other_rpm`` for its first ``other_s`` seconds and yielded its share: the
    bucket's content at once, then the refill less the other's share, then all of it."""
    refill, beside = rpm / 60, (rpm - other_rpm) / 60
    left = jobs - rpm
    if left <= 0:
        return 0.0
    if left <= beside * other_s:
        return left / beside
    return other_s + (left - beside * other_s) / refill


def _rows(tier: float = 1.0, latency_s: float = 0.2) -> dict[str, Row]:
    """The rows; ``tier`` multiplies every limit and batch size (so a row takes about as
    long at any tier), ``latency_s`` is the server's."""
    rows: dict[str, Row] = {}

    def n(count: float) -> int:
        return max(1, round(count * tier))

    def told(rpm: int) -> tuple[str, str]:
        return ("--rpm", str(n(rpm)))

    def pair(
        name: str, text: str, jobs: int, mode: Callable[[float], fl.Mode], flags: tuple
    ) -> None:
        rpm = float(flags[1])
        rows[f"{name}-configured"] = Row(
            f"{text}, aiq {' '.join(flags)}", jobs, mode, flags, latency_s, rpm=rpm
        )
        learned = f"{text}, aiq told nothing"
        rows[f"{name}-learned"] = Row(learned, jobs, mode, (), latency_s, rpm=rpm)

    pair("a-openai", "OpenAI bucket 600 rpm, full at start", n(700),
         lambda t0: fl.OpenAIBucket(rpm=n(600)), told(600))  # fmt: skip
    pair("a-openai-at-once", "OpenAI bucket 600 rpm, full at start", n(400),
         lambda t0: fl.OpenAIBucket(rpm=n(600)), told(600))  # fmt: skip
    # The burst case: the bucket's 1,200 at once, the other 800 at its refill (40 s).
    pair("a-openai-burst", "OpenAI bucket 1,200 rpm, full at start", n(2000),
         lambda t0: fl.OpenAIBucket(rpm=n(1200)), told(1200))  # fmt: skip
    pair("b-per-second", "1,200 rpm as a 20-request bucket", n(800),
         lambda t0: fl.PerSecond(rpm=n(1200)), told(1200))  # fmt: skip
    # Together's limit per second, unsuffixed (x-ratelimit-limit: 20): read as per minute,
    # a sixtieth of the quota.
    pair("b-together", "Together 1,200 rpm as 20 a second, unsuffixed headers", n(800),
         lambda t0: fl.TogetherPerSecond(rpm=n(1200)), told(1200))  # fmt: skip
    pair("c-litellm", "LiteLLM router rpm 600 per calendar minute (599 pass)", n(700),
         lambda t0: fl.LiteLLMRouter(rpm=n(600)), told(600))  # fmt: skip
    pair("c-azure", "Azure 1,200 rpm as 200 per 10 s window", n(800),
         lambda t0: fl.AzureWindows(rpm=n(1200)), told(1200))  # fmt: skip
    # Azure showing no limit: what is left and the reset (the reading), or what is
    # left alone (the headers its docs name).
    pair("c-azure-no-limit", "Azure 1,200 rpm as 200 per 10 s window, no limit header", n(800),
         lambda t0: fl.AzureWindows(rpm=n(1200), shows=("remaining", "reset")),
         told(1200))  # fmt: skip
    pair("c-azure-remaining", "Azure 1,200 rpm as 200 per 10 s window, remaining only", n(800),
         lambda t0: fl.AzureWindows(rpm=n(1200), shows=("remaining",)),
         told(1200))  # fmt: skip
    pair("d-groq", "Groq 14,400 per day in the header, 300 rpm unreported", n(400),
         lambda t0: fl.GroqDaily(rpd=n(14_400), rpm=n(300)), told(300))  # fmt: skip
    pair("f-litellm-429", "no headers, 300 per calendar minute, llm_provider-retry-after", n(400),
         lambda t0: fl.Headerless(rpm=n(300), hint="llm_provider"), told(300))  # fmt: skip
    pair("f-retry-after", "no headers, 300 per calendar minute, fractional retry-after", n(400),
         lambda t0: fl.Headerless(rpm=n(300), hint="retry-after"), told(300))  # fmt: skip
    pair("g-other-client", "OpenAI bucket 600 rpm, another client at 300 rpm for 30 s", n(800),
         lambda t0: fl.OtherClient(fl.OpenAIBucket(rpm=n(600)), rpm=n(300), start_at=t0,
                                   stop_at=t0 + 30), told(600))  # fmt: skip
    # Gateways' own headers (tests/fakeserver/modes/gateways.py): Kong's windows are aligned
    # to the epoch, whole-second resets; express-rate-limit's start with its store (here 50 s
    # before the run, so the first window turns 10 s in).
    pair("h-kong", "Kong 600 per calendar minute, X-RateLimit-*-Minute", n(700),
         lambda t0: fl.KongGateway(rpm=n(600)), told(600))  # fmt: skip
    pair("h-kong-second", "Kong 1,200 rpm as 20 per 1 s window, reset always 1", n(800),
         lambda t0: fl.KongGateway(rpm=n(1200), window_s=1), told(1200))  # fmt: skip
    pair("h-kong-sliding", "Kong 600 per sliding minute", n(700),
         lambda t0: fl.KongGateway(rpm=n(600), window_type="sliding"), told(600))  # fmt: skip
    for draft in (6, 8):
        pair(f"h-express-draft{draft}", f"express-rate-limit 600 a minute, draft-{draft}", n(700),
             partial(lambda t0, d: fl.ExpressDraftHeaders(rpm=n(600), draft=d, start=t0 - 50),
                     d=draft), told(600))  # fmt: skip
    for name in ("g-other-client-configured", "g-other-client-learned"):
        # No one rate; the least leaves the other client its share.
        yielded = partial(yielding_s, rpm=n(600), other_rpm=n(300), other_s=30)
        rows[name] = replace(rows[name], rpm=None, least=yielded)
    big = 10_000_000
    for name, flags in (("configured", told(600)), ("learned", ())):
        for suffix, jobs in (("", n(700)), ("-at-once", n(400))):
            rows[f"e-anthropic{suffix}-{name}"] = Row(
                f"Anthropic buckets 600 rpm, aiq {' '.join(flags) or 'told nothing'}",
                jobs,
                lambda t0: fl.AnthropicBuckets(rpm=n(600), itpm=big, otpm=big),
                flags,
                latency_s,
                provider="anthropic",
                rpm=n(600),
            )
    for slots, jobs in ((1, 40), (4, 400)):
        for name, flags in (("configured", ("--concurrency", str(slots))), ("learned", ())):
            rows[f"f-{'one' if slots == 1 else 'four'}-slot{'s' * (slots > 1)}-{name}"] = Row(
                f"no headers, {slots} at a time ({latency_s} s), aiq {' '.join(flags) or 'auto'}",
                jobs,
                partial(lambda t0, count: fl.Headerless(slots=count), count=slots),
                flags,
                latency_s,
            )
    # LiteLLM's max_parallel_requests: 8 at once, the rest refused, retry-after to the minute.
    for name, flags in (("configured", ("--concurrency", "8")), ("learned", ())):
        rows[f"f-parallel-limit-{name}"] = Row(
            f"no headers, LiteLLM parallel limit 8 ({latency_s} s), "
            f"aiq {' '.join(flags) or 'auto'}",
            1000,
            lambda t0: fl.ParallelLimit(max_parallel=8),
            flags,
            latency_s,
            # (A replay would not free its slots: the least is the slots'.)
            least=lambda jobs: (math.ceil(jobs / 8) - 1) * latency_s,
        )
    return rows


ROWS = _rows()


@dataclass
class Result:
    efficiency: float
    paced: float
    timed_out: bool
    done: int
    share_429: float
    later_429: int  # after the first round
    posts: int
    least_s: float
    wall_s: float
    max_in_flight: int
    timeline: str = ""  # per second from the first request: 200s and 429s (--timeline)


def least_s(row: Row, t0: float, start: float) -> float:
    """The least time from the first request to the last that a fresh copy of the mode
    allows ``row.jobs`` requests, an ideal client sending each the moment it is admitted."""
    mode, now, sent, last = row.mode(t0), start, 0, start
    cost = fl.Cost(tokens=20, input_tokens=20)
    while sent < row.jobs:
        before = copy.deepcopy(mode)  # (a refused request counts at some gateways: Kong's)
        if mode.admit(now, cost) is None:
            sent, last = sent + 1, now
        else:
            mode, now = before, now + STEP_S
    least = last - start
    if mode.slots:
        least = max(least, (math.ceil(row.jobs / mode.slots) - 1) * row.latency_s)
    return least


def run_once(
    row: Row, workdir: Path, timeout_s: float, src: Path = ROOT / "src", step_s: float = 1.0
) -> Result:
    prompts = workdir / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(row.jobs):
            f.write(json.dumps({"custom_id": f"q{i}", "prompt": f"Item {i}: say hi"}) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIQ_", "OPENAI_", "ANTH"))}
    env.update({"OPENAI_API_KEY": API_KEY, "ANTHROPIC_API_KEY": API_KEY, "NO_COLOR": "1"})
    env["PYTHONPATH"] = str(src)
    t0 = time.time()
    mono_to_wall = time.time() - time.monotonic()
    server = FakeServer(limit_mode=row.mode(t0), latency_s=row.latency_s, record=True)
    model = "claude-sonnet-4-5" if row.provider == "anthropic" else "gpt-4o-mini"
    with server:
        cmd = [
            sys.executable, "-m", "aiq", "run", str(prompts), "--db", str(workdir / "aiq.db"),
            "--provider", row.provider, "--base-url", server.base_url, "--model", model,
            "--quiet", "--json", *row.aiq_flags,
        ]  # fmt: skip
        timed_out = False
        try:
            subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        log = server.requests
        max_in_flight = server.max_in_flight
    posts = [r for r in log if r.method == "POST"]
    done = len({r.prompt for r in posts if r.status == 200})
    if not posts:
        raise SystemExit(f"{row.description}: aiq sent nothing")
    first = min(r.received for r in posts)
    wall = max(r.monotonic for r in posts) - first
    if timed_out:
        wall = max(wall, timeout_s)
    least = row.least(row.jobs) if row.least else least_s(row, t0, first + mono_to_wall)
    paced = least if row.rpm is None else (row.jobs - 1) / (row.rpm / 60)
    return Result(
        efficiency=(least + row.latency_s) / wall,
        paced=(paced + row.latency_s) / wall,
        timed_out=timed_out or done < row.jobs,
        done=done,
        share_429=sum(r.status == 429 for r in posts) / len(posts),
        later_429=_later_429(posts, row.latency_s + FIRST_ROUND_S),
        posts=len(posts),
        least_s=least,
        wall_s=wall,
        max_in_flight=max_in_flight,
        timeline=_timeline(posts, first, first + mono_to_wall, step_s),
    )


def _timeline(posts: list, first: float, first_wall: float, step_s: float = 1.0) -> str:
    """Each ``step_s`` from the first request (and the clock's second of the minute it
    began): how many the server let through, how many it refused."""
    steps: dict[int, list[int]] = {}
    for r in posts:
        counts = steps.setdefault(int((r.received - first) / step_s), [0, 0])
        counts[r.status == 429] += 1
    return "\n".join(
        f"      +{i * step_s:5.1f} s (:{int(first_wall + i * step_s) % 60:02d})"
        f"  {ok:4d} ok  {no:4d} 429"
        for i, (ok, no) in sorted(steps.items())
    )


def _later_429(posts: list, seconds: float) -> int:
    """429s of requests that arrived ``seconds`` or more after the first 429 did."""
    refusals = [r.received for r in posts if r.status == 429]
    return sum(t >= min(refusals) + seconds for t in refusals) if refusals else 0


def table(results: dict[str, Result], rows: dict[str, Row] | None = None) -> str:
    rows = rows or ROWS
    lines = [
        "| row | jobs | done | least s | wall s | efficiency | paced | 429s / calls "
        "| after the first round | max in flight |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        bound = "<= " if r.timed_out else ""
        lines.append(
            f"| {name} | {rows[name].jobs:,} | {r.done:,} | {r.least_s:.1f} | {r.wall_s:.1f} "
            f"| {bound}{r.efficiency:.3f} | {bound}{r.paced:.3f} "
            f"| {r.share_429:.2%} ({r.posts - r.done:,} extra) "
            f"| {r.later_429 / r.posts:.2%} ({r.later_429}) | {r.max_in_flight} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated")
    parser.add_argument(
        "--tier", type=float, default=1.0, help="every limit and batch size times this"
    )
    parser.add_argument("--latency", type=float, default=0.2, help="the server's, seconds")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per run")
    parser.add_argument(
        "--timeline",
        type=float,
        nargs="?",
        const=1.0,
        metavar="STEP_S",
        help="print each run's requests per STEP_S seconds (default 1)",
    )
    parser.add_argument(
        "--src", type=Path, default=ROOT / "src", help="aiq from another checkout's src/ (A/B)"
    )
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "-C", str(args.src), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"aiq at {head}, python {sys.version.split()[0]}, load average {os.getloadavg()}")
    print(f"tier x{args.tier:g} (every limit and batch size), latency {args.latency:g} s")
    rows = _rows(args.tier, args.latency)
    results = {}
    for name in args.rows.split(","):
        print(f"  {name}: {rows[name].description}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="aiq-modes-") as tmp:
            results[name] = run_once(
                rows[name], Path(tmp), args.timeout, args.src, args.timeline or 1.0
            )
        r = results[name]
        print(
            f"    efficiency {r.efficiency:.3f}, {r.done}/{rows[name].jobs} done, "
            f"{r.share_429:.2%} 429s, wall {r.wall_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        if args.timeline:
            print(r.timeline, file=sys.stderr, flush=True)
    print(f"load average after: {os.getloadavg()}")
    print(table(results, rows))


if __name__ == "__main__":
    main()
