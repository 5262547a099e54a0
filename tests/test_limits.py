"""Rate limits, faults and outages, end to end: a real `aiq run` against the fake server.

The server enforces its limits as OpenAI does (sliding windows, 429 + Retry-After, the
x-ratelimit-* headers) and logs every request, so each test checks what was really sent and
when. Limits are large so the tests stay short: "the least time the limit allows" for N
requests at R per minute is N / R minutes, the pace the quota sustains.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import API_KEY, read_jsonl, run_aiq, write_prompts
from fakeserver import FakeServer, LoggedRequest

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def posts(server: FakeServer) -> list[LoggedRequest]:
    return [r for r in server.requests if r.method == "POST"]


def sending_time(requests: list[LoggedRequest]) -> float:
    """From the first request the server admitted to the last: the run's sending phase."""
    admitted = sorted(r.received for r in requests if r.counted)
    return admitted[-1] - admitted[0]


def share_429(requests: list[LoggedRequest]) -> float:
    return sum(r.status == 429 for r in requests) / len(requests)


@pytest.mark.parametrize("window_s", [60.0, 1.0], ids=["per-minute", "per-second"])
@pytest.mark.parametrize("told", [True, False], ids=["--rpm", "learned"])
def test_requests_per_minute_used_to_the_full_without_429s(
    tmp_path: Path, window_s: float, told: bool
) -> None:
    # 50/s: the pace is under test, not aiq's CPU (bench/cpu.py); at 200/s and again at 100/s
    # a loaded CI machine (3 workers on 2 cores) starved the run past 5% once. 12 s of quota,
    # not 6: the 2% headroom leaves 3% for the machine, and at 6 s one 0.16 s stall on a loaded
    # CI machine took it all (6.28 s where it reads 6.12 alone, under load here too).
    rpm, n = 3_000, 600
    write_prompts(tmp_path / "p.jsonl", [(f"r{i}", f"rate prompt {i}") for i in range(n)])
    with FakeServer(rpm=rpm, limit_window_s=window_s, latency_s=0.05) as server:
        args = ["--base-url", server.base_url, "--model", "m"]
        if told:
            args += ["--rpm", str(rpm)]
        done = run_aiq("run", "p.jsonl", *args, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        sent = posts(server)
        # The server never admitted more than its limit in any window (its own count)...
        assert server.max_accepted_in_window(window_s) <= rpm * window_s / 60
    assert len(read_jsonl(tmp_path / "p.results.jsonl")) == n
    assert share_429(sent) < 0.01, Counter(r.status for r in sent)
    least = (n - 1) * 60 / rpm
    assert sending_time(sent) <= least * 1.05


@pytest.mark.parametrize("told", [True, False], ids=["--tpm", "learned"])
def test_tokens_per_minute_used_to_the_full_without_429s(tmp_path: Path, told: bool) -> None:
    # ~510 prompt tokens + 500 reserved a request; 600,000/min is ~10 requests a second.
    tpm, n = 600_000, 70
    long = "lorem ipsum dolor sit amet " * 75
    lines = [(f"t{i}", f"{i} {long}") for i in range(n)]
    write_prompts(tmp_path / "t.jsonl", lines)
    (tmp_path / "aiq.yaml").write_text("max_tokens: 500\n")
    with FakeServer(tpm=tpm, latency_s=0.1) as server:
        args = ["--base-url", server.base_url, "--model", "m"]
        if told:
            args += ["--tpm", str(tpm)]
        done = run_aiq("run", "t.jsonl", *args, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        sent = posts(server)
        assert server.max_tokens_in_window(60.0) <= tpm
    assert len(read_jsonl(tmp_path / "t.results.jsonl")) == n
    assert share_429(sent) < 0.01, Counter(r.status for r in sent)
    tokens = sorted((r.received, r.tokens) for r in sent if r.counted)
    # Every request but the last is paid for before the last one goes.
    least = sum(t for _, t in tokens[:-1]) * 60 / tpm
    assert sending_time(sent) <= least * 1.05


def test_faults_lose_nothing_and_resend_nothing_that_succeeded(tmp_path: Path) -> None:
    n = 300
    prompts = [(f"f{i}", f"fault prompt {i}" + (" FAIL_PERMANENT" if i % 50 == 7 else ""))
               for i in range(n)]  # fmt: skip
    write_prompts(tmp_path / "f.jsonl", prompts)
    (tmp_path / "aiq.yaml").write_text("backoff_base_s: 0.1\nbackoff_cap_s: 1\nmax_attempts: 8\n")
    with FakeServer(
        error_500_rate=0.05, reset_rate=0.02, hang_rate=0.01, hang_s=3.0, seed=7
    ) as server:
        done = run_aiq(
            "run", "f.jsonl", "--base-url", server.base_url, "--model", "m", "--timeout", "1",
            "--concurrency", "16", cwd=tmp_path, timeout=120,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr  # finished, some dead (the permanent ones)
        sent = posts(server)
    faults = Counter(r.fault for r in sent)
    assert faults["500"] and faults["reset"] and faults["hang"]  # the faults did happen
    results = {r["custom_id"]: r for r in read_jsonl(tmp_path / "f.results.jsonl")}
    dead = {r["custom_id"]: r for r in read_jsonl(tmp_path / "f.dead.jsonl")}
    permanent = {cid for cid, p in prompts if "FAIL_PERMANENT" in p}
    assert set(dead) == permanent
    assert set(results) == {cid for cid, _ in prompts} - permanent
    for record in dead.values():  # dead at once, with the server's own message
        assert record["error"]["type"] == "invalid_request"
        assert record["error"]["message"] == "HTTP 400: The request was rejected as invalid."
    # No prompt that got its answer was sent again.
    answered_at: dict[str, float] = {}
    for r in sorted(sent, key=lambda r: r.received):
        assert r.prompt not in answered_at, f"{r.prompt!r} sent again after it succeeded"
        if r.status == 200 and r.fault is None:
            answered_at[r.prompt] = r.received


def test_a_bad_key_stops_the_run_at_once_with_every_job_queued(tmp_path: Path) -> None:
    write_prompts(tmp_path / "k.jsonl", [(f"k{i}", f"key prompt {i}") for i in range(200)])
    with FakeServer(require_key="sk-the-right-one") as server:
        done = run_aiq("run", "k.jsonl", "--base-url", server.base_url, "--model", "m",
                       cwd=tmp_path)  # fmt: skip
        calls = len(posts(server))
    assert done.returncode == 4, done.stderr
    assert "OPENAI_API_KEY" in done.stderr and API_KEY not in done.stderr
    assert calls <= 5
    status = run_aiq("status", "--json", cwd=tmp_path)
    counts = json.loads(status.stdout)["counts"]
    assert counts["queued"] == 200 and counts["done"] == counts["dead"] == 0


def test_an_outage_of_5_s_dead_letters_nothing_and_the_run_completes(tmp_path: Path) -> None:
    n = 200
    write_prompts(tmp_path / "o.jsonl", [(f"o{i}", f"outage prompt {i}") for i in range(n)])
    with FakeServer(latency_s=0.1) as server:
        outage_at: list[float] = []

        def outage_when_a_quarter_is_done() -> None:
            while len(posts(server)) < n // 4:
                time.sleep(0.01)
            outage_at.append(time.monotonic())
            server.start_outage(5.0)

        watcher = threading.Thread(target=outage_when_a_quarter_is_done, daemon=True)
        watcher.start()
        done = run_aiq("run", "o.jsonl", "--base-url", server.base_url, "--model", "m",
                       "--concurrency", "16", cwd=tmp_path, timeout=120)  # fmt: skip
        finished = time.monotonic()
        sent = posts(server)
    assert done.returncode == 0, done.stderr
    assert outage_at and finished - outage_at[0] >= 5  # the outage really was in the middle
    outage_calls = sum(r.fault == "outage" for r in sent)
    assert outage_calls >= 1
    assert len(read_jsonl(tmp_path / "o.results.jsonl")) == n
    assert read_jsonl(tmp_path / "o.dead.jsonl") == []
    assert "provider down" in done.stderr  # the progress lines said what was going on
    # The breaker held the run back: a few probes, not a retry storm, while it was down (16
    # in flight at the start, a few retries before the breaker opens, then probes; a storm
    # would be hundreds). 68 were seen with the suite on three workers on two cores.
    assert outage_calls < 100, outage_calls


def test_a_provider_down_longer_than_max_outage_stops_the_run_resumably(tmp_path: Path) -> None:
    write_prompts(tmp_path / "d.jsonl", [(f"d{i}", f"down prompt {i}") for i in range(50)])
    with FakeServer() as server:
        server.start_outage(120.0)
        started = time.monotonic()
        done = run_aiq("run", "d.jsonl", "--base-url", server.base_url, "--model", "m",
                       "--max-outage", "3", cwd=tmp_path)  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 4, done.stderr
    assert "--max-outage" in done.stderr and "aiq resume" in done.stderr
    assert elapsed < 15
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    assert status["counts"]["queued"] == 50  # nothing dead, nothing lost


def test_each_model_keeps_to_its_own_limit_in_one_run(tmp_path: Path) -> None:
    def line(model: str, i: int) -> str:
        return json.dumps({"custom_id": f"{model}{i}", "model": model, "prompt": f"{model} {i}"})

    # The slow model's bucket (600, full at the start) first, then 40 more of it beside 40 of
    # the fast one: those 40 must wait for its refill, 10 a second.
    lines = [line("slow", i) for i in range(600)]
    lines += [line(model, i) for i in range(600, 640) for model in ("slow", "fast")]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "aiq.yaml").write_text("model_limits:\n  slow: {rpm: 600}\n")  # 10/s
    with FakeServer(latency_s=0.02) as server:
        # Fewer senders than slow jobs: each would wait its turn in the slow model's limiter,
        # holding the fast jobs up, unless it puts the slow job back and takes the next.
        args = ("run", "m.jsonl", "--base-url", server.base_url, "--concurrency", "8")
        done = run_aiq(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        sent = posts(server)
    by_model = {
        m: sorted(r.received for r in sent if r.body["model"] == m) for m in ("slow", "fast")
    }
    assert (len(by_model["slow"]), len(by_model["fast"])) == (640, 40)  # each sent once
    assert len(read_jsonl(tmp_path / "m.results.jsonl")) == 680
    # The bucket holds 600 at the start and refills 10 a second, so the 640th can go no
    # earlier than 4 s after the first (paced at 98%: 4.08 s). Unpaced, all 640 would arrive
    # within ~2 s at 8 x 50/s. (A test of the last 20's gaps failed under load: the first 600
    # took over 2 s and the refill meanwhile let the last ones go closer.)
    slow = by_model["slow"]
    assert slow[-1] - slow[0] >= 40 / 10 - 0.15
    # And no request goes before the bucket holds it: by the k-th, no more than 600 plus
    # what 10 a second refilled since the first (give or take two delivered late).
    assert all(k + 1 <= 600 + 10 * (t - slow[0]) + 2 for k, t in enumerate(slow))
    # The fast model is not held back by the slow one's limit: its 40 go within a moment of
    # each other. Held back, they would go at the slow one's pace, one in each 0.1 s, 4 s.
    fast = by_model["fast"]
    assert fast[-1] - fast[0] < 1.5


def test_jobs_a_limiter_deferred_are_due_again_when_the_next_run_starts(tmp_path: Path) -> None:
    """Their slots were paced to the old run's limits, which the user may have raised."""
    write_prompts(tmp_path / "p.jsonl", [(f"q{i}", f"prompt {i}") for i in range(20)])
    assert run_aiq("add", "p.jsonl", "--model", "m", cwd=tmp_path).returncode == 0
    db = tmp_path / ".aiq" / "aiq.db"
    with sqlite3.connect(db) as conn:  # as a run stopped with all of them put off an hour
        conn.execute("UPDATE jobs SET next_at = ?, deferred = 1", (time.time() + 3600,))
    conn.close()
    status = run_aiq("status", cwd=tmp_path)
    assert "queued 20 (20 not due yet)" in status.stdout, status.stdout
    assert json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)["not_due"] == 20
    with FakeServer() as server:
        done = run_aiq("resume", "--base-url", server.base_url, cwd=tmp_path, timeout=30)
        assert done.returncode == 0, done.stderr
        assert len(posts(server)) == 20
    assert len(read_jsonl(tmp_path / "p.results.jsonl")) == 20


def test_the_lower_reported_limit_wins_with_concurrency_auto(tmp_path: Path) -> None:
    """Told 1,200/min against a server that says 600: every sender of `auto` could hold a
    slot at 1,200/min when the first reply came; they are paced again at 600."""
    rpm, n = 600, 40  # 10/s: 4 s at the lower limit, 2 s at the higher
    write_prompts(tmp_path / "p.jsonl", [(f"a{i}", f"auto prompt {i}") for i in range(n)])
    with FakeServer(rpm=rpm, latency_s=0.05) as server:
        args = ["--base-url", server.base_url, "--model", "m", "--rpm", "1200"]
        done = run_aiq("run", "p.jsonl", *args, "--concurrency", "auto", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        sent = posts(server)
    assert len(read_jsonl(tmp_path / "p.results.jsonl")) == n
    # The first reply's headers come after the first request: a few go before at 1,200/min.
    assert sending_time(sent) >= (n - 5) * 60 / rpm
