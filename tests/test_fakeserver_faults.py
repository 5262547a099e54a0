"""The fake server's rate limits and injected faults, seen from real HTTP clients.

These pin what aiq's limiter and retry tests lean on: the server admits exactly its limit in any
window and says so in OpenAI's headers and messages, and each fault reaches the client as the
real failure would (a status, a connection error, a read timeout, an unparseable 200).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from fakeserver import FakeServer, openai_duration, request_tokens

CHAT = "/chat/completions"
RATE_LIMIT_HEADERS = {
    f"x-ratelimit-{part}-{kind}"
    for part in ("limit", "remaining", "reset")
    for kind in ("requests", "tokens")
}
TRY_AGAIN = re.compile(r"Please try again in (\S+)\. ")


def chat(prompt: str, **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}], **fields}


def parse_duration(text: str) -> float:
    """Seconds in one of OpenAI's reset durations (``120ms``, ``59.99s``, ``6m0s``, ``1h2m3s``)."""
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(\d+(?:\.\d+)?)s", text)
    assert match, f"not an OpenAI duration: {text!r}"
    hours, minutes, seconds = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds)


def post_all(server: FakeServer, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """POST every body at once, each on its own connection, as a burst of workers would."""

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            return list(await asyncio.gather(*(client.post(CHAT, json=b) for b in bodies)))

    return asyncio.run(go())


def by_status(responses: list[httpx.Response]) -> dict[int, list[httpx.Response]]:
    grouped: dict[int, list[httpx.Response]] = {}
    for resp in responses:
        grouped.setdefault(resp.status_code, []).append(resp)
    return grouped


# -- formats -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "0s"),
        (0.12, "120ms"),
        (0.9996, "1s"),
        (1, "1s"),
        (8.64, "8.64s"),
        (59.99, "59.99s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (3725.5, "1h2m5.5s"),
    ],
)
def test_reset_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert openai_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds, abs=0.0005)


def test_request_tokens_count_prompt_plus_reserved_completion() -> None:
    prompt = "x" * 40  # 10 tokens at the server's 4 characters a token
    assert request_tokens(CHAT, chat(prompt)) == 10
    assert request_tokens(CHAT, chat(prompt, max_tokens=100)) == 110
    assert request_tokens(CHAT, chat(prompt, max_tokens=100, n=3)) == 310
    assert request_tokens(CHAT, chat(prompt, max_tokens=100, max_completion_tokens=7)) == 17
    assert request_tokens("/v1/embeddings", {"input": ["x" * 8, "y" * 8]}) == 5  # joined by \n
    assert request_tokens(CHAT, None) == 0


def test_knobs_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="reset_rate"):
        FakeServer(reset_rate=1.5)
    with pytest.raises(ValueError, match="limit_window_s"):
        FakeServer(limit_window_s=0)
    with pytest.raises(ValueError, match="rpm"):
        FakeServer(rpm=30, limit_window_s=1)  # half a request per second
    with pytest.raises(ValueError, match="outage_fault"):
        FakeServer(outage_fault="500")  # type: ignore[arg-type]


# -- rate limits ---------------------------------------------------------------------------------


def test_rpm_admits_exactly_the_limit_and_429s_the_rest() -> None:
    with FakeServer(rpm=10) as server:
        started = time.monotonic()
        grouped = by_status(post_all(server, [chat(f"q{i}") for i in range(15)]))
    assert sorted(grouped) == [200, 429] and len(grouped[200]) == 10
    assert sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in grouped[200]) == list(
        range(10)
    )
    elapsed = time.monotonic() - started
    for resp in grouped[429]:
        headers = resp.headers
        wait_ms = int(headers["retry-after-ms"])
        # The first admitted request leaves the minute window 60 s after it arrived.
        assert 60_000 - elapsed * 1000 - 1 <= wait_ms <= 60_000
        assert headers["retry-after"] == "60"
        assert headers["x-ratelimit-limit-requests"] == "10"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert 59 < parse_duration(headers["x-ratelimit-reset-requests"]) <= 60
        assert "x-ratelimit-limit-tokens" not in headers  # no tpm set, no token headers
        error = resp.json()["error"]
        assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
        assert error["message"].startswith(
            "Rate limit reached for gpt-4o-mini in organization org-fake on requests per min "
            "(RPM): Limit 10, Used 10, Requested 1. Please try again in "
        )
        [said] = TRY_AGAIN.findall(error["message"])
        assert parse_duration(said) == pytest.approx(wait_ms / 1000, abs=0.0005)
    log = server.requests
    assert [r.counted for r in log].count(True) == 10
    assert {(r.status, r.fault, r.counted) for r in log if r.status == 429} == {
        (429, "rate_limit", False)
    }
    assert server.max_accepted_in_window(60) == 10


