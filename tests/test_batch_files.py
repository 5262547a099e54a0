"""The batch files' lines (aiq.batch_files) and the fake's Files and Batches objects, checked
against openai-python's own types (openai.types.Batch, FileObject)."""

from __future__ import annotations

import httpx
import orjson
from conftest import API_KEY
from fakeserver import FakeServer
from hypothesis import given
from hypothesis import strategies as st
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion

from aiq.batch_files import custom_id, job_id_of, read_line
from aiq.providers.batch_http import json_object

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@given(st.integers(min_value=1, max_value=2**63 - 1))
def test_a_jobs_custom_id_maps_back_to_it(job_id: int) -> None:
    assert job_id_of(custom_id(job_id)) == job_id


@given(st.one_of(st.text(), st.integers(), st.none()))
def test_a_custom_id_aiq_did_not_write_maps_to_no_job(other: object) -> None:
    if not (isinstance(other, str) and other.startswith("aiq-") and other[4:].isdigit()):
        assert job_id_of(other) is None


@given(_json, st.integers(100, 599), st.text())
def test_an_output_line_gives_its_body_as_the_provider_gave_it(
    body: object, status: int, request_id: str
) -> None:
    raw = orjson.dumps(
        {"id": "batch_req_1", "custom_id": "aiq-7", "error": None,
         "response": {"status_code": status, "request_id": request_id, "body": body}}
    )  # fmt: skip
    line = read_line(raw)
    assert line is not None and line.job_id == 7 and line.status_code == status
    assert line.request_id == request_id
    assert line.body == b"" if body is None else orjson.loads(line.body) == body


def test_an_error_line_names_its_code_and_lines_not_json_are_skipped() -> None:
    raw = b'{"custom_id":"aiq-3","response":null,"error":{"code":"batch_expired","message":"m"}}'
    line = read_line(raw)
    assert line is not None and (line.job_id, line.status_code, line.error_code) == (
        3, None, "batch_expired",
    )  # fmt: skip
    assert read_line(b"not json") is None and read_line(b"[1]") is None


@given(_json)
def test_a_line_is_read_only_when_it_is_a_json_object(value: object) -> None:
    # Both providers' result lines and every API answer go through this (batch_http).
    raw = orjson.dumps(value)
    assert json_object(raw) == (value if isinstance(value, dict) else None)
    assert json_object(raw[:-1]) is None  # a torn line (its last byte lost) is no object


def test_the_fakes_files_and_batches_are_openais_types() -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}  # fmt: skip
    with FakeServer(require_key=API_KEY) as server:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.Client(base_url=server.base_url, headers=headers) as http:
            up = http.post(
                "/files", data={"purpose": "batch"},
                files={"file": ("in.jsonl", orjson.dumps(line) + b"\n", "application/jsonl")},
            )  # fmt: skip
            file = FileObject.model_validate(up.json())
            assert file.purpose == "batch" and file.filename == "in.jsonl"
            created = http.post(
                "/batches",
                json={"input_file_id": file.id, "endpoint": "/v1/chat/completions",
                      "completion_window": "24h", "metadata": {"aiq_batch": "1"}},
            )  # fmt: skip
            batch = Batch.model_validate(created.json())
            assert batch.status == "validating" and batch.metadata == {"aiq_batch": "1"}
            done = Batch.model_validate(http.get(f"/batches/{batch.id}").json())
            assert done.status == "completed" and done.request_counts is not None
            assert done.request_counts.completed == 1 and done.output_file_id
            listed = http.get("/batches").json()
            assert [Batch.model_validate(b).id for b in listed["data"]] == [batch.id]
            files = http.get("/files", params={"purpose": "batch"}).json()["data"]
            assert [FileObject.model_validate(f).id for f in files] == [file.id]
            (out,) = http.get(f"/files/{done.output_file_id}/content").text.splitlines()
            result = orjson.loads(out)
            assert result["custom_id"] == "a" and result["error"] is None
            reply = ChatCompletion.model_validate(result["response"]["body"])
            assert reply.choices[0].message.content == server.reply_text("hi")
            assert http.get("/batches", headers={"Authorization": "Bearer x"}).status_code == 401
