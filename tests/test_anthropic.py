"""The Anthropic provider: translation and classification over httpx.MockTransport, then real
`aiq run --provider anthropic` subprocesses against the fake server's ``/v1/messages``."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import API_KEY, aiq_env, read_jsonl, run_aiq
from fakes import Recorder
from fakeserver import FakeServer

from aiq.config import Config
from aiq.inputs import Defaults, LineError, parse_line
from aiq.providers.anthropic import DEFAULT_MAX_TOKENS, AnthropicProvider
from aiq.providers.base import ProviderError, Reply
from aiq.providers.openai import OpenAIProvider
from aiq.transport import AiohttpTransport

KEY = "sk-ant-test-0123456789"
CHAT = "/v1/chat/completions"


def message(text: str = "hi", *, tokens: tuple[int, int] = (11, 5)) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]},
    }


def anthropic_ok() -> httpx.Response:
    """Anthropic's 200: a Message, with its request id."""
    return httpx.Response(200, json=message(), headers={"request-id": "req_1"})


def send(
    endpoint: str,
    body: dict[str, Any] | bytes,
    recorder: Recorder,
    *,
    base_url: str = "https://api.anthropic.com",
    **kwargs: Any,
) -> Reply:
    provider = AnthropicProvider(
        httpx.MockTransport(recorder), base_url=base_url, api_key=KEY, **kwargs
    )
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return asyncio.run(provider.send(endpoint, raw))


def refused(endpoint: str, body: dict[str, Any]) -> ProviderError:
    """The error for a job that must never reach the server."""
    recorder = Recorder(anthropic_ok())
    with pytest.raises(ProviderError) as info:
        send(endpoint, body, recorder)
    assert recorder.requests == []
    return info.value


# -- translation -------------------------------------------------------------------------------


def test_chat_job_becomes_a_messages_request() -> None:
    recorder = Recorder(anthropic_ok())
    body = {
        "model": "claude-test",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": [{"type": "text", "text": "And now?"}]},
        ],
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": "END",
        "user": "u-42",
        "n": 1,
    }
    reply = send(CHAT, body, recorder)

    request = recorder.requests[0]
    assert request.method == "POST" and str(request.url) == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers
    assert recorder.body == {
        "model": "claude-test",
        "system": "Be brief.\n\nAnswer in French.",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": [{"type": "text", "text": "And now?"}]},
        ],
        "max_tokens": DEFAULT_MAX_TOKENS,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-42"},
    }
    assert (reply.status_code, reply.request_id, reply.tokens_in, reply.tokens_out) == (
        200,
        "req_1",
        11,
        5,
    )
    assert orjson.loads(reply.body) == message()  # the reply is kept as Anthropic sent it


@pytest.mark.parametrize(
    ("fields", "kwargs", "expected"),
    [
        ({}, {}, 1024),
        ({}, {"default_max_tokens": 77}, 77),
        ({"max_tokens": 50}, {"default_max_tokens": 77}, 50),
        ({"max_tokens": 50, "max_completion_tokens": 60}, {}, 60),
    ],
)
def test_max_tokens_from_the_job_else_the_default(
    fields: dict[str, int], kwargs: dict[str, Any], expected: int
) -> None:
    recorder = Recorder(anthropic_ok())
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    send(CHAT, body, recorder, **kwargs)
    assert recorder.body["max_tokens"] == expected
    assert "max_completion_tokens" not in recorder.body


def test_prompt_job_and_base_url_ending_in_v1() -> None:
    recorder = Recorder(anthropic_ok())
    send("/v1/completions", {"model": "m", "prompt": ["Say hi"]}, recorder, base_url="http://h/v1/")
    assert str(recorder.requests[0].url) == "http://h/v1/messages"
    assert recorder.body == {
        "model": "m",
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": DEFAULT_MAX_TOKENS,
    }


