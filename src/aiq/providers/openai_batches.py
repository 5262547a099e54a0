"""OpenAI's Files and Batches API over HTTP: upload, create, get, list, download, cancel.

As the API reference describes them (platform.openai.com/docs/api-reference/batch and
/files; the shapes are those of openai-python's ``openai.types.Batch`` and ``FileObject``).
Every failure is a classified ProviderError by the same table as an online call. Bodies
stream both ways: an input file is read from disk in chunks as it is sent, and an output
file is read a line at a time, so 200 MB never sit in memory.

An input line is ``{"custom_id", "method", "url", "body"}``; its custom_id is aiq's job id
(``aiq-<id>``), not the user's: jobs are deduplicated, one request may stand for several
custom_ids, and a batch needs its own unique within the file. An output line is ``{"id",
"custom_id", "response": {"status_code", "request_id", "body"}, "error"}``; an error file's
lines are the same, with a response that failed or an ``error`` (``batch_expired``...).
A batch is found again by its metadata, which names the store and the batch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from ..batch_records import TERMINAL, Batch
from ..batch_wire import JSONL, BatchKey, Limits, Line, Polled
from .batch_http import BatchHttp, json_object
from .batches import Encode

# The most a provider takes in one input file (OpenAI: 50,000 requests and 200 MB).
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1000 * 1000
# A line's bytes besides its body: the custom_id, method and url around it (an endpoint of
# up to ~40 characters and a job id of up to 19 digits), rounded up.
LINE_OVERHEAD = 120
# How far back a lost upload or creation is looked for, before the batch was planned: the
# provider's clock and ours may differ, and a list is newest first.
_LOOK_BACK_S = 3600.0
_PREFIX = "aiq-"


def custom_id(job_id: int) -> str:
    return f"{_PREFIX}{job_id}"


def job_id_of(custom_id: object) -> int | None:
    """The job of a line's custom_id, or None for one aiq did not write."""
    if isinstance(custom_id, str) and custom_id.startswith(_PREFIX):
        digits = custom_id[len(_PREFIX) :]
        if digits.isdigit():
            return int(digits)
    return None


def openai_line(job_id: int, endpoint: str, body: bytes) -> bytes:
    """An OpenAI input file's line (without its newline)."""
    return b'{"custom_id":"%b","method":"POST","url":%b,"body":%b}' % (
        custom_id(job_id).encode(), orjson.dumps(endpoint), body,
    )  # fmt: skip


def read_line(raw: bytes) -> Line | None:
    """A line of an output or error file; None for one that is not a JSON object."""
    if (data := json_object(raw)) is None:
        return None
    response = data.get("response")
    error = data.get("error")
    status = body = request_id = None
    if isinstance(response, dict):
        status = response.get("status_code")
        request_id = response.get("request_id")
        body = response.get("body")
    code = message = None
    if isinstance(error, dict):
        code, message = _text(error.get("code")), _text(error.get("message"))
    return Line(
        job_id_of(data.get("custom_id")),
        status if isinstance(status, int) else None,
        _text(request_id),
        b"" if body is None else orjson.dumps(body),
        code,
        message,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def metadata(key: BatchKey) -> dict[str, str]:
    return {"aiq_store": key.tag, "aiq_batch": str(key.batch_id)}


def polled(obj: Mapping[str, Any]) -> Polled:
    """A Batch object in aiq's terms."""
    state = str(obj.get("status"))
    counts = {k: v for k, v in (obj.get("request_counts") or {}).items() if isinstance(v, int)}
    return Polled(
        id=str(obj.get("id")), state=state, counts=counts, ended=state in TERMINAL,
        raw=dict(obj), output_file_id=obj.get("output_file_id"),
        error_file_id=obj.get("error_file_id"),
    )  # fmt: skip


class BatchApi(BatchHttp):
    """OpenAI's batch API (aiq.providers.batches.BatchService): files uploaded, then a
    batch created from one."""

    limits = Limits(MAX_REQUESTS, MAX_BYTES, LINE_OVERHEAD)
    uploads = True
    frame = JSONL

    def encode(self, key: BatchKey) -> Encode:
        return openai_line

    # -- files ------------------------------------------------------------------------------

    async def upload(self, path: Path, filename: str) -> dict[str, Any]:
        """``POST /v1/files`` (purpose batch) of the file at ``path``, read in chunks as sent;
        the FileObject."""
        with path.open("rb") as f:
            return await self._call(
                "POST", "/v1/files",
                data={"purpose": "batch"}, files={"file": (filename, f, "application/jsonl")},
            )  # fmt: skip

    async def find_file(self, filename: str, *, since: float) -> dict[str, Any] | None:
        """The newest batch file named ``filename`` uploaded after ``since`` (less a margin),
        from ``GET /v1/files``: how an upload whose answer was lost is found again."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"purpose": "batch", "limit": 100, "order": "desc"}
            if after:
                params["after"] = after
            page = await self._call("GET", "/v1/files", params=params)
            data = page.get("data") or []
            for f in data:
                if f.get("filename") == filename and f.get("status") != "error":
                    return f
            older = any((f.get("created_at") or 0) < since - _LOOK_BACK_S for f in data)
            if not data or older or not page.get("has_more"):
                return None
            after = data[-1].get("id")

    async def file_lines(self, file_id: str) -> AsyncIterator[bytes]:
        """A file's content (``GET /v1/files/{id}/content``), one line at a time."""
        async for line in self._stream_lines(f"/v1/files/{file_id}/content"):
            yield line

    async def lines(self, batch: Batch, key: BatchKey) -> AsyncIterator[Line | None]:
        """The output file's lines, then (after a None) the error file's."""
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                async for raw in self.file_lines(file_id):
                    line = read_line(raw)
                    if line is not None:
                        yield line
                yield None

    # -- batches ------------------------------------------------------------------------

    async def create(self, key: BatchKey, *, input_file_id: str | None, path: Path) -> Polled:
        """``POST /v1/batches`` of the uploaded file, with a 24 h window and the metadata
        naming the store and the batch."""
        body = {
            "input_file_id": input_file_id,
            "endpoint": key.endpoint,
            "completion_window": "24h",
            "metadata": metadata(key),
        }
        headers = {"content-type": "application/json"}
        content = orjson.dumps(body)
        return polled(await self._call("POST", "/v1/batches", content=content, headers=headers))

    async def get(self, batch_id: str) -> Polled:
        """``GET /v1/batches/{id}``."""
        return polled(await self._call("GET", f"/v1/batches/{batch_id}"))

    async def cancel(self, batch_id: str) -> Polled:
        """``POST /v1/batches/{id}/cancel``: ``cancelling``, then ``cancelled``."""
        return polled(await self._call("POST", f"/v1/batches/{batch_id}/cancel"))

    async def find_batch(self, key: BatchKey, *, known: frozenset[str]) -> Polled | None:
        """The batch whose metadata names ``key``'s store and batch, created after it was
        planned (less a margin), from ``GET /v1/batches`` (newest first): how a creation
        whose answer was lost is found again."""
        wanted = metadata(key)
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 100}
            if after:
                params["after"] = after
            page = await self._call("GET", "/v1/batches", params=params)
            data = page.get("data") or []
            for b in data:
                meta = b.get("metadata") or {}
                if all(meta.get(k) == v for k, v in wanted.items()):
                    return polled(b)
            oldest = key.planned_at - _LOOK_BACK_S
            older = any((b.get("created_at") or 0) < oldest for b in data)
            if not data or older or not page.get("has_more"):
                return None
            after = data[-1].get("id")
