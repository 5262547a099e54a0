"""The test doubles and the HTTP stack, checked against the real thing.

- ``FakeServer`` (tests/fakeserver) and ``SimulatedTransport`` answer in shapes the official
  ``openai`` package's types accept, so neither can drift from the real API.
- ``aiq.transport`` delivers replies, and fails with the same httpx exception classes httpx's own
  transport raises, so providers classify errors the same whichever transport is underneath.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakeserver import FakeServer
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.shared import ErrorObject
from pydantic import BaseModel

from aiq.providers.simulated import SimulatedTransport, reply_text
from aiq.transport import CONNECTING, AiohttpTransport, make_client

KEY = "sk-test-secret-0123456789"
BODIES: dict[str, dict[str, Any]] = {
    "/chat/completions": {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name three rivers."},
        ],
    },
    "/completions": {"model": "gpt-3.5-turbo-instruct", "prompt": "Name three rivers."},
    "/embeddings": {"model": "text-embedding-3-small", "input": ["rivers", "lakes"]},
}
TYPES: dict[str, type[BaseModel]] = {
    "/chat/completions": ChatCompletion,
    "/completions": Completion,
    "/embeddings": CreateEmbeddingResponse,
}


def chat(prompt: str) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}]}


def assert_openai_shape(path: str, data: dict[str, Any]) -> BaseModel:
    """Validate strictly, and refuse keys the type does not know (its config allows extras)."""
    model = TYPES[path].model_validate(data, strict=True)
    assert_no_extras(model)
    return model


def assert_no_extras(value: Any) -> None:
    if isinstance(value, BaseModel):
        assert not value.model_extra, f"{type(value).__name__} has unknown keys {value.model_extra}"
        for field in type(value).model_fields:
            assert_no_extras(getattr(value, field))
    elif isinstance(value, list):
        for item in value:
            assert_no_extras(item)


def assert_openai_error(data: dict[str, Any], *, type_: str) -> None:
    assert set(data) == {"error"}
    assert set(data["error"]) == {"message", "type", "param", "code"}
    error = ErrorObject.model_validate(data["error"], strict=True)
    assert error.type == type_
    assert error.message


# -- FakeServer -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", list(BODIES))
def test_fake_server_replies_validate_as_openai_types(path: str) -> None:
    with FakeServer() as server, httpx.Client(base_url=server.base_url) as client:
        resp = client.post(path, json=BODIES[path])
    assert resp.status_code == 200
    assert resp.headers["x-request-id"]
    model = assert_openai_shape(path, resp.json())
    if isinstance(model, ChatCompletion):
        assert model.choices[0].message.content == server.reply_text("Name three rivers.")
    elif isinstance(model, Completion):
        assert model.choices[0].text == server.reply_text("Name three rivers.")
    else:
        assert isinstance(model, CreateEmbeddingResponse)
        assert [d.index for d in model.data] == [0, 1]


def test_fake_server_lists_models() -> None:
    with FakeServer() as server, httpx.Client(base_url=server.base_url) as client:
        resp = client.get("/models")
    assert resp.status_code == 200
    assert resp.json()["object"] == "list"
    assert {m["object"] for m in resp.json()["data"]} == {"model"}


def test_reject_marker_gives_400_until_switched_off() -> None:
    with FakeServer() as server, httpx.Client(base_url=server.base_url) as client:
        resp = client.post("/chat/completions", json=chat("please FAIL_PERMANENT now"))
        assert resp.status_code == 400
        assert_openai_error(resp.json(), type_="invalid_request_error")

        server.reject_marker = None  # a test "fixes" the prompt's fate and replays it
        resp = client.post("/chat/completions", json=chat("please FAIL_PERMANENT now"))
        assert resp.status_code == 200
    assert [r.status for r in server.requests] == [400, 200]
    assert server.count_for("please FAIL_PERMANENT now") == 2


def test_require_key_gives_401_without_the_key_and_never_logs_it() -> None:
    with FakeServer(require_key=KEY) as server, httpx.Client(base_url=server.base_url) as client:
        missing = client.post("/chat/completions", json=chat("hi"))
        wrong = client.post("/chat/completions", json=chat("hi"), headers=auth("sk-wrong"))
        right = client.post("/chat/completions", json=chat("hi"), headers=auth(KEY))
        models = client.get("/models")
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert models.status_code == 401
    assert_openai_error(missing.json(), type_="invalid_request_error")
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert [r.had_authorization for r in server.requests] == [False, True, True, False]
    assert KEY not in repr(server.requests)


@pytest.mark.parametrize(
    ("status", "type_"),
    [(401, "invalid_request_error"), (404, "invalid_request_error"), (500, "server_error")],
)
def test_status_for_all_answers_everything_with_openai_errors(status: int, type_: str) -> None:
    with FakeServer(status_for_all=status) as server, httpx.Client(base_url=server.base_url) as c:
        resp = c.post("/embeddings", json=BODIES["/embeddings"])
        assert resp.status_code == status
        assert_openai_error(resp.json(), type_=type_)
        server.status_for_all = None
        assert c.post("/embeddings", json=BODIES["/embeddings"]).status_code == 200


def statuses(server: FakeServer, prompts: list[str]) -> list[int]:
    with httpx.Client(base_url=server.base_url) as client:
        return [client.post("/chat/completions", json=chat(p)).status_code for p in prompts]


@pytest.mark.slow
def test_transient_errors_are_deterministic_and_redrawn_on_retry() -> None:
    prompts = [f"prompt {i}" for i in range(40)]
    with FakeServer(transient_rate=0.5, seed=7, retry_after_s=1.5) as server:
        first = statuses(server, prompts)
        with httpx.Client(base_url=server.base_url) as client:
            # A failed request gets a fresh draw each time, so retrying ends in success.
            retried = {p: [first[i]] for i, p in enumerate(prompts)}
            for prompt, history in retried.items():
                while history[-1] != 200 and len(history) < 30:
                    resp = client.post("/chat/completions", json=chat(prompt))
                    history.append(resp.status_code)
                    if resp.status_code == 429:
                        limited = resp
    assert set(first) == {200, 429, 500}
    assert all(history[-1] == 200 for history in retried.values())
    assert (limited.headers["retry-after"], limited.headers["retry-after-ms"]) == ("2", "1500")
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    with FakeServer(transient_rate=0.5, seed=7) as same_seed:
        assert statuses(same_seed, prompts) == first
    with FakeServer(transient_rate=0.5, seed=8) as other_seed:
        assert statuses(other_seed, prompts) != first


def test_request_log_records_each_request() -> None:
    with FakeServer() as server, httpx.Client(base_url=server.base_url) as client:
        for prompt in ["a", "b", "a"]:
            client.post("/chat/completions", json=chat(prompt))
        client.post("/chat/completions", content=b"not json")
    log = server.requests
    assert [(r.method, r.path, r.prompt, r.status) for r in log] == [
        ("POST", "/v1/chat/completions", "a", 200),
        ("POST", "/v1/chat/completions", "b", 200),
        ("POST", "/v1/chat/completions", "a", 200),
        ("POST", "/v1/chat/completions", "", 400),
    ]
    assert log[0].body == chat("a")
    assert log[3].body is None
    # No faults by default; a body that is not JSON never reaches the model, so it costs nothing.
    assert [(r.fault, r.counted, r.tokens) for r in log] == [(None, True, 1)] * 3 + [
        (None, False, 0)
    ]
    assert all(r.received <= r.monotonic for r in log)
    assert [r.monotonic for r in log] == sorted(r.monotonic for r in log)
    assert all(abs(r.wall - time.time()) < 60 for r in log)
    assert (server.count_for("a"), server.count_for("b"), server.count_for("c")) == (2, 1, 0)


def test_latency_delays_each_reply() -> None:
    with FakeServer(latency_s=0.1) as server, httpx.Client(base_url=server.base_url) as client:
        start = time.monotonic()
        client.post("/chat/completions", json=chat("slow"))
        assert time.monotonic() - start >= 0.1


@pytest.mark.slow
def test_fake_server_runs_as_a_process() -> None:
    script = Path(__file__).with_name("fakeserver")
    proc = subprocess.Popen(
        [sys.executable, str(script), "--port", "0", "--latency", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        assert ready[0] == "READY"
        resp = httpx.post(f"http://127.0.0.1:{ready[1]}/v1/chat/completions", json=chat("hi"))
        assert resp.json()["choices"][0]["message"]["content"] == FakeServer.reply_text("hi")
    finally:
        proc.terminate()
        proc.wait(timeout=5)
        assert proc.stdout is not None
        proc.stdout.close()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# -- SimulatedTransport -----------------------------------------------------------------------


def simulate(bodies: list[tuple[str, dict[str, Any]]], **knobs: Any) -> list[httpx.Response]:
    """POST each (path, body) in turn through a fresh SimulatedTransport."""
    knobs = {"latency_s": 0.0, "transient_error_rate": 0.0} | knobs

    async def go() -> list[httpx.Response]:
        transport = SimulatedTransport(**knobs)
        async with httpx.AsyncClient(transport=transport, base_url="https://sim.test/v1") as c:
            return [await c.post(path, json=body, headers=auth(KEY)) for path, body in bodies]

    return asyncio.run(go())


@pytest.mark.parametrize("path", list(BODIES))
def test_simulated_replies_validate_as_openai_types(path: str) -> None:
    [resp] = simulate([(path, BODIES[path])])
    assert resp.status_code == 200
    assert resp.headers["x-request-id"].startswith("req_")
    model = assert_openai_shape(path, resp.json())
    if isinstance(model, ChatCompletion):
        assert model.choices[0].message.content == reply_text("Name three rivers.")[0]
        assert model.usage is not None and model.usage.total_tokens > 0


def test_simulated_reply_is_deterministic_and_honours_max_tokens() -> None:
    long_prompt = "Explain the water cycle " * 10
    first, again, short = simulate(
        [
            ("/chat/completions", chat(long_prompt)),
            ("/chat/completions", chat(long_prompt)),
            ("/chat/completions", chat(long_prompt) | {"max_tokens": 3}),
        ]
    )
    text = first.json()["choices"][0]["message"]["content"]
    assert text == again.json()["choices"][0]["message"]["content"]
    assert short.json()["choices"][0]["finish_reason"] == "length"
    assert short.json()["usage"]["completion_tokens"] <= 3


def test_simulated_permanent_failure_and_unknown_path() -> None:
    rejected, unknown = simulate(
        [("/chat/completions", chat("x FAIL_PERMANENT y")), ("/images/generations", {})]
    )
    assert rejected.status_code == 400
    assert_openai_error(rejected.json(), type_="invalid_request_error")
    assert unknown.status_code == 404
    assert_openai_error(unknown.json(), type_="invalid_request_error")


@pytest.mark.slow
def test_simulated_transient_errors_retry_to_success_deterministically() -> None:
    calls = [("/chat/completions", chat(f"q{i}")) for i in range(40)]
    first = simulate(calls * 8, transient_error_rate=0.4, seed=1)
    codes = [r.status_code for r in first]
    assert {429, 500} <= set(codes[:40])
    for resp in first:
        if resp.status_code == 429:
            assert int(resp.headers["retry-after-ms"]) > 0
            assert_openai_error(resp.json(), type_="requests")
        elif resp.status_code == 500:
            assert_openai_error(resp.json(), type_="server_error")
    # Sent eight times over, every request has succeeded at least once: retries get new draws.
    succeeded = {r.request.content for r in first if r.status_code == 200}
    assert len(succeeded) == 40
    assert [r.status_code for r in simulate(calls * 8, transient_error_rate=0.4, seed=1)] == codes
    assert [r.status_code for r in simulate(calls * 8, transient_error_rate=0.4, seed=2)] != codes


def test_simulated_latency_is_jittered_around_latency_s() -> None:
    start = time.monotonic()
    simulate([("/embeddings", BODIES["/embeddings"])], latency_s=0.05)
    assert 0.025 <= time.monotonic() - start < 0.5


# -- aiq.transport ----------------------------------------------------------------------------


def run_client(call: Callable[[httpx.AsyncClient], Awaitable[Any]], **kw: float) -> Any:
    """Run ``call`` with a fresh make_client() client and close it afterwards."""
    options: dict[str, Any] = {
        "max_connections": 4,
        "connect_timeout_s": 2.0,
        "read_timeout_s": 2.0,
    }
    options |= kw

    async def go() -> Any:
        async with make_client(**options) as client:
            return await call(client)

    return asyncio.run(go())


def test_transport_sends_and_reads_a_reply() -> None:
    with FakeServer(require_key=KEY) as server:
        url = server.base_url + "/chat/completions"
        body = httpx.Request("POST", url, json=chat("hello")).content

        async def call(client: httpx.AsyncClient) -> httpx.Response:
            return await client.post(url, content=body, headers=auth(KEY))

        resp = run_client(call)
    assert resp.status_code == 200
    assert resp.headers["x-request-id"].startswith("req_")
    assert resp.json()["choices"][0]["message"]["content"] == server.reply_text("hello")
    assert resp.elapsed.total_seconds() >= 0
    assert server.requests[0].body == chat("hello")


def test_transport_maps_read_timeout() -> None:
    with FakeServer(latency_s=1.0) as server:
        url = server.base_url + "/chat/completions"

        async def call(client: httpx.AsyncClient) -> None:
            await client.post(url, content=b"{}")

        with pytest.raises(httpx.ReadTimeout):
            run_client(call, read_timeout_s=0.1)

        async def per_request(client: httpx.AsyncClient) -> None:
            await client.post(url, content=b"{}", timeout=0.1)  # beats the client's 2 s

        with pytest.raises(httpx.ReadTimeout):
            run_client(per_request)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_transport_maps_connection_refused_without_leaking_headers() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/chat/completions"

    async def call(client: httpx.AsyncClient) -> None:
        await client.post(url, content=b"{}", headers=auth(KEY))

    with pytest.raises(httpx.ConnectError) as caught:
        run_client(call)
    assert caught.value.request.url == url
    assert KEY not in str(caught.value)


async def misbehaving_server(reply: bytes) -> asyncio.Server:
    """A server that reads a request head, writes ``reply`` verbatim and hangs up."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