@pytest.mark.slow
def test_per_second_window_admits_rpm_over_60_each_second() -> None:
    with FakeServer(rpm=600, limit_window_s=1) as server:
        grouped = by_status(post_all(server, [chat(f"burst {i}") for i in range(15)]))
        assert len(grouped[200]) == 10 and len(grouped[429]) == 5
        limited = grouped[429][0]
        wait_ms = int(limited.headers["retry-after-ms"])
        assert 0 < wait_ms <= 1000 and limited.headers["retry-after"] == "1"
        # The headers speak per minute, like OpenAI's, though the limit bites per second.
        assert limited.headers["x-ratelimit-limit-requests"] == "600"
        assert limited.headers["x-ratelimit-remaining-requests"] == "590"
        with httpx.Client(base_url=server.base_url) as client:
            assert client.post(CHAT, json=chat("too soon")).status_code == 429
            time.sleep(wait_ms / 1000)  # exactly as long as the server said
            assert client.post(CHAT, json=chat("on time")).status_code == 200
    assert server.max_accepted_in_window(1.0) == 10
    assert server.max_accepted_in_window(60.0) == 11


def test_tpm_counts_prompt_and_max_tokens_and_names_the_token_limit() -> None:
    body = chat("x" * 40, max_tokens=100)  # 10 prompt tokens + 100 reserved
    with FakeServer(tpm=600) as server, httpx.Client(base_url=server.base_url) as client:
        replies = [client.post(CHAT, json=body) for _ in range(6)]
        small = client.post(CHAT, json=chat("x" * 4, max_tokens=40))  # 41 tokens: still fits
        huge = client.post(CHAT, json=chat("x", max_tokens=1000))
    assert [r.status_code for r in replies] == [200] * 5 + [429]
    assert replies[0].json()["usage"]["prompt_tokens"] == 10
    assert replies[4].headers["x-ratelimit-remaining-tokens"] == "50"
    error = replies[5].json()["error"]
    assert error["type"] == "tokens"
    assert "on tokens per min (TPM): Limit 600, Used 550, Requested 110. Please" in error["message"]
    assert 59 < int(replies[5].headers["retry-after-ms"]) / 1000 <= 60
    assert small.status_code == 200 and small.headers["x-ratelimit-remaining-tokens"] == "9"
    # More than the whole limit can never fit, so OpenAI says so and gives no time to wait.
    assert huge.status_code == 429 and "retry-after-ms" not in huge.headers
    assert huge.json()["error"]["message"].startswith(
        "Request too large for gpt-4o-mini in organization org-fake on tokens per min (TPM): "
        "Limit 600, Requested 1001."
    )
    assert [r.tokens for r in server.requests] == [110] * 6 + [41, 1001]
    assert server.max_tokens_in_window(60) == 591
    assert server.max_accepted_in_window(60) == 6


def test_rate_limit_headers_ride_on_every_reply_but_only_when_limits_are_set() -> None:
    server = FakeServer(rpm=100, tpm=1000, error_500_rate=1.0)
    with server, httpx.Client(base_url=server.base_url) as client:
        failed = client.post(CHAT, json=chat("x" * 40))
        refused = client.post(CHAT, content=b"not json")
    assert failed.status_code == 500 and refused.status_code == 400
    for resp in (failed, refused):
        assert set(resp.headers) >= RATE_LIMIT_HEADERS
        assert resp.headers["x-ratelimit-remaining-requests"] == "99"  # the 400 never counted
        assert resp.headers["x-ratelimit-remaining-tokens"] == "990"
        assert 59 < parse_duration(resp.headers["x-ratelimit-reset-tokens"]) <= 60
    with FakeServer() as plain, httpx.Client(base_url=plain.base_url) as client:
        ok = client.post(CHAT, json=chat("hi"))
    assert not any(h.startswith("x-ratelimit") for h in ok.headers)
    assert plain.max_accepted_in_window(60) == 1  # without limits every good request counts


# -- faults --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors_at_rate_one(status: int) -> None:
    rate: dict[str, Any] = {f"error_{status}_rate": 1.0}
    server = FakeServer(**rate)
    with server, httpx.Client(base_url=server.base_url) as client:
        resp = client.post(CHAT, json=chat("hi"))
    assert resp.status_code == status
    assert resp.json()["error"]["type"] == "server_error"
    [logged] = server.requests
    assert (logged.status, logged.fault, logged.counted) == (status, str(status), True)


