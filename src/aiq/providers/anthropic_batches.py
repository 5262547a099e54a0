"""Anthropic's Message Batches API over HTTP: create, retrieve, list, results, cancel.

As Anthropic's API reference describes it ("Create a Message Batch", ``POST
/v1/messages/batches`` with ``{"requests": [{"custom_id", "params"}]}``, at most 100,000
requests and 256 MB; "Retrieve", "List" (newest first, ``after_id``), "Cancel", and
"Retrieve Message Batch results", JSONL in any order) and anthropic-python's
``MessageBatch`` and ``MessageBatchIndividualResponse``. There is no upload: the create call
carries the requests, streamed from the file aiq writes from the store.

**custom_ids.** Anthropic's must match ``^[a-zA-Z0-9_-]{1,64}$``, which a user's need not,
and one request may stand for several of them (dedup), so each request gets one derived
from the store, the batch and the job: ``aiq-<store tag>-b<batch>-<job>`` (at most 4 + 12
+ 2 + 20 + 1 + 20 = 59 characters). A result line is taken only when its custom_id names
this store and this batch, so a line can never land on another batch's job.

**Finding a lost creation.** A Message Batch has no metadata, and its custom_ids can only be
read once it has ended. So a create whose answer was lost is looked for among the batches
listed (newest first) that were created since the batch was planned (less a margin for the
clocks), are not already one of this store's, and hold exactly as many requests as it
does; the one created nearest after the plan is adopted (the create came soonest after it).
Its results are checked on ingest by the custom_ids: should it have been another client's
batch of the same size created within that minute, none of its lines names this batch, and
every job is queued again at no attempt (``not_ours``), never given a wrong result. The
residual risk: had this batch's own create gone through too, its jobs are then sent twice.
That needs another client on the same workspace, a batch of the same size within a minute,
and a lost answer, all at once.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from ..batch_records import Batch
from ..batch_wire import BatchKey, Frame, Limits, Line, Polled
from ..registry import ANTHROPIC_MAX_TOKENS
from .anthropic_messages import to_messages_body
from .batch_http import BatchHttp, json_object
from .batches import Encode

MAX_REQUESTS = 100_000
# 256 MB less a margin: a job's body is measured as queued, and its Messages translation
# (a chat body's system and max_tokens moved about) may be a little longer.
MAX_BYTES = 240 * 1000 * 1000
LINE_OVERHEAD = 120  # {"custom_id":"aiq-...","params":} and a separator
_PATH = "/v1/messages/batches"
_LOOK_BACK_S = 60.0  # the provider's clock may be behind ours by this much
_CHUNK = 1 << 20
# An errored result's error type, as the HTTP status an online call would have had
# (Anthropic's "Errors" page), so the same table classifies it.
_STATUS = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
    "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
    "rate_limit_error": 429, "api_error": 500, "timeout_error": 504,
    "overloaded_error": 529,
}  # fmt: skip
# Results that never ran: the codes aiq's batch rules queue again without an attempt.
_NOT_RUN = {"canceled": "batch_cancelled", "expired": "batch_expired"}


def batch_prefix(key: BatchKey) -> str:
    return f"aiq-{key.tag}-b{key.batch_id}-"


def job_of(custom_id: object, prefix: str) -> int | None:
    """The job a derived custom_id names, or None for one not of this batch."""
    if isinstance(custom_id, str) and custom_id.startswith(prefix):
        digits = custom_id[len(prefix) :]
        if digits.isdigit():
            return int(digits)
    return None


def result_line(raw: bytes, prefix: str) -> Line | None:
    """One results line (a MessageBatchIndividualResponse) as aiq reads a batch line: a
    ``succeeded`` message as a 200 reply, an ``errored`` error as its HTTP status and body,
    ``canceled`` and ``expired`` as lines that never ran; one of another batch's with no
    job. None: not a JSON object."""
    if (data := json_object(raw)) is None:
        return None
    if (job := job_of(data.get("custom_id"), prefix)) is None:
        return Line(None, None, None, b"", "not_ours", "another batch's line")
    result = data.get("result")
    result = result if isinstance(result, dict) else {}
    kind = result.get("type")
    if kind == "succeeded":
        return Line(job, 200, None, orjson.dumps(result.get("message")), None, None)
    if kind == "errored":
        error = result.get("error")
        inner = error.get("error") if isinstance(error, dict) else None
        kind_of = inner.get("type") if isinstance(inner, dict) else None
        request_id = error.get("request_id") if isinstance(error, dict) else None
        status = _STATUS.get(kind_of if isinstance(kind_of, str) else "", 500)
        request_id = request_id if isinstance(request_id, str) else None
        return Line(job, status, request_id, orjson.dumps(error), None, None)
    code = _NOT_RUN.get(str(kind), f"result_{kind}")
    return Line(job, None, None, b"", code, f"the request was {kind}")


def polled(obj: Mapping[str, Any]) -> Polled:
    """A MessageBatch in aiq's terms: ``completed`` succeeded, ``failed`` errored."""
    raw = obj.get("request_counts") or {}
    counts = {k: v for k, v in raw.items() if isinstance(v, int)}
    counts["total"] = sum(counts.values())
    counts["completed"] = counts.get("succeeded", 0)
    counts["failed"] = counts.get("errored", 0)
    state = str(obj.get("processing_status"))
    return Polled(id=str(obj.get("id")), state=state, counts=counts, ended=state == "ended",
                  raw=dict(obj))  # fmt: skip


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class AnthropicBatchApi(BatchHttp):
    """Anthropic's batch API (aiq.providers.batches.BatchService): the create carries the
    requests. ``default_max_tokens`` goes in a request naming none, as online."""

    limits = Limits(MAX_REQUESTS, MAX_BYTES, LINE_OVERHEAD)
    uploads = False
    frame = Frame(head=b'{"requests":[', sep=b",\n", tail=b"]}")

    def encode(self, key: BatchKey) -> Encode:
        prefix = batch_prefix(key).encode()

        def line(job_id: int, endpoint: str, body: bytes) -> bytes:
            tokens = self._max_tokens or ANTHROPIC_MAX_TOKENS
            params = to_messages_body(endpoint, body, default_max_tokens=tokens)
            return b'{"custom_id":"%b%d","params":%b}' % (prefix, job_id, params)

        return line

    async def find_file(self, filename: str, *, since: float) -> dict[str, Any] | None:
        raise NotImplementedError("Message Batches take no upload")

    async def upload(self, path: Path, filename: str) -> dict[str, Any]:
        raise NotImplementedError("Message Batches take no upload")

    async def create(self, key: BatchKey, *, input_file_id: str | None, path: Path) -> Polled:
        """``POST /v1/messages/batches`` with the requests file at ``path`` as its body,
        read in chunks as sent."""
        size = os.path.getsize(path)

        async def chunks() -> AsyncIterator[bytes]:
            with path.open("rb") as f:
                while block := f.read(_CHUNK):
                    yield block

        headers = {"content-type": "application/json", "content-length": str(size)}
        return polled(await self._call("POST", _PATH, content=chunks(), headers=headers))

    async def get(self, batch_id: str) -> Polled:
        return polled(await self._call("GET", f"{_PATH}/{batch_id}"))

    async def cancel(self, batch_id: str) -> Polled:
        """``POST .../cancel``: ``canceling``, then ``ended``, its unprocessed requests
        ``canceled``."""
        return polled(await self._call("POST", f"{_PATH}/{batch_id}/cancel"))

    async def find_batch(self, key: BatchKey, *, known: frozenset[str]) -> Polled | None:
        """The batch created nearest after ``key`` was planned (or, for the clocks, up to a
        margin before) with as many requests, not one of ``known``: see the module's
        docstring for why and its risk."""
        since = key.planned_at - _LOOK_BACK_S
        found: list[tuple[bool, float, Polled]] = []
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 100}
            if after:
                params["after_id"] = after
            page = await self._call("GET", _PATH, params=params)
            data = [b for b in page.get("data") or [] if isinstance(b, dict)]
            for b in data:
                created = _epoch(b.get("created_at"))
                if created is None or created < since or b.get("id") in known:
                    continue
                candidate = polled(b)
                if candidate.counts["total"] == key.requests:
                    early = created < key.planned_at
                    found.append((early, abs(created - key.planned_at), candidate))
            older = any((_epoch(b.get("created_at")) or 0) < since for b in data)
            if not data or older or not page.get("has_more"):
                return min(found, key=lambda f: f[:2])[2] if found else None
            after = data[-1].get("id")

    async def lines(self, batch: Batch, key: BatchKey) -> AsyncIterator[Line | None]:
        """``GET .../results`` (the documented path on the configured base URL, not the
        ``results_url`` the batch names: the key goes only where it is configured to)."""
        prefix = batch_prefix(key)
        async for raw in self._stream_lines(f"{_PATH}/{batch.provider_batch_id}/results"):
            line = result_line(raw, prefix)
            if line is not None:
                yield line
