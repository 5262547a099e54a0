"""The fake server's rate-limit modes enforce and report as their sources say.

Each mode is driven directly on a fake clock (``T0`` is a whole minute of the epoch, so calendar
windows start there), and through a real ``FakeServer`` over HTTP where the plumbing matters.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from fakes import FakeClock
from fakeserver import FakeServer
from fakeserver.modes import (
    AnthropicBuckets,
    AzureWindows,
    Cost,
    GroqDaily,
    Headerless,
    LiteLLMRouter,
    Mode,
    OpenAIBucket,
    OtherClient,
    ParallelLimit,
    PerSecond,
    TogetherPerSecond,
    build,
    groq_duration,
)
from hypothesis import given, settings
from hypothesis import strategies as st

T0 = 1_800_000_000.0  # a whole minute (and ten seconds, and day's second) of the epoch
ONE = Cost(tokens=10, input_tokens=10)


def admitted(mode: Mode, times: list[float], cost: Cost = ONE) -> list[float]:
    """The arrival times ``mode`` admits, of requests arriving at ``times``."""
    return [t for t in times if mode.admit(t, cost) is None]


def burst(mode: Mode, now: float, n: int, cost: Cost = ONE) -> int:
    """How many of ``n`` requests arriving at once at ``now`` are admitted."""
    return len(admitted(mode, [now] * n, cost))


# -- a. OpenAI: a minute's bucket, full at start --------------------------------------------------


def test_openai_bucket_is_full_at_start_and_refills_continuously() -> None:
    mode = OpenAIBucket(rpm=60)
    assert burst(mode, T0, 61) == 60  # a minute's worth at once, not one a second
    assert mode.headers(T0) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m0s",
    }
    headers = mode.headers(T0 + 30.25)
    assert headers["x-ratelimit-remaining-requests"] == "30"
    assert headers["x-ratelimit-reset-requests"] == "29.75s"
    assert burst(mode, T0 + 30.25, 31) == 30


def test_openai_429_names_the_limit_and_the_wait() -> None:
    mode = OpenAIBucket(rpm=60, tpm=1000)
    assert mode.admit(T0, Cost(tokens=600)) is None
    no = mode.admit(T0, Cost(tokens=600))
    assert no is not None
    error = no.payload["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "tokens")
    # 200 tokens short at 1000/60 a second: 12 s.
    assert "Limit 1000, Used 600, Requested 600. Please try again in 12s." in error["message"]
    assert no.headers == {"retry-after": "12", "retry-after-ms": "12000"}
    assert mode.headers(T0)["x-ratelimit-reset-tokens"] == "36s"
    too_large = mode.admit(T0, Cost(tokens=1001))
    assert too_large is not None and too_large.headers == {}
    assert too_large.payload["error"]["message"].startswith("Request too large")


def test_openai_requests_429_waits_for_one_request() -> None:
    mode = OpenAIBucket(rpm=500)
    burst(mode, T0, 500)
    no = mode.admit(T0, ONE)
    assert no is not None and no.payload["error"]["type"] == "requests"
    assert no.headers == {"retry-after": "1", "retry-after-ms": "120"}
    assert "Please try again in 120ms." in no.payload["error"]["message"]


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 0.2), min_size=1, max_size=300),
    span=st.sampled_from([0.5, 1.0, 5.0, 60.0]),
    per_second=st.booleans(),
)
def test_no_span_admits_more_than_the_bucket_and_its_refill(
    gaps: list[float], span: float, per_second: bool
) -> None:
    """A bucket of C refilled at r a second admits at most C + r * T in any T seconds."""
    mode = PerSecond(rpm=1200) if per_second else OpenAIBucket(rpm=120)
    capacity, rate = (20, 20) if per_second else (120, 2)
    times, now = [], T0
    for gap in gaps:
        now += gap
        times.append(now)
    got = admitted(mode, times)
    for i, start in enumerate(got):
        inside = sum(1 for t in got[i:] if t <= start + span)
        assert inside <= capacity + rate * span + 1e-9


# -- b. per-second enforcement that reports the short bucket --------------------------------------


def test_per_second_reports_the_per_minute_limit_and_the_short_bucket() -> None:
    mode = PerSecond(rpm=1200)
    assert burst(mode, T0, 25) == 20
    assert mode.headers(T0) == {
        "x-ratelimit-limit-requests": "1200",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
    }
    later = mode.headers(T0 + 0.25)
    assert later["x-ratelimit-remaining-requests"] == "5"
    assert later["x-ratelimit-reset-requests"] == "750ms"
    assert burst(mode, T0 + 0.75, 20) == 15  # refilled at 20 a second
    no = mode.admit(T0 + 0.75, ONE)
    assert no is not None and no.headers == {"retry-after": "1", "retry-after-ms": "50"}
    # Paced at the limit it never refuses: 1,200 in a minute, one every 50 ms.
    paced = PerSecond(rpm=1200)
    assert len(admitted(paced, [T0 + i * 0.05 for i in range(1200)])) == 1200


def test_together_reports_its_limit_per_second_unsuffixed() -> None:
    mode = TogetherPerSecond(rpm=1200, tpm=60_000)
    assert burst(mode, T0, 25) == 20
    assert mode.headers(T0) == {
        "x-ratelimit-limit": "20",  # a second's, not a minute's
        "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": "1.000",
        "x-tokenlimit-limit": "1000",
        "x-tokenlimit-remaining": "800",  # (20 of ONE's 10 tokens)
    }
    assert mode.headers(T0 + 0.25)["x-ratelimit-remaining"] == "5"
    no = mode.admit(T0 + 0.25, ONE)
    assert no is None  # (five left)
    assert burst(mode, T0 + 0.25, 5) == 4
    no = mode.admit(T0 + 0.25, ONE)
    assert no is not None and no.headers == {"retry-after": "1"}
    assert no.payload["error"]["type"] == "dynamic_request_limited"


# -- c. calendar windows: LiteLLM's minute, Azure's ten seconds -----------------------------------


def test_litellm_router_lets_n_minus_one_through_a_calendar_minute() -> None:
    mode = LiteLLMRouter(rpm=5)
    assert burst(mode, T0 + 10, 10) == 4
    no = mode.admit(T0 + 10, ONE)
    assert no is not None
    assert no.headers == {"llm_provider-retry-after": "60"}  # and no retry-after at all
    assert no.payload["error"]["message"] == (
        "litellm.RateLimitError: Deployment over defined rpm limit=5. current usage=5"
    )
    assert mode.headers(T0 + 10) == {
        "x-ratelimit-limit-requests": "5",
        "x-ratelimit-remaining-requests": "1",  # it says one more, and refuses it
    }


def test_litellm_minute_restarts_at_the_boundary_whatever_came_before() -> None:
    mode = LiteLLMRouter(rpm=5)
    assert burst(mode, T0 + 59.5, 5) == 4
    assert burst(mode, T0 + 60.0, 5) == 4  # eight in half a second: fixed, not sliding
    assert burst(mode, T0 + 119.99, 5) == 0


def test_litellm_parallel_limit_refuses_while_its_count_is_met_until_one_ends() -> None:
    mode = ParallelLimit(max_parallel=3)
    assert burst(mode, T0 + 7.094556, 5) == 3
    no = mode.admit(T0 + 7.094556, ONE)
    assert no is not None
    assert float(no.headers["retry-after"]) == pytest.approx(52.905444)  # the minute's turn
    assert set(no.headers) == {"retry-after"}
    assert "Max parallel request limit reached" in no.payload["error"]["message"]
    assert mode.headers(T0 + 8) == {}  # a key with no rpm or tpm limit gets no headers
    mode.release(T0 + 8)  # one answered: a slot is free at once, not at the turn
    assert burst(mode, T0 + 8, 2) == 1


def test_litellm_parallel_count_restarts_at_the_minute_with_old_requests_still_out() -> None:
    mode = ParallelLimit(max_parallel=3)
    assert burst(mode, T0 + 59.9, 3) == 3
    assert burst(mode, T0 + 60.0, 4) == 3  # a fresh cache entry: six running at once
    for _ in range(5):  # those of the last minute end in this one: taken off, not below 0
        mode.release(T0 + 61)
    assert burst(mode, T0 + 61, 4) == 3


def test_litellm_tokens_counted_after_the_call() -> None:
    mode = LiteLLMRouter(tpm=100)
    assert mode.admit(T0, Cost(tokens=5000)) is None  # the estimate is not what counts
    mode.settle(T0 + 1, {"prompt_tokens": 60, "completion_tokens": 40, "total_tokens": 100})
    assert mode.headers(T0 + 1)["x-ratelimit-remaining-tokens"] == "0"
    no = mode.admit(T0 + 2, ONE)
    assert no is not None and "tpm limit=100" in no.payload["error"]["message"]
    assert mode.admit(T0 + 60, ONE) is None


def test_azure_counts_a_sixth_per_ten_second_window_with_reset_to_the_boundary() -> None:
    mode = AzureWindows(rpm=60)
    assert burst(mode, T0 + 3, 12) == 10
    assert mode.headers(T0 + 3) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "7s",
    }
    no = mode.admit(T0 + 3.5, ONE)
    assert no is not None
    assert no.headers == {"retry-after": "7", "retry-after-ms": "6500"}
    assert "Please retry after 7 seconds" in no.payload["error"]["message"]
    assert burst(mode, T0 + 10, 12) == 10
    assert mode.headers(T0 + 12)["x-ratelimit-remaining-requests"] == "0"
    assert mode.headers(T0 + 20)["x-ratelimit-remaining-requests"] == "10"


def test_azure_shows_only_the_headers_asked_for() -> None:
    """As its docs name them: what is left, no limit (and, the issue's reading, the reset)."""
    mode = AzureWindows(rpm=60, shows=("remaining",))
    burst(mode, T0 + 3, 4)
    assert mode.headers(T0 + 3) == {"x-ratelimit-remaining-requests": "6"}
    mode = AzureWindows(rpm=60, shows=("remaining", "reset"))
    assert mode.headers(T0 + 3) == {
        "x-ratelimit-remaining-requests": "10",
        "x-ratelimit-reset-requests": "7s",
    }


def test_azure_one_second_windows_and_tokens_on_arrival() -> None:
    mode = AzureWindows(rpm=600, tpm=6000, window_s=1)
    assert burst(mode, T0 + 0.1, 11) == 10  # the docs' example: the 11th in a second
    tokens = AzureWindows(tpm=6000, window_s=10)  # 1,000 a window
    assert tokens.admit(T0, Cost(tokens=900)) is None
    no = tokens.admit(T0, Cost(tokens=200))
    assert no is not None and no.headers["retry-after"] == "10"
    assert tokens.headers(T0)["x-ratelimit-remaining-tokens"] == "100"


# -- d. Groq: requests per day in the requests header ---------------------------------------------


def test_groq_reports_requests_per_day_and_tokens_per_minute() -> None:
    mode = GroqDaily(rpd=14_400, tpm=6000, rpm=30)
    assert burst(mode, T0, 30) == 30
    headers = mode.headers(T0 + 0.44)
    assert headers["x-ratelimit-limit-requests"] == "14400"
    assert headers["x-ratelimit-remaining-requests"] == "14370"
    assert headers["x-ratelimit-reset-requests"] == "2m59.56s"  # 30 x 6 s, less 0.44 s
    assert headers["x-ratelimit-limit-tokens"] == "6000"
    assert headers["x-ratelimit-reset-tokens"] == "2.56s"  # 300 tokens at 100 a second
    # The minute limit is enforced though no header shows it.
    no = mode.admit(T0 + 0.44, ONE)
    assert no is not None
    assert "requests per minute (RPM): Limit 30" in no.payload["error"]["message"]
    assert no.headers == {"retry-after": "2"}


def test_groq_day_limit_refuses_for_hours() -> None:
    mode = GroqDaily(rpd=10)
    assert burst(mode, T0, 11) == 10
    no = mode.admit(T0, ONE)
    assert no is not None
    assert "requests per day (RPD): Limit 10" in no.payload["error"]["message"]
    assert no.headers == {"retry-after": "8640"}
    assert mode.headers(T0)["x-ratelimit-reset-requests"] == "24h0m0s"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(179.56, "2m59.56s"), (7.66, "7.66s"), (0.94, "940ms"), (60, "1m0s"), (3600, "1h0m0s")],
)
def test_groq_durations(seconds: float, text: str) -> None:
    assert groq_duration(seconds) == text