def test_reset_drops_the_connection_without_a_reply() -> None:
    with FakeServer(reset_rate=1.0) as server:
        with httpx.Client(base_url=server.base_url) as client:
            with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
                client.post(CHAT, json=chat("hi"))
            server.reset_rate = 0.0
            assert client.post(CHAT, json=chat("hi")).status_code == 200  # still serving

        async def with_aiohttp() -> None:
            async with aiohttp.ClientSession() as session:
                await session.post(server.base_url + CHAT, json=chat("again"))

        server.reset_rate = 1.0
        with pytest.raises(aiohttp.ClientConnectionError):
            asyncio.run(with_aiohttp())
    assert [(r.prompt, r.status, r.fault) for r in server.requests] == [
        ("hi", 0, "reset"),
        ("hi", 200, None),
        ("again", 0, "reset"),
    ]


@pytest.mark.slow
def test_hang_outlasts_the_client_timeout_and_is_logged_at_once() -> None:
    with FakeServer(hang_rate=1.0, hang_s=0.3) as server:
        with (
            httpx.Client(base_url=server.base_url, timeout=httpx.Timeout(5, read=0.1)) as client,
            pytest.raises(httpx.ReadTimeout),
        ):
            client.post(CHAT, json=chat("given up"))
        assert [(r.prompt, r.status, r.fault) for r in server.requests] == [("given up", 0, "hang")]
        with httpx.Client(base_url=server.base_url, timeout=2) as client:
            started = time.monotonic()
            waited = client.post(CHAT, json=chat("patient"))
            assert time.monotonic() - started >= 0.3
        time.sleep(0.3)  # let the first hang end: its client is gone, so nobody is answered
    assert waited.json()["choices"][0]["message"]["content"] == server.reply_text("patient")
    assert [(r.prompt, r.status, r.fault) for r in server.requests] == [
        ("given up", 0, "hang"),
        ("patient", 200, "hang"),
    ]