GZIPPED = gzip.compress(b'{"ok": true}')


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(b"", id="hang-up-before-reply"),
        pytest.param(b"HELLO\r\n\r\n", id="garbage-status-line"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", id="truncated-body"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
            % (len(GZIPPED), GZIPPED),
            id="gzip-body",
        ),
    ],
)
def test_transport_behaves_like_httpx_own_transport(reply: bytes) -> None:
    """Same reply or same exception class as httpx's default transport, case by case."""

    async def outcome(client: httpx.AsyncClient) -> Any:
        server = await misbehaving_server(reply)
        port = server.sockets[0].getsockname()[1]
        try:
            async with client:
                resp = await client.post(f"http://127.0.0.1:{port}/v1/x", content=b"{}")
                return resp.status_code, resp.content
        except httpx.HTTPError as exc:
            return type(exc)
        finally:
            server.close()
            await server.wait_closed()

    ours = asyncio.run(
        outcome(make_client(max_connections=1, connect_timeout_s=2, read_timeout_s=2))
    )
    theirs = asyncio.run(outcome(httpx.AsyncClient()))
    assert ours == theirs
    if reply.startswith(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip"):
        assert ours == (200, b'{"ok": true}')


def test_transport_aclose_closes_the_aiohttp_session() -> None:
    with FakeServer() as server:
        transport = AiohttpTransport(max_connections=2)

        async def go() -> bool:
            async with httpx.AsyncClient(transport=transport) as client:
                await client.get(server.base_url + "/models")
                session = transport._session
                assert session is not None and not session.closed
            return session.closed

        assert asyncio.run(go())


def test_transport_opens_at_most_a_few_connections_at_once() -> None:
    # A burst of 400 requests needs 400 connections; opened in one instant they overflow a
    # server's accept queue (aiohttp's own is 128), whose dropped SYNs come back a second
    # later: a 6,000-request burst sent nothing for a second, twice. The handshake is given
    # a far server's 20 ms (the loop's `sock_connect`, which aiohttp's connects go through).
    opening = most = 0

    async def go(url: str) -> list[int]:
        loop = asyncio.get_running_loop()
        connect = loop.sock_connect

        async def far(sock: socket.socket, address: Any) -> None:
            nonlocal opening, most
            opening += 1
            most = max(most, opening)
            try:
                await asyncio.sleep(0.02)
                await connect(sock, address)
            finally:
                opening -= 1

        loop.sock_connect = far  # type: ignore[method-assign]
        async with make_client(
            max_connections=1000, connect_timeout_s=5.0, read_timeout_s=5.0
        ) as client:
            replies = await asyncio.gather(*(client.get(url) for _ in range(400)))
        return [r.status_code for r in replies]

    with FakeServer() as server:
        statuses = asyncio.run(go(server.base_url + "/models"))
    assert statuses == [200] * 400
    assert most == CONNECTING  # all it may, and no more
