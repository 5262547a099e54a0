"""A successful reply is stored byte for byte as the provider sent it, whatever the API key.

Local servers take dummy keys (``x``, ``test``, ``null``, ``EMPTY``, ``ollama``), whose bytes turn
up in any reply: a key is cut out of aiq's own messages only (tests/test_secrets.py), never out
of a reply. Property tests send any reply body under any key of 1 to 200 characters through
each provider, and through the worker into a real store and its results file; end-to-end runs
with dummy keys against a server that keeps the bytes it sent compare them with the store's.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from conftest import aiq_env, read_jsonl, run_aiq, write_prompts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from localserver import LocalServer

from aiq.enqueue import add_file
from aiq.inputs import Defaults
from aiq.outputs import export_source
from aiq.providers.anthropic import AnthropicProvider
from aiq.providers.base import MIN_SECRET_CHARS, error_message, redact, secret_of
from aiq.providers.openai import OpenAIProvider
from aiq.records import DONE
from aiq.requestfile import read_requests
from aiq.store import RESULT_COLUMNS, JobStore
from aiq.worker import RetryPolicy, Worker

# Any key a header can carry: printable ASCII, quotes, braces and all.
KEYS = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=200)
# Words that are both dummy keys and everywhere in JSON replies.
DUMMIES = ["x", "te", "content", "null", "test", "EMPTY", "ollama", "role", '"', ":", "{", "}"]


def _leaf(key: str) -> st.SearchStrategy[Any]:
    """A JSON value that may be, hold, or sit beside the key."""
    text = st.text(max_size=20)
    return st.one_of(
        st.none(), st.booleans(), st.integers(-(2**53), 2**53), text,
        st.just(key), st.builds(lambda a, b: a + key + b, text, text),
    )  # fmt: skip


def _extra(key: str) -> st.SearchStrategy[dict[str, Any]]:
    """Fields named by the key (or a dummy) beside a reply's own."""
    names = st.one_of(st.just(key), st.sampled_from(DUMMIES), st.text(max_size=8))
    return st.dictionaries(names, _leaf(key), max_size=4)


@st.composite
def _encoded(draw: st.DrawFn, payload: dict[str, Any]) -> bytes:
    """``payload`` as some server might write it: compact or spaced, escaped or raw UTF-8,
    on one line or pretty-printed."""
    indent = draw(st.sampled_from([None, None, 2]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]))
    ensure_ascii = draw(st.booleans())
    return json.dumps(payload, indent=indent, separators=separators, ensure_ascii=ensure_ascii)\
        .encode()  # fmt: skip


@st.composite
def openai_replies(draw: st.DrawFn) -> tuple[str, bytes]:
    key = draw(st.one_of(KEYS, st.sampled_from(DUMMIES)))
    message = {"role": "assistant", "content": draw(_leaf(key)), **draw(_extra(key))}
    payload = {
        "id": draw(_leaf(key)),
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": draw(_leaf(key))}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    }
    return key, draw(_encoded(payload))


@st.composite
def anthropic_replies(draw: st.DrawFn) -> tuple[str, bytes]:
    key = draw(st.one_of(KEYS, st.sampled_from(DUMMIES)))
    block = {"type": "text", "text": draw(_leaf(key)), **draw(_extra(key))}
    payload = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [block],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    return key, draw(_encoded(payload))


def _send(provider: OpenAIProvider | AnthropicProvider, endpoint: str, body: dict) -> bytes:
    async def go() -> bytes:
        return (await provider.send(endpoint, orjson.dumps(body))).body

    return asyncio.run(go())


def _answering(body: bytes) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(200, content=body))


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(openai_replies())
def test_openai_reply_is_returned_byte_for_byte_under_any_key(case: tuple[str, bytes]) -> None:
    key, body = case
    provider = OpenAIProvider(_answering(body), base_url="http://h/v1", api_key=key)

    assert _send(provider, "/v1/chat/completions", CHAT) == body


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(anthropic_replies())
def test_anthropic_reply_is_returned_byte_for_byte_under_any_key(case: tuple[str, bytes]) -> None:
    key, body = case
    provider = AnthropicProvider(_answering(body), base_url="http://h", api_key=key)

    assert _send(provider, "/v1/chat/completions", CHAT) == body


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(openai_replies())
def test_reply_reaches_the_store_and_results_file_as_sent(case: tuple[str, bytes]) -> None:
    key, body = case
    with tempfile.TemporaryDirectory() as tmp:
        stored, result = asyncio.run(_through_the_store(Path(tmp), key, body))

    assert stored == body
    assert result["response"]["status_code"] == 200
    assert result["response"]["body"] == json.loads(body)


async def _through_the_store(tmp: Path, key: str, body: bytes) -> tuple[bytes, dict]:
    """One prompt line run by a Worker into a real store, then exported; returns the
    response the store holds and the results line."""
    path = tmp / "p.jsonl"
    path.write_text('{"custom_id": "a", "prompt": "hi"}\n')
    store = await JobStore.open(tmp / "aiq.db")
    try:
        source = await store.add_source(
            str(path), out_path=str(tmp / "r.jsonl"), dead_path=str(tmp / "d.jsonl")
        )
        await add_file(store, source, read_requests(path, Defaults(model="m")))
        provider = OpenAIProvider(_answering(body), base_url="http://h/v1", api_key=key)
        worker = Worker(store, provider, concurrency=1, retry=RetryPolicy(max_attempts=1))
        await asyncio.wait_for(worker.run(), 10)
        rows = [r async for batch in store.result_rows(source, state=DONE) for r in batch]
        (row,) = [dict(zip(RESULT_COLUMNS, r, strict=True)) for r in rows]
        await export_source(store, source)
    finally:
        await store.close()
    # Split on newlines only, as JSONL is: str.splitlines() would split at U+2028 or U+0085
    # inside a string too.
    line, end = (tmp / "r.jsonl").read_bytes().split(b"\n")
    assert end == b""
    return row["response"], json.loads(line)