def test_stopping_does_not_wait_for_a_hang() -> None:
    server = FakeServer(hang_rate=1.0).start()  # hang_s: the default 30 s
    with (
        httpx.Client(base_url=server.base_url, timeout=httpx.Timeout(5, read=0.1)) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post(CHAT, json=chat("hi"))
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 1


def unusable(resp: httpx.Response, key: str) -> str:
    """Why a 200 body cannot be used: ``"truncated"`` or ``"missing"`` ``key``."""
    try:
        data = json.loads(resp.content)
    except json.JSONDecodeError:
        return "truncated"
    assert key not in data
    return "missing"


def test_malformed_replies_are_200s_no_client_can_use() -> None:
    with FakeServer(malformed_rate=1.0) as server:
        chats = post_all(server, [chat(f"prompt {i}") for i in range(16)])
        with httpx.Client(base_url=server.base_url) as client:
            embeddings = [
                client.post("/embeddings", json={"input": f"text {i}"}) for i in range(16)
            ]
    assert {r.status_code for r in chats + embeddings} == {200}
    assert {unusable(r, "choices") for r in chats} == {"truncated", "missing"}
    assert {unusable(r, "data") for r in embeddings} == {"truncated", "missing"}
    assert {r.fault for r in server.requests} == {"malformed"}


@pytest.mark.slow
def test_reject_rate_fails_the_same_prompts_on_every_attempt() -> None:
    prompts = [f"prompt {i}" for i in range(30)]
    with FakeServer(reject_rate=0.3, seed=5) as server:
        rounds = [post_all(server, [chat(p) for p in prompts]) for _ in range(3)]
    rejected = {p for p, r in zip(prompts, rounds[0], strict=True) if r.status_code == 400}
    assert 0 < len(rejected) < len(prompts)
    assert rejected == {p for p in prompts if server.would_reject(p)}
    for replies in rounds[1:]:
        assert {
            p for p, r in zip(prompts, replies, strict=True) if r.status_code == 400
        } == rejected
    assert rounds[0][prompts.index(min(rejected))].json()["error"]["type"] == (
        "invalid_request_error"
    )
    assert {r.fault for r in server.requests if r.status == 400} == {"reject"}


def outcomes(server: FakeServer, prompts: list[str]) -> list[tuple[int, str | None]]:
    """Send each prompt once, in turn; the (status, fault) the server logged for each."""
    with httpx.Client(base_url=server.base_url) as client:
        for prompt in prompts:
            client.post(CHAT, json=chat(prompt))
    return [(r.status, r.fault) for r in server.requests[-len(prompts) :]]


@pytest.mark.slow
def test_faults_are_deterministic_per_seed_and_redrawn_on_retry() -> None:
    prompts = [f"prompt {i}" for i in range(40)]
    rates: dict[str, Any] = {"error_500_rate": 0.2, "error_503_rate": 0.2, "malformed_rate": 0.2}
    with FakeServer(seed=3, **rates) as server:
        first = outcomes(server, prompts)
        # Retrying a failed prompt draws afresh, so every prompt gets through in the end.
        failed = [p for p, (_, fault) in zip(prompts, first, strict=True) if fault is not None]
        for _ in range(30):
            failed = [p for p, (_, f) in zip(failed, outcomes(server, failed), strict=True) if f]
            if not failed:
                break
        assert failed == []
    assert {fault for _, fault in first} == {None, "500", "503", "malformed"}
    with FakeServer(seed=3, **rates) as same:
        assert outcomes(same, prompts) == first
    with FakeServer(seed=4, **rates) as other:
        assert outcomes(other, prompts) != first


def test_fault_shares_exclude_one_another_and_add_up() -> None:
    with FakeServer(error_500_rate=0.5, error_503_rate=0.5) as server:
        statuses = [status for status, _ in outcomes(server, [f"p{i}" for i in range(40)])]
    assert set(statuses) == {500, 503}  # together they are every attempt, none answered 200


# -- outage --------------------------------------------------------------------------------------


def test_outage_answers_503_until_it_ends_and_counts_against_no_limit() -> None:
    with FakeServer(rpm=100) as server, httpx.Client(base_url=server.base_url) as client:
        server.start_outage(0.3)
        down = client.post(CHAT, json=chat("hi"))
        models = client.get("/models")
        time.sleep(0.3)
        up = client.post(CHAT, json=chat("hi"))
    assert (down.status_code, models.status_code, up.status_code) == (503, 503, 200)
    assert down.json()["error"]["type"] == "server_error"
    assert [(r.status, r.fault, r.counted) for r in server.requests] == [
        (503, "outage", False),
        (503, "outage", False),
        (200, None, True),
    ]
    assert up.headers["x-ratelimit-remaining-requests"] == "99"


def test_outage_can_reset_connections_instead() -> None:
    outage_until = time.monotonic() + 60
    server = FakeServer(outage_until=outage_until, outage_fault="reset")
    with server, httpx.Client(base_url=server.base_url) as client:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            client.post(CHAT, json=chat("hi"))
        server.outage_until = None
        assert client.post(CHAT, json=chat("hi")).status_code == 200
    assert [r.fault for r in server.requests] == ["outage", None]


# -- as a process --------------------------------------------------------------------------------


@pytest.mark.slow
def test_process_enforces_limits_and_faults_from_its_flags() -> None:
    script = Path(__file__).with_name("fakeserver")
    flags = ["--rpm", "60", "--limit-window", "1", "--error-503-rate", "1"]
    proc = subprocess.Popen(
        [sys.executable, str(script), "--port", "0", *flags],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        assert ready[0] == "READY"
        url = f"http://127.0.0.1:{ready[1]}/v1{CHAT}"
        with httpx.Client() as client:
            first, second = (client.post(url, json=chat(p)) for p in ("a", "b"))
        assert (first.status_code, second.status_code) == (503, 429)
        assert second.headers["x-ratelimit-limit-requests"] == "60"
        assert 0 < int(second.headers["retry-after-ms"]) <= 1000
    finally:
        proc.terminate()
        proc.wait(timeout=5)
        assert proc.stdout is not None
        proc.stdout.close()


def test_status_for_model_fails_only_that_models_requests_in_each_dialect() -> None:
    with FakeServer(status_for_model={"broken": 500}) as server, httpx.Client() as client:
        base = server.base_url
        broken = client.post(base + CHAT, json={**chat("a"), "model": "broken"})
        fine = client.post(base + CHAT, json=chat("b"))
        anthropic = {
            "model": "broken",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "c"}],
        }
        headers = {"anthropic-version": "2023-06-01"}
        claude = client.post(base + "/messages", json=anthropic, headers=headers)
        claude_fine = client.post(
            base + "/messages", json={**anthropic, "model": "claude-haiku-4-5"}, headers=headers
        )
    assert (broken.status_code, fine.status_code) == (500, 200)
    assert broken.json()["error"]["type"] == "server_error"
    assert (claude.status_code, claude_fine.status_code) == (500, 200)
    assert claude.json()["error"]["type"] == "api_error"