def test_image_parts_become_image_blocks() -> None:
    recorder = Recorder(anthropic_ok())
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]
    send(CHAT, {"model": "m", "messages": [{"role": "user", "content": parts}]}, recorder)
    assert recorder.body["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]


def test_messages_job_is_sent_byte_for_byte() -> None:
    recorder = Recorder(anthropic_ok())
    raw = b'{"max_tokens":9,"messages":[{"content":"x","role":"user"}],"model":"m","system":"s"}'
    send("/v1/messages", raw, recorder)
    assert recorder.requests[0].content == raw
    recorder = Recorder(anthropic_ok())
    send("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, recorder)
    assert recorder.body["max_tokens"] == DEFAULT_MAX_TOKENS  # Anthropic requires one


USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("endpoint", "body", "says"),
    [
        ("/v1/embeddings", {"model": "m", "input": "x"}, "Anthropic has no embeddings endpoint"),
        (CHAT, {"model": "m", "messages": USER, "n": 3}, "n=3"),
        (CHAT, {"model": "m", "messages": USER, "stream": True}, "stream"),
        (CHAT, {"model": "m", "messages": USER, "response_format": {}}, "'response_format'"),
        (CHAT, {"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "role 'tool'"),
        (CHAT, {"model": "m", "messages": [{"role": "system", "content": "s"}]}, "no user"),
        (
            CHAT,
            {"model": "m", "messages": [{"role": "user", "content": "x", "name": "bob"}]},
            "messages[0].name",
        ),
        (
            CHAT,
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "'input_audio'",
        ),
        ("/v1/completions", {"model": "m", "prompt": ["a", "b"]}, "2 prompts"),
    ],
)
def test_jobs_without_a_faithful_translation_are_refused_unsent(
    endpoint: str, body: dict[str, Any], says: str
) -> None:
    err = refused(endpoint, body)
    assert says in err.message
    assert (err.error_type, err.retryable, err.fatal) == ("invalid_request", False, False)


def test_openai_provider_refuses_a_messages_job_unsent() -> None:
    recorder = Recorder(anthropic_ok())
    provider = OpenAIProvider(httpx.MockTransport(recorder), base_url="http://h/v1", api_key=None)
    with pytest.raises(ProviderError) as info:
        asyncio.run(provider.send("/v1/messages", b'{"model":"m"}'))
    assert "--provider anthropic" in info.value.message
    assert not info.value.fatal and not info.value.retryable and recorder.requests == []


# -- replies and errors --------------------------------------------------------------------------


def anthropic_error(status: int, kind: str, text: str, **headers: str) -> httpx.Response:
    body = {"type": "error", "error": {"type": kind, "message": text}}
    return httpx.Response(status, json=body, headers=headers)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (anthropic_error(401, "authentication_error", "invalid x-api-key"), ("auth", False, True)),
        (anthropic_error(403, "permission_error", "no"), ("auth", False, True)),
        (anthropic_error(404, "not_found_error", "model: x"), ("not_found", False, True)),
        (
            anthropic_error(400, "invalid_request_error", "Your credit balance is too low."),
            ("quota", False, True),
        ),
        (anthropic_error(400, "invalid_request_error", "bad"), ("invalid_request", False, False)),
        (anthropic_error(529, "overloaded_error", "Overloaded"), ("server", True, False)),
        (anthropic_error(500, "api_error", "oops"), ("server", True, False)),
        (anthropic_error(429, "rate_limit_error", "slow down"), ("rate_limit", True, False)),
        (httpx.Response(200, json={"type": "message"}), ("bad_response", True, False)),
    ],
)
def test_errors_are_classified(reply: httpx.Response, expected: tuple[str, bool, bool]) -> None:
    with pytest.raises(ProviderError) as info:
        send(CHAT, {"model": "m", "messages": USER}, Recorder(reply))
    err = info.value
    assert (err.error_type, err.retryable, err.fatal) == expected
    assert KEY not in err.message
    if err.fatal and err.error_type == "auth":
        assert "ANTHROPIC_API_KEY" in err.message
    if reply.status_code != 200:
        assert err.status_code == reply.status_code
        assert err.message.startswith(f"HTTP {reply.status_code}: ")


def test_rate_limit_headers_and_retry_after_are_read() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2099-01-01T00:00:00Z",
        "anthropic-ratelimit-tokens-limit": "40000",
        "anthropic-ratelimit-tokens-remaining": "39000",
        "anthropic-ratelimit-tokens-reset": "2000-01-01T00:00:00Z",
        "retry-after": "7",
    }
    with pytest.raises(ProviderError) as info:
        send(
            CHAT,
            {"model": "m", "messages": USER},
            Recorder(anthropic_error(429, "x", "y", **headers)),
        )
    err = info.value
    assert err.retry_after_s == 7.0
    assert err.limits is not None
    assert (err.limits.requests.limit, err.limits.requests.remaining) == (50, 0)
    assert err.limits.requests.reset_s is not None and err.limits.requests.reset_s > 1e9
    assert (err.limits.tokens.limit, err.limits.tokens.remaining) == (40000, 39000)
    assert err.limits.tokens.reset_s == 0.0  # a reset in the past is now

    ok = httpx.Response(200, json=message(), headers=headers)
    reply = send(CHAT, {"model": "m", "messages": USER}, Recorder(ok))
    assert reply.limits is not None and reply.limits.tokens.remaining == 39000


