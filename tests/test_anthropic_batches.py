"""Anthropic's Message Batches: aiq's client (aiq.providers.anthropic_batches) against the
fake's (tests/fakeserver/message_batches.py) over real HTTP on 127.0.0.1, the fake's objects
checked with anthropic-python's own types, and each result type's outcome by the online
table (aiq.batch_results)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import orjson
import pytest
from anthropic.types import Message
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse
from conftest import API_KEY
from fakeserver import FakeServer
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.batch_records import Batch
from aiq.batch_results import LineRules
from aiq.batch_wire import BatchKey, Line
from aiq.outcomes import RetryPolicy
from aiq.pricing import Price
from aiq.providers.anthropic import AnthropicProvider
from aiq.providers.anthropic_batches import AnthropicBatchApi, batch_prefix, result_line
from aiq.records import DEAD, DONE, QUEUED, Job
from aiq.registry import ANTHROPIC

_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_CHAT = "/v1/chat/completions"


def _key(batch_id: int = 1, requests: int = 3, planned_at: float = 0.0) -> BatchKey:
    return BatchKey(
        tag="0123456789ab", batch_id=batch_id, endpoint=_CHAT, requests=requests,
        planned_at=planned_at,
    )  # fmt: skip


@settings(max_examples=50)
@given(
    st.text("0123456789abcdef", min_size=12, max_size=12),
    st.integers(1, 2**63 - 1),
    st.integers(1, 2**63 - 1),
)
def test_a_derived_custom_id_is_anthropics_shape_and_maps_back_to_its_job(
    tag: str, batch_id: int, job_id: int
) -> None:
    key = BatchKey(tag=tag, batch_id=batch_id, endpoint=_CHAT, requests=1, planned_at=0.0)
    raw = AnthropicBatchApi.encode(_api_unbound(), key)(job_id, _CHAT, _chat_body("q"))
    custom_id = orjson.loads(raw)["custom_id"]
    assert _CUSTOM_ID.match(custom_id)
    line = orjson.dumps({"custom_id": custom_id, "result": {"type": "expired"}})
    assert (parsed := result_line(line, batch_prefix(key))) is not None
    assert parsed.job_id == job_id
    other = BatchKey(tag=tag, batch_id=batch_id + 1, endpoint=_CHAT, requests=1, planned_at=0)
    foreign = result_line(line, batch_prefix(other))  # another batch's: never taken
    assert foreign is not None and foreign.job_id is None


def _api_unbound() -> AnthropicBatchApi:
    transport = httpx.MockTransport(lambda r: httpx.Response(500))
    return AnthropicBatchApi(transport, base_url="http://h", api_key=None, spec=ANTHROPIC)


def _chat_body(prompt: str) -> bytes:
    return orjson.dumps({"model": "claude-x", "messages": [{"role": "user", "content": prompt}]})


_MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
    "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
    "stop_sequence": None, "usage": {"input_tokens": 1000, "output_tokens": 1000},
}  # fmt: skip


def _errored(kind: str) -> dict:
    return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": "m"}}}


def _rules() -> LineRules:
    answers = AnthropicProvider(
        httpx.MockTransport(lambda r: httpx.Response(500)), base_url="http://h", api_key=None
    )
    prices = {"claude-x": Price(input_per_m=2.0, output_per_m=4.0)}
    retry = RetryPolicy(max_attempts=3)
    return LineRules(answers, prices=prices, retry=retry, wall=lambda: 50.0)


@pytest.mark.parametrize(
    ("result", "state", "attempts", "error_type"),
    [
        ({"type": "succeeded", "message": _MESSAGE}, DONE, 2, None),
        (_errored("invalid_request_error"), DEAD, 2, "invalid_request"),
        (_errored("api_error"), QUEUED, 2, "server"),
        (_errored("overloaded_error"), QUEUED, 2, "server"),  # 529, as online
        (_errored("rate_limit_error"), QUEUED, 1, "rate_limit"),
        ({"type": "expired"}, None, 1, "expired"),
        ({"type": "canceled"}, None, 1, "cancelled"),
    ],
)  # fmt: skip
def test_each_result_type_ends_its_job_by_the_online_table(
    result: dict, state: int | None, attempts: int, error_type: str
) -> None:
    key = _key()
    raw = orjson.dumps({"custom_id": f"{batch_prefix(key)}7", "result": result})
    MessageBatchIndividualResponse.model_validate_json(raw)  # the SDK's own shape
    line = result_line(raw, batch_prefix(key))
    assert isinstance(line, Line) and line.job_id == 7
    out = _rules().outcome(Job(7, _CHAT, b"", 1, None, "claude-x"), line, started=10.0)
    if state is None:  # never ran: queued again at no attempt, for this reason
        assert out == error_type
        return
    assert not isinstance(out, str)
    assert (out.state, out.attempts) == (state, attempts)
    if state == DONE:
        assert orjson.loads(out.response or b"") == _MESSAGE  # the message as given
        assert out.cost_usd == pytest.approx((2.0 + 4.0) / 1000 / 2)  # half the list price
    else:
        assert out.error_type == error_type


async def _drive(server: FakeServer, tmp_path: Path) -> None:
    transport = httpx.AsyncHTTPTransport(retries=0)
    api = AnthropicBatchApi(transport, base_url=server.base_url, api_key=API_KEY, spec=ANTHROPIC)
    try:
        key = _key(requests=3, planned_at=0.0)
        encode = api.encode(key)
        lines = [encode(i, _CHAT, _chat_body(f"question {i}")) for i in (1, 2, 3)]
        path = tmp_path / "requests.json"
        path.write_bytes(api.frame.head + api.frame.sep.join(lines) + api.frame.tail)
        created = await api.create(key, input_file_id=None, path=path)
        MessageBatch.model_validate(created.raw)
        assert created.state == "in_progress" and created.counts["total"] == 3
        # A lost answer is found again: the oldest of as many requests, not one of ours.
        found = await api.find_batch(key, known=frozenset())
        assert found is not None and found.id == created.id
        assert await api.find_batch(key, known=frozenset({created.id})) is None
        assert await api.find_batch(_key(requests=4), known=frozenset()) is None
        polled = await api.get(created.id)
        MessageBatch.model_validate(polled.raw)
        assert polled.ended and polled.counts["completed"] == 3
        batch = Batch(
            id=1, provider="anthropic", endpoint=_CHAT, model="claude-x", step="created",
            state="ended", requests=3, created_at=0.0, updated_at=0.0,
            provider_batch_id=created.id,
        )  # fmt: skip
        got = [line async for line in api.lines(batch, key)]
        assert sorted(line.job_id or 0 for line in got if line) == [1, 2, 3]
        for line in got:
            assert line is not None
            message = Message.model_validate_json(line.body)
            assert message.content[0].text == server.reply_text(f"question {line.job_id}")  # type: ignore[union-attr]
    finally:
        await api.aclose()
        await transport.aclose()


def test_the_client_creates_finds_polls_and_reads_the_fakes_batches(tmp_path: Path) -> None:
    with FakeServer(require_key=API_KEY) as server:
        asyncio.run(_drive(server, tmp_path))
        assert server.message_batches.created() == 1
        assert not server.message_batches.submitted_twice()


def test_the_fakes_results_are_sdk_types_shuffled_with_expiry_and_cancel() -> None:
    with FakeServer(require_key=API_KEY) as server:
        mb = server.message_batches
        headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
        requests = [
            {"custom_id": f"r{i}", "params": {"model": "m", "max_tokens": 5,
             "messages": [{"role": "user", "content": f"q{i}"}]}}
            for i in range(40)
        ]  # fmt: skip
        url = server.base_url.removesuffix("/v1") + "/v1/messages/batches"
        with httpx.Client(headers=headers) as client:
            bad = client.post(url, json={"requests": [{"custom_id": "a/b", "params": {}}]})
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
            assert (
                client.post(
                    url, json={"requests": requests}, headers={"x-api-key": "no"}
                ).status_code
                == 401
            )
            mb.processing_s = 60.0
            first = client.post(url, json={"requests": requests}).json()
            mb.cancel_after_lines = 5
            cancel = client.post(f"{url}/{first['id']}/cancel").json()
            assert MessageBatch.model_validate(cancel).processing_status == "canceling"
            ended = MessageBatch.model_validate(client.get(f"{url}/{first['id']}").json())
            assert ended.processing_status == "ended" and ended.results_url
            assert (ended.request_counts.succeeded, ended.request_counts.canceled) == (5, 35)
            lines = client.get(ended.results_url).text.splitlines()
            results = [MessageBatchIndividualResponse.model_validate_json(x) for x in lines]
            assert [r.custom_id for r in results] != [r["custom_id"] for r in requests]  # any order
            assert sorted(r.result.type for r in results) == ["canceled"] * 35 + ["succeeded"] * 5
            mb.expire_after_lines = 3
            second = client.post(url, json={"requests": requests[:4]}).json()
            expired = MessageBatch.model_validate(client.get(f"{url}/{second['id']}").json())
            assert (expired.request_counts.succeeded, expired.request_counts.expired) == (3, 1)
            listed = client.get(url, params={"limit": 1}).json()
            assert [b["id"] for b in listed["data"]] == [second["id"]] and listed["has_more"]
            older = client.get(url, params={"limit": 1, "after_id": second["id"]}).json()
            assert [b["id"] for b in older["data"]] == [first["id"]]