# -- e. Anthropic: separate input and output buckets ----------------------------------------------


def _anthropic_reset(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_anthropic_headers_round_tokens_down_and_reset_in_rfc3339() -> None:
    mode = AnthropicBuckets(rpm=50, itpm=20_000, otpm=8000)
    cost = Cost(input_tokens=1500, max_tokens=700)
    assert mode.admit(T0, cost) is None
    mode.settle(T0, {"input_tokens": 1500, "output_tokens": 700}, cost)
    headers = mode.headers(T0)
    assert headers["anthropic-ratelimit-requests-remaining"] == "49"
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "20000"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "18000"  # 18,500 rounded
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "7000"  # 7,300 rounded
    # tokens-* is the most restrictive of the two.
    assert headers["anthropic-ratelimit-tokens-remaining"] == "7000"
    assert headers["anthropic-ratelimit-tokens-limit"] == "8000"
    # 1,500 input tokens back at 20,000 a minute: 4.5 s; the reset is when it is full again.
    reset = _anthropic_reset(headers["anthropic-ratelimit-input-tokens-reset"])
    assert reset - T0 == pytest.approx(4.5, abs=0.001)
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")


def test_anthropic_input_counts_cache_writes_not_reads() -> None:
    mode = AnthropicBuckets(rpm=50, itpm=10_000, otpm=1000)
    # 5,000 prompt tokens, 4,000 of them in the cache already: 1,000 count on arrival.
    cost = Cost(input_tokens=5000, cached_tokens=4000, model="claude-sonnet-4-5")
    assert mode.admit(T0, cost) is None
    assert mode.buckets["input-tokens"].level(T0) == 9000
    usage = {"input_tokens": 1000, "cache_read_input_tokens": 4000, "output_tokens": 0}
    mode.settle(T0, usage, cost)
    assert mode.buckets["input-tokens"].level(T0) == 9000
    # A cache write counts; two requests writing one prefix at once both count it.
    cost = Cost(input_tokens=5000, model="claude-sonnet-4-5")
    assert mode.admit(T0, cost) is None
    mode.settle(T0, {"input_tokens": 1000, "cache_creation_input_tokens": 4000}, cost)
    assert mode.buckets["input-tokens"].level(T0) == 4000
    # Claude Haiku 3.5 counts cache reads too.
    haiku = Cost(input_tokens=3000, cached_tokens=3000, model="claude-3-5-haiku-20241022")
    assert mode.admit(T0, haiku) is None
    assert mode.buckets["input-tokens"].level(T0) == 1000


def test_anthropic_output_reserves_max_tokens_on_arrival_and_counts_what_was_generated() -> None:
    mode = AnthropicBuckets(rpm=50, itpm=10_000, otpm=1000)
    big = Cost(input_tokens=10, max_tokens=800)
    assert mode.admit(T0, big) is None
    # 800 reserved: another 800 does not fit until the first reply gives back what it left.
    no = mode.admit(T0, big)
    assert no is not None
    assert no.payload["error"]["type"] == "rate_limit_error"
    assert "1000 output tokens per minute" in no.payload["error"]["message"]
    mode.settle(T0, {"input_tokens": 10, "output_tokens": 50}, big)
    assert mode.buckets["output-tokens"].level(T0) == 950
    assert mode.admit(T0, big) is None
    # Generated beyond what the bucket holds: nothing goes until it refills past zero.
    mode.settle(T0, {"input_tokens": 10, "output_tokens": 1100}, big)
    no = mode.admit(T0, Cost(input_tokens=10))
    assert no is not None and no.headers == {"retry-after": "10"}
    assert mode.admit(T0 + 10, Cost(input_tokens=10)) is None


# -- f. no headers: unlimited, a slot at a time, 429s with or without a hint ----------------------


def test_headerless_never_sends_a_header_and_without_rpm_never_refuses() -> None:
    mode = Headerless()
    assert burst(mode, T0, 1000) == 1000
    assert mode.headers(T0) == {}


@pytest.mark.parametrize(
    ("hint", "headers"),
    [
        ("retry-after", {"retry-after": "52.905443"}),  # LiteLLM's parallel limiter
        ("retry-after-whole", {"retry-after": "53"}),  # RFC 9110's delay-seconds
        ("llm_provider", {"llm_provider-retry-after": "60"}),  # LiteLLM's router
        (None, {}),
    ],
)
def test_headerless_429_hints(hint: str | None, headers: dict[str, str]) -> None:
    mode = Headerless(rpm=3, hint=hint)
    now = T0 + 7.094557
    assert burst(mode, now, 3) == 3  # the parallel limiter admits while under: N, not N-1
    no = mode.admit(now, ONE)
    assert no is not None and no.headers == headers
    assert mode.headers(now) == {}
    assert mode.admit(T0 + 60, ONE) is None


async def _post_many(base_url: str, n: int) -> list[float]:
    """Send ``n`` chat requests at once; the seconds each took."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:

        async def one(i: int) -> float:
            start = time.monotonic()
            body = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
            response = await client.post("/chat/completions", json=body)
            assert response.status_code == 200
            return time.monotonic() - start

        return list(await asyncio.gather(*(one(i) for i in range(n))))


@pytest.mark.slow
def test_a_one_slot_server_queues_the_rest() -> None:
    with FakeServer(limit_mode=Headerless(slots=1), latency_s=0.1) as server:
        took = asyncio.run(_post_many(server.base_url, 4))
        assert server.max_in_flight == 4  # all four held at once, three of them queued
    assert sorted(took)[-1] >= 0.4  # the last waited for the three before it
    settled = sorted(r.monotonic for r in server.requests)
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(settled))  # served one by one
    assert not any(r.status == 429 for r in server.requests)
    with FakeServer(limit_mode=Headerless(slots=4), latency_s=0.1) as wide:
        asyncio.run(_post_many(wide.base_url, 4))
        assert wide.max_in_flight == 4
    # Served together (one by one: 0.27 s apart at least), on the server's clock: the
    # client's, under CI's load, once had all four start 0.28 s late (0.377 s each).
    settled = sorted(r.monotonic for r in wide.requests)
    assert settled[-1] - settled[0] < 0.2, settled


# -- g. another client on the same key ------------------------------------------------------------


def test_another_client_takes_its_share_then_stops() -> None:
    inner = LiteLLMRouter(rpm=61)  # 60 a calendar minute
    mode = OtherClient(inner, rpm=30, start_at=T0, stop_at=T0 + 60)  # one every 2 s
    assert burst(mode, T0 + 29, 100) == 45  # it had sent 15 of the minute's 60
    assert inner.headers(T0 + 29)["x-ratelimit-remaining-requests"] == "1"
    assert burst(mode, T0 + 60, 100) == 60  # it stopped: the whole minute is ours again
    assert (mode.sent, mode.admitted) == (30, 15)  # its last 15 found the minute full
    assert mode.admitted_at == [T0 + 2 * i for i in range(15)]


def test_another_client_drains_a_bucket_it_shares() -> None:
    mode = OtherClient(OpenAIBucket(rpm=60), rpm=120, start_at=T0, stop_at=T0 + 30)
    # It sends 2 a second against a refill of 1: after 30 s it has taken half the bucket.
    headers = mode.headers(T0 + 30)
    assert headers["x-ratelimit-remaining-requests"] == "30"
    assert mode.admitted == 60
    assert mode.headers(T0 + 60)["x-ratelimit-remaining-requests"] == "60"


# -- through the server ---------------------------------------------------------------------------


def _chat(client: httpx.Client, prompt: str = "hi") -> httpx.Response:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}]}
    return client.post("/chat/completions", json=body)


def test_the_server_answers_in_the_modes_words_and_logs_its_refusals() -> None:
    clock = FakeClock(T0 + 10)
    with FakeServer(limit_mode=LiteLLMRouter(rpm=3), limit_clock=clock) as server:
        with httpx.Client(base_url=server.base_url) as client:
            statuses = [_chat(client, f"q{i}").status_code for i in range(3)]
            refused = _chat(client, "q3")
            clock.now = T0 + 60
            again = _chat(client, "q4")
        log = server.requests
    assert statuses == [200, 200, 429]
    assert refused.headers["llm_provider-retry-after"] == "60"
    assert "retry-after" not in refused.headers
    assert refused.headers["x-ratelimit-remaining-requests"] == "1"
    assert "x-ratelimit-reset-requests" not in refused.headers
    assert again.status_code == 200
    assert [r.fault for r in log] == [None, None, "rate_limit", "rate_limit", None]
    assert [r.counted for r in log] == [True, True, False, False, True]
    assert [r.admitted_at for r in log] == [T0 + 10, T0 + 10, None, None, T0 + 60]


def test_the_server_settles_anthropic_usage_with_the_mode() -> None:
    clock = FakeClock(T0)
    mode = AnthropicBuckets(rpm=10, itpm=100_000, otpm=1000)
    system = [{"type": "text", "text": "x" * 8000, "cache_control": {"type": "ephemeral"}}]
    body = {"model": "claude", "max_tokens": 400, "system": system}
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    with (
        FakeServer(limit_mode=mode, limit_clock=clock) as server,
        httpx.Client(base_url=server.base_url, headers=headers) as client,
    ):
        replies = [
            client.post("/messages", json={**body, "messages": [{"role": "user", "content": p}]})
            for p in ("a", "b")
        ]
    assert [r.status_code for r in replies] == [200, 200]
    first, second = (r.json()["usage"] for r in replies)
    assert first["cache_creation_input_tokens"] == second["cache_read_input_tokens"] == 2000
    # Input counted: the first prompt whole (written to the cache), the second less its read.
    spent = 100_000 - mode.buckets["input-tokens"].level(T0)
    assert spent == first["input_tokens"] + 2000 + second["input_tokens"]
    # Output: what was generated, not max_tokens (reserved on arrival, given back after).
    generated = first["output_tokens"] + second["output_tokens"]
    assert 1000 - mode.buckets["output-tokens"].level(T0) == generated
    assert replies[1].headers["anthropic-ratelimit-output-tokens-remaining"] == "0"


def test_a_limit_mode_excludes_the_servers_own_limits() -> None:
    with pytest.raises(ValueError, match="limit_mode"):
        FakeServer(limit_mode=OpenAIBucket(rpm=60), rpm=60)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("openai", OpenAIBucket),
        ("per-second", PerSecond),
        ("litellm", LiteLLMRouter),
        ("azure", AzureWindows),
        ("headerless", Headerless),
    ],
)
def test_build_by_name(name: str, kind: type[Mode]) -> None:
    assert type(build(name, rpm=600, tpm=60_000)) is kind
    assert isinstance(build("groq", rpd=100), GroqDaily)
    assert isinstance(build("anthropic", rpm=5, tpm=5000), AnthropicBuckets)


@pytest.mark.slow
def test_the_server_process_takes_a_limit_mode() -> None:
    script = Path(__file__).with_name("fakeserver")
    cmd = [sys.executable, str(script), "--limit-mode", "per-second", "--rpm", "120"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1") as client:
            codes = [_chat(client, f"q{i}").status_code for i in range(10)]
            last = _chat(client)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert codes[:2] == [200, 200] and 429 in codes  # 2 at once, then 2 a second
    assert last.headers["x-ratelimit-limit-requests"] == "120"
    assert int(last.headers["x-ratelimit-remaining-requests"]) <= 2