# -- input lines and config ----------------------------------------------------------------------


def test_message_batches_line_is_a_fourth_shape() -> None:
    line = {
        "custom_id": "r1",
        "params": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
    }
    req = parse_line(orjson.dumps(line), 1, Defaults(model="claude-x", system="Be brief."))
    assert (req.custom_id, req.endpoint) == ("r1", "/v1/messages")
    assert orjson.loads(req.body) == {  # a complete request: the model default only
        "model": "claude-x",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    for bad, reason in [
        ({"custom_id": "r", "params": {"model": "m"}}, "params.messages"),
        ({"custom_id": "r", "params": [], "x": 1}, "'x': not allowed beside 'params'"),
        ({"custom_id": "r", "params": "Hi"}, "'params': expected an object"),
    ]:
        with pytest.raises(LineError, match=reason):
            parse_line(orjson.dumps(bad), 1, Defaults(model="m"))


def test_config_for_anthropic() -> None:
    env = {"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": "sk-o", "OPENAI_BASE_URL": "http://o/v1"}
    config = Config.resolve(config_path=None, env=env, flags={"provider": "anthropic"})
    assert (config.base_url, config.api_key_env, config.api_key) == (
        "https://api.anthropic.com",
        "ANTHROPIC_API_KEY",
        KEY,
    )
    assert KEY not in repr(config)
    env["ANTHROPIC_BASE_URL"] = "http://a"
    flags = {"provider": "anthropic", "api_key_env": "MY_KEY"}
    config = Config.resolve(config_path=None, env={**env, "MY_KEY": "k2"}, flags=flags)
    assert (config.base_url, config.api_key) == ("http://a", "k2")
    flags = {"provider": "anthropic", "base_url": "http://flag"}
    assert Config.resolve(config_path=None, env=env, flags=flags).base_url == "http://flag"


# -- the fake server's /v1/messages, and real runs against it ----------------------------------


def test_fake_server_checks_like_anthropic() -> None:
    good = {"model": "m", "max_tokens": 5, "messages": USER}
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    with FakeServer(require_key=API_KEY) as server, httpx.Client() as client:
        url = server.base_url + "/messages"
        cases = [
            ({**headers, "x-api-key": "wrong"}, good, 401, "authentication_error"),
            ({"x-api-key": API_KEY}, good, 400, "invalid_request_error"),
            (headers, {**good, "max_tokens": None}, 400, "invalid_request_error"),
            (headers, {**good, "n": 2}, 400, "invalid_request_error"),
            (headers, {**good, "messages": [{"role": "system", "content": "s"}]}, 400, None),
        ]
        for sent_headers, body, status, kind in cases:
            resp = client.post(url, json=body, headers=sent_headers)
            assert resp.status_code == status, (sent_headers, body)
            assert resp.json()["type"] == "error"
            assert kind is None or resp.json()["error"]["type"] == kind
        resp = client.post(url, json={**good, "system": "s"}, headers=headers)
        assert resp.status_code == 200 and resp.headers["request-id"].startswith("req_")
        assert resp.json()["content"][0]["text"] == server.reply_text("x")
        assert resp.json()["usage"] == {"input_tokens": 1, "output_tokens": 13}


def _env(key: str = API_KEY) -> dict[str, str]:
    env = aiq_env(ANTHROPIC_API_KEY=key)
    env.pop("ANTHROPIC_BASE_URL", None)
    return env


def _run(
    tmp_path: Path, server: FakeServer, file: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``aiq run FILE --provider anthropic`` against ``server``, the summary as JSON."""
    args = ["run", file, "--provider", "anthropic", "--base-url", server.base_url]
    return run_aiq(*args, "--model", "claude-x", "--json", *extra, cwd=tmp_path, env=env or _env())


@pytest.mark.slow
def test_run_on_anthropic_writes_batch_api_results(tmp_path: Path, server: FakeServer) -> None:
    lines: list[dict[str, Any]] = [
        {"custom_id": f"p{i}", "prompt": f"question {i}?", "system": "Be brief."} for i in range(20)
    ]
    parts = [{"type": "text", "text": "chat question?"}]
    lines += [
        {
            "custom_id": "c1",
            "messages": [{"role": "system", "content": "S1"}, {"role": "user", "content": parts}],
        },
        {"custom_id": "bad", "prompt": "FAIL_PERMANENT please"},
        {"custom_id": "emb", "url": "/v1/embeddings", "method": "POST", "body": {"input": "x"}},
        {"custom_id": "n2", "messages": USER, "n": 2},
    ]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    proc = _run(tmp_path, server, "a.jsonl")

    assert proc.returncode == 1, proc.stderr  # three lines dead-letter
    results = {r["custom_id"]: r for r in read_jsonl(tmp_path / "a.results.jsonl")}
    assert sorted(results) == sorted([f"p{i}" for i in range(20)] + ["c1"])
    for cid, r in results.items():
        prompt = "chat question?" if cid == "c1" else f"question {cid[1:]}?"
        assert r["error"] is None and r["id"]
        assert r["response"]["status_code"] == 200
        assert r["response"]["request_id"].startswith("req_")
        body = r["response"]["body"]
        assert body["type"] == "message" and body["id"].startswith("msg_")
        assert body["content"] == [{"type": "text", "text": server.reply_text(prompt)}]
    # What the server saw: Anthropic's headers and shape, never the key in the log of bodies.
    seen = server.requests
    assert {r.path for r in seen} == {"/v1/messages"}
    assert all(r.had_api_key and not r.had_authorization for r in seen)
    assert {r.anthropic_version for r in seen} == {"2023-06-01"}
    systems = {r.prompt: r.body.get("system") for r in seen}
    assert systems["question 3?"] == "Be brief." and systems["chat question?"] == "S1"
    assert all(m["role"] == "user" for r in seen for m in r.body["messages"])
    assert {r.body["max_tokens"] for r in seen} == {1024}
    assert len(seen) == 22  # the embeddings and n=2 jobs were never sent
    # Tokens are Anthropic's usage, summed.
    summary = json.loads(proc.stdout)
    usages = [r["response"]["body"]["usage"] for r in results.values()]
    assert summary["tokens_in"] == sum(u["input_tokens"] for u in usages)
    assert summary["tokens_out"] == sum(u["output_tokens"] for u in usages)
    dead = {d["custom_id"]: d["error"] for d in read_jsonl(tmp_path / "a.dead.jsonl")}
    assert dead["bad"]["status_code"] == 400 and dead["bad"]["type"] == "invalid_request"
    assert "Anthropic has no embeddings endpoint" in dead["emb"]["message"]
    assert "n=2" in dead["n2"]["message"] and dead["n2"]["status_code"] is None
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path
    assert API_KEY not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_message_batches_file_runs_as_is(tmp_path: Path, server: FakeServer) -> None:
    params = [
        {
            "model": "claude-y",
            "max_tokens": 20,
            "system": "Terse.",
            "messages": [{"role": "user", "content": "one"}],
        },
        {"messages": [{"role": "user", "content": "two"}], "temperature": 0.5},
    ]
    lines = [{"custom_id": f"b{i}", "params": p} for i, p in enumerate(params)]
    (tmp_path / "mb.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    proc = _run(tmp_path, server, "mb.jsonl")

    assert proc.returncode == 0, proc.stderr
    bodies = {r.prompt: r.body for r in server.requests}
    assert bodies["one"] == params[0]
    assert bodies["two"] == {**params[1], "model": "claude-x", "max_tokens": 1024}
    results = read_jsonl(tmp_path / "mb.results.jsonl")
    assert sorted(r["custom_id"] for r in results) == ["b0", "b1"]
    assert all(r["response"]["body"]["type"] == "message" for r in results)

    # The same lines on an OpenAI-compatible provider dead-letter, unsent, saying what to do.
    other = tmp_path / "openai"
    other.mkdir()
    (other / "mb.jsonl").write_text((tmp_path / "mb.jsonl").read_text())
    sent = len(server.requests)
    proc = run_aiq("run", "mb.jsonl", "--base-url", server.base_url, "--model", "m", cwd=other)
    assert proc.returncode == 1, proc.stderr
    dead = read_jsonl(other / "mb.dead.jsonl")
    assert len(dead) == 2 and all("--provider anthropic" in d["error"]["message"] for d in dead)
    assert len(server.requests) == sent


@pytest.mark.slow
def test_bad_key_exits_4_and_keeps_every_job(tmp_path: Path, server: FakeServer) -> None:
    lines = [{"custom_id": f"k{i}", "prompt": f"k {i}"} for i in range(40)]
    (tmp_path / "k.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    proc = _run(tmp_path, server, "k.jsonl", "--concurrency", "4", env=_env("sk-ant-wrong"))

    assert proc.returncode == 4, proc.stderr
    assert "ANTHROPIC_API_KEY" in proc.stderr and "sk-ant-wrong" not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert {r.status for r in server.requests} == {401}
    assert len(server.requests) <= 4  # stopped after the first wave
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    assert status["counts"]["queued"] == 40 and status["counts"]["dead"] == 0


@pytest.mark.slow
def test_overloaded_529_is_retried_to_success(tmp_path: Path) -> None:
    (tmp_path / "aiq.yaml").write_text("backoff_base_s: 0.01\nbackoff_cap_s: 0.05\n")
    lines = [{"custom_id": f"o{i}", "prompt": f"o {i}"} for i in range(30)]
    (tmp_path / "o.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with FakeServer(require_key=API_KEY, error_503_rate=0.4, seed=3) as server:
        proc = _run(tmp_path, server, "o.jsonl", "--max-attempts", "20")
        seen = server.requests

    assert proc.returncode == 0, proc.stderr
    assert len(read_jsonl(tmp_path / "o.results.jsonl")) == 30
    overloaded = [r for r in seen if r.status == 529]
    assert overloaded, "the fault knob produced no 529"
    last = {r.prompt: r.status for r in seen}  # the log is in order: the last try of each
    assert set(last.values()) == {200} and len(last) == 30
    assert json.loads(proc.stdout)["retries"] == len(overloaded)


def test_rate_limit_headers_over_real_http() -> None:
    async def go(server: FakeServer) -> tuple[list[Reply], ProviderError]:
        transport = AiohttpTransport(max_connections=2)
        provider = AnthropicProvider(transport, base_url=server.base_url, api_key=API_KEY)
        body = orjson.dumps({"model": "m", "max_tokens": 10, "messages": USER})
        try:
            replies = [await provider.send("/v1/messages", body) for _ in range(2)]
            with pytest.raises(ProviderError) as info:
                await provider.send("/v1/messages", body)
            return replies, info.value
        finally:
            await transport.aclose()

    with FakeServer(require_key=API_KEY, rpm=2, tpm=1000) as server:
        replies, err = asyncio.run(go(server))

    assert [r.limits.requests.remaining for r in replies if r.limits] == [1, 0]
    first = replies[0].limits
    assert first is not None and (first.requests.limit, first.tokens.limit) == (2, 1000)
    assert first.tokens.remaining == 1000 - 11  # 1 prompt token + max_tokens 10
    assert first.requests.reset_s is not None and 58 < first.requests.reset_s <= 60
    assert (err.error_type, err.status_code, err.retryable) == ("rate_limit", 429, True)
    assert err.retry_after_s is not None and 55 < err.retry_after_s <= 60
    assert err.limits is not None and err.limits.requests.remaining == 0


@pytest.mark.slow
def test_prompt_cache_tokens_are_counted_and_priced_as_anthropic_bills_them(
    tmp_path: Path, server: FakeServer
) -> None:
    # input_tokens leaves out the cached part of a prompt: a cache write costs 1.25x the input
    # price (2x for the 1-hour cache), a read 0.1x. Counting input_tokens alone would show a
    # cached batch as nearly free, and let --max-cost overspend.
    (tmp_path / "aiq.yaml").write_text("prices:\n  claude-x: {input: 3, output: 15}\n")
    shared = "You answer questions about one long document. " * 40
    lines = []
    for i, ttl in enumerate(["5m", "5m", "5m", "1h", "1h"]):
        control = {"type": "ephemeral", "ttl": ttl}
        system = [{"type": "text", "text": f"[{ttl}] " + shared, "cache_control": control}]
        params = {"system": system, "messages": [{"role": "user", "content": f"question {i}?"}]}
        lines.append({"custom_id": f"c{i}", "params": params})
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    proc = _run(tmp_path, server, "c.jsonl", "--concurrency", "1")  # one at a time: write, read

    assert proc.returncode == 0, proc.stderr
    usage = {
        r["custom_id"]: r["response"]["body"]["usage"]
        for r in read_jsonl(tmp_path / "c.results.jsonl")
    }
    writes = [c for c in sorted(usage) if usage[c]["cache_creation_input_tokens"]]
    assert writes == ["c0", "c3"]  # each cache written once (5-minute, 1-hour), then read
    db = sqlite3.connect(tmp_path / ".aiq" / "aiq.db")
    try:
        stored = {
            cid: (tokens_in, cost)
            for cid, tokens_in, cost in db.execute(
                "SELECT i.custom_id, j.tokens_in, j.cost_usd FROM items i "
                "JOIN jobs j ON j.k64 = i.job_k64"
            )
        }
    finally:
        db.close()
    for cid, u in usage.items():
        tokens_in, cost = stored[cid]
        written, read = u["cache_creation_input_tokens"], u["cache_read_input_tokens"]
        assert tokens_in == u["input_tokens"] + written + read > u["input_tokens"]
        hour = u["cache_creation"]["ephemeral_1h_input_tokens"]
        billed = u["input_tokens"] + 1.25 * (written - hour) + 2 * hour + 0.1 * read
        assert cost == pytest.approx((billed * 3 + u["output_tokens"] * 15) / 1e6)
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    assert status["tokens_in"] == sum(tokens_in for tokens_in, _ in stored.values())