# -- what aiq writes itself: a long key is cut out, a short one is no secret --------------------


@given(KEYS, st.text(max_size=40), st.text(max_size=40))
def test_a_long_key_is_cut_out_of_error_messages_and_a_short_one_left(
    key: str, before: str, after: str
) -> None:
    said = f"{before}{key}{after}"
    secret = secret_of(key)
    resp = httpx.Response(401)
    # OpenAI's shape, decoded; any other JSON (the key JSON-escaped in it); not JSON at all.
    shaped = orjson.dumps({"error": {"message": said, "type": "x"}})
    other = orjson.dumps({"detail": said})
    html = f"<html>{said}</html>".encode()

    messages = [error_message(resp, body, secret=secret)[0] for body in (shaped, other, html)]

    if len(key) >= MIN_SECRET_CHARS:
        escaped = orjson.dumps(key).decode()[1:-1]
        for message in messages:
            rest = message.removeprefix("HTTP 401: ").replace("[redacted]", "\0")
            assert key not in rest and escaped not in rest, message
    else:
        assert secret is None and messages[0] == f"HTTP 401: {said}"
        assert redact(messages[0], secret) == messages[0]


def test_a_key_is_cut_out_of_a_malformed_200s_message_but_not_from_a_reply() -> None:
    key = "sk-long-enough-to-be-a-secret"
    echo = b"<html>you sent Authorization: Bearer " + key.encode() + b"</html>"
    provider = OpenAIProvider(_answering(echo), base_url="http://h/v1", api_key=key)

    with pytest.raises(Exception) as caught:
        _send(provider, "/v1/chat/completions", CHAT)

    assert key not in str(caught.value) and "[redacted]" in str(caught.value)
    good = orjson.dumps({"choices": [{"message": {"content": f"your key is {key}"}}]})
    provider = OpenAIProvider(_answering(good), base_url="http://h/v1", api_key=key)
    assert _send(provider, "/v1/chat/completions", CHAT) == good  # the model said it: kept


# -- end to end: dummy keys against a server that keeps what it sent ----------------------------


class KeepingServer(LocalServer):
    """An OpenAI- and Anthropic-compatible server on 127.0.0.1 that takes any key and keeps the
    exact bytes of each reply it sent, by prompt. Its replies are full of the dummy keys'
    words: ``content`` (a key of OpenAI's messages), ``null`` (Anthropic's ``stop_sequence``),
    ``x``, ``test``, ``EMPTY``, ``ollama``."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: dict[str, bytes] = {}

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        if isinstance(prompt, list):  # Anthropic's content blocks
            prompt = prompt[0]["text"]
        text = f"x test EMPTY ollama content null: the answer to {prompt}"
        if request.path == "/v1/messages":
            payload: dict[str, Any] = {
                "id": "msg_x", "type": "message", "role": "assistant", "model": body["model"],
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 9},
            }  # fmt: skip
        else:
            payload = {
                "id": "chatcmpl-x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                             "refusal": None}, "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
            }  # fmt: skip
        sent = json.dumps(payload, separators=(", ", ": ")).encode()
        self.sent[prompt] = sent
        return web.Response(body=sent, content_type="application/json")


@pytest.fixture
def keeping() -> Iterator[KeepingServer]:
    with KeepingServer() as s:
        yield s


def _stored(db: Path) -> list[bytes]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT response FROM jobs ORDER BY id")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("provider", "key_env", "key"),
    [
        ("openai", "OPENAI_API_KEY", "content"),  # was: {"role": "assistant", "[redacted]": …}
        ("anthropic", "ANTHROPIC_API_KEY", "x"),  # was: {"type": "te[redacted]t", …}
        ("anthropic", "ANTHROPIC_API_KEY", "null"),  # was: invalid JSON, dead-lettered
    ],
)
def test_a_run_with_a_dummy_key_stores_what_the_server_sent(
    tmp_path: Path, keeping: KeepingServer, provider: str, key_env: str, key: str
) -> None:
    prompts = [(f"p{i}", f"question {i}") for i in range(5)]
    write_prompts(tmp_path / "five.jsonl", prompts)
    env = aiq_env(**{key_env: key})
    args = ["--base-url", keeping.base_url, "--provider", provider, "--model", "m"]

    ran = run_aiq("run", "five.jsonl", *args, cwd=tmp_path, env=env)

    assert ran.returncode == 0, ran.stderr  # nothing dead-lettered as a bad response
    assert sorted(_stored(tmp_path / ".aiq" / "aiq.db")) == sorted(keeping.sent.values())
    results = (tmp_path / "five.results.jsonl").read_bytes()
    assert all(sent in results for sent in keeping.sent.values())  # as sent, bytes and all
    assert b"[redacted]" not in results
    by_id = {
        r["custom_id"]: r["response"]["body"] for r in read_jsonl(tmp_path / "five.results.jsonl")
    }
    assert by_id == {cid: json.loads(keeping.sent[p]) for cid, p in prompts}
