"""Anthropic's Message Batches API, as the fake server serves it.

Modelled on Anthropic's API reference ("Create a Message Batch" ``POST /v1/messages/batches``
with ``{"requests": [{"custom_id", "params"}]}``, at most 100,000 requests and 256 MB;
"Retrieve" ``GET /v1/messages/batches/{id}``; "List" ``GET /v1/messages/batches``, newest
first, paged by ``after_id`` / ``before_id`` and ``limit``; "Cancel" ``POST
/v1/messages/batches/{id}/cancel``; "Retrieve results" ``GET
/v1/messages/batches/{id}/results``, JSONL in any order) and the batch-processing guide
(``processing_status`` ``in_progress`` → ``canceling`` → ``ended``; ``request_counts``
``processing``, ``succeeded``, ``errored``, ``canceled``, ``expired``, all but processing
zero until the batch ends; a custom_id matches ``^[a-zA-Z0-9_-]{1,64}$`` and is unique in
its batch; ``params`` are validated when a request is processed, so a bad one ends
``errored`` with ``invalid_request_error``), and on anthropic-python's
``anthropic.types.messages.MessageBatch`` and ``MessageBatchIndividualResponse``, which
tests validate these objects with. A succeeded line's ``result.message`` is the server's own
online reply to those params (same builders, same markers).

Knobs (attributes of :class:`MessageBatches`, ``server.message_batches``; read on every call):

- ``processing_s``: from creation to ``ended``; 0: ended at the first look.
- ``expire_after_lines``: a batch ends at its first look, its first N requests processed
  and the rest ``expired`` (an expired batch still returns its finished lines).
- ``cancel_after_lines``: a cancelled batch (``canceling``) ends at its next look with its
  first N requests processed and the rest ``canceled``.
- ``drop_marker``: a request whose text holds it has no line in the results (missing).
- ``error_marker``: a request whose text holds it ends ``errored`` with ``api_error`` (a
  server error: retryable); the server's ``reject_marker`` one ends ``invalid_request_error``.
- ``create_429``: how many creations to refuse with 429 ``rate_limit_error`` first.
- ``hold``: names of calls held open while named: ``create`` before doing anything,
  ``create-answer`` after creating (its answer lost), ``get``, ``results``, ``list``;
  ``held`` counts the calls held so far by name. A test kills aiq meanwhile.

``submitted`` logs the prompt of every request of every batch created: a prompt twice in
it was submitted twice. ``calls`` logs (method, path, status). :meth:`cancel_all` cancels
every open batch, as a user would in the Console.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import re
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from . import anthropic
from .faults import rejects
from .replies import prompt_of

if TYPE_CHECKING:
    from .server import FakeServer

MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1000 * 1000
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PATH = "/v1/messages/batches"


def _stamp(seconds: float) -> str:
    """An RFC 3339 UTC time, as Anthropic writes them."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class MessageBatches:
    """The Message Batches endpoints of one FakeServer."""

    def __init__(self, server: FakeServer) -> None:
        self._server = server
        self.processing_s = 0.0
        self.expire_after_lines: int | None = None
        self.cancel_after_lines = 0
        self.drop_marker: str | None = "DROP_LINE"
        self.error_marker: str | None = "BATCH_API_ERROR"
        self.create_429 = 0
        self.hold: set[str] = set()
        self.held: Counter[str] = Counter()
        self.submitted: list[str] = []
        self.calls: list[tuple[str, str, int]] = []
        self.batches: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def routes(self, app: web.Application) -> None:
        """Register the endpoints (before the server's catch-all POST)."""
        app.router.add_post(_PATH, self._create)
        app.router.add_get(_PATH, self._list)
        app.router.add_get(_PATH + "/{id}", self._get)
        app.router.add_get(_PATH + "/{id}/results", self._results)
        app.router.add_post(_PATH + "/{id}/cancel", self._cancel)

    # -- what tests read and do ---------------------------------------------------------

    def submitted_twice(self) -> dict[str, int]:
        """Prompts submitted in more than one request, and how many times."""
        with self._lock:
            return {p: n for p, n in Counter(self.submitted).items() if n > 1}

    def created(self) -> int:
        with self._lock:
            return len(self.batches)

    def cancel_all(self) -> None:
        """Cancel every open batch, as a user would."""
        with self._lock:
            for b in self.batches.values():
                self._start_cancel(b)

    # -- helpers ------------------------------------------------------------------------

    async def _hold(self, name: str) -> None:
        if name in self.hold:
            with self._lock:
                self.held[name] += 1
            while name in self.hold:
                await asyncio.sleep(0.02)

    def _json(self, request: web.Request, payload: Any, status: int = 200) -> web.Response:
        with self._lock:
            self.calls.append((request.method, request.path, status))
        digest = hashlib.sha256(f"{time.time()}{request.path}".encode()).hexdigest()[:24]
        return web.json_response(
            payload, status=status, headers={"request-id": "req_" + digest},
            dumps=lambda o: orjson.dumps(o).decode(),
        )  # fmt: skip

    def _error(self, request: web.Request, status: int, message: str | None = None) -> web.Response:
        return self._json(request, anthropic.error_body(status, message), status)

    def _refusal(self, request: web.Request) -> web.Response | None:
        if (status := anthropic.refusal(request.headers, self._server.require_key)) is not None:
            return self._error(request, status)
        if anthropic.VERSION_HEADER not in request.headers:
            return self._error(request, 400, f"{anthropic.VERSION_HEADER}: header is required")
        return None

    def _batch(self, request: web.Request) -> dict[str, Any] | None:
        return self.batches.get(request.match_info["id"])

    # -- the endpoints ------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        await self._hold("create")
        raw = await request.read()
        if self.create_429 > 0:
            self.create_429 -= 1
            response = self._error(request, 429, "Number of batch creations exceeds your limit.")
            response.headers.update(anthropic.retry_after(0.2))
            return response
        try:
            requests = orjson.loads(raw)["requests"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return self._error(request, 400, "requests: Field required")
        if why := _refused(requests, len(raw)):
            return self._error(request, 400 if "bytes" not in why else 413, why)
        now = time.time()
        batch_id = f"msgbatch_{next(self._ids):04d}" + hashlib.sha256(raw).hexdigest()[:20]
        obj: dict[str, Any] = {
            "id": batch_id, "type": "message_batch", "processing_status": "in_progress",
            "request_counts": {
                "processing": len(requests), "succeeded": 0, "errored": 0, "canceled": 0,
                "expired": 0,
            },
            "ended_at": None, "created_at": _stamp(now), "expires_at": _stamp(now + 86400),
            "archived_at": None, "cancel_initiated_at": None, "results_url": None,
        }  # fmt: skip
        with self._lock:
            self.batches[batch_id] = obj
            obj["_requests"], obj["_started"] = requests, time.monotonic()
            obj["_origin"] = f"{request.scheme}://{request.host}"
            self.submitted.extend(prompt_of(anthropic.PATH, r["params"]) for r in requests)
        await self._hold("create-answer")
        return self._json(request, _public(obj))

    async def _list(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        await self._hold("list")
        with self._lock:
            for b in self.batches.values():
                self._advance(b)
            items = [_public(b) for b in sorted(self.batches.values(), key=lambda b: b["id"])]
        items.reverse()  # newest first
        return self._json(request, _page(items, request))

    async def _get(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        await self._hold("get")
        if (obj := self._batch(request)) is None:
            return self._error(request, 404, "No such Message Batch")
        with self._lock:
            self._advance(obj)
            public = _public(obj)
        return self._json(request, public)

    async def _cancel(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        if (obj := self._batch(request)) is None:
            return self._error(request, 404, "No such Message Batch")
        with self._lock:
            self._start_cancel(obj)
            public = _public(obj)
        return self._json(request, public)

    async def _results(self, request: web.Request) -> web.StreamResponse:
        if (no := self._refusal(request)) is not None:
            return no
        await self._hold("results")
        obj = self._batch(request)
        if obj is None or obj["processing_status"] != "ended":
            return self._error(request, 404 if obj is None else 400, "No results yet")
        with self._lock:
            self.calls.append((request.method, request.path, 200))
        return web.Response(body=obj["_results"], content_type="application/binary")

    # -- a batch's life -----------------------------------------------------------------

    def _start_cancel(self, obj: dict[str, Any]) -> None:
        if obj["processing_status"] == "in_progress":
            obj["processing_status"] = "canceling"
            obj["cancel_initiated_at"] = _stamp(time.time())

    def _advance(self, obj: dict[str, Any]) -> None:
        """Move a batch on by the clock at a look (under the lock)."""
        status = obj["processing_status"]
        if status == "ended":
            return
        n = len(obj["_requests"])
        if status == "canceling":
            self._end(obj, self.cancel_after_lines, "canceled")
        elif self.expire_after_lines is not None:
            self._end(obj, self.expire_after_lines, "expired")
        elif time.monotonic() - obj["_started"] >= self.processing_s:
            self._end(obj, n, "expired")

    def _end(self, obj: dict[str, Any], done: int, rest: str) -> None:
        """End a batch: its first ``done`` requests processed, the rest ``rest`` (canceled
        or expired); dropped ones in no line; the lines in a shuffled order."""
        counts = obj["request_counts"]
        lines = []
        for i, item in enumerate(obj["_requests"]):
            params, custom_id = item["params"], item["custom_id"]
            text = orjson.dumps(params).decode()
            if i >= done:
                result: dict[str, Any] = {"type": rest}
            else:
                result = self._result(params, text)
            counts[result["type"]] += 1
            if self.drop_marker is not None and self.drop_marker in text:
                continue
            lines.append(orjson.dumps({"custom_id": custom_id, "result": result}))
        random.Random(obj["id"]).shuffle(lines)
        counts["processing"] = 0
        obj["processing_status"], obj["ended_at"] = "ended", _stamp(time.time())
        obj["results_url"] = f"{obj['_origin']}{_PATH}/{obj['id']}/results"
        obj["_results"] = b"".join(line + b"\n" for line in lines)

    def _result(self, params: Any, text: str) -> dict[str, Any]:
        """One processed request's result: the online reply, or its error."""
        server = self._server
        prompt = prompt_of(anthropic.PATH, params)
        error = None
        if (why := anthropic.invalid({anthropic.VERSION_HEADER: "-"}, params)) is not None:
            error = ("invalid_request_error", why)
        elif rejects(server, anthropic.PATH, params, prompt):
            error = ("invalid_request_error", "The request was rejected as invalid.")
        elif self.error_marker is not None and self.error_marker in text:
            error = ("api_error", "Internal server error")
        if error is not None:
            body = {"type": "error", "error": {"type": error[0], "message": error[1]}}
            return {"type": "errored", "error": body}
        _, message = server.batch_reply(anthropic.PATH, params, prompt)  # as online
        return {"type": "succeeded", "message": message}


def _refused(requests: Any, size: int) -> str | None:
    """Why a create is refused at once (400): the shape, the limits, the custom_ids."""
    if not isinstance(requests, list) or not requests:
        return "requests: a non-empty array is required"
    if len(requests) > MAX_REQUESTS:
        return f"requests: at most {MAX_REQUESTS} requests per batch"
    if size > MAX_BYTES:
        return f"request body over {MAX_BYTES} bytes"
    seen: set[str] = set()
    for i, r in enumerate(requests):
        custom_id = r.get("custom_id") if isinstance(r, dict) else None
        if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
            return f"requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if custom_id in seen:
            return f"requests.{i}.custom_id: duplicate custom_id {custom_id}"
        if not isinstance(r.get("params"), dict):
            return f"requests.{i}.params: Field required"
        seen.add(custom_id)
    return None


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def _page(items: list[dict[str, Any]], request: web.Request) -> dict[str, Any]:
    """A list page, as Anthropic pages them (``after_id`` for the next, older, page)."""
    ids = [i["id"] for i in items]
    if (after := request.query.get("after_id")) is not None:
        items = items[ids.index(after) + 1 :] if after in ids else []
    elif (before := request.query.get("before_id")) is not None:
        items = items[: ids.index(before)] if before in ids else []
    limit = int(request.query.get("limit", "20"))
    page = items[:limit]
    return {
        "data": page, "has_more": len(items) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }  # fmt: skip
