"""OpenAI's Files and Batches API, as the fake server serves it.

Modelled on OpenAI's API reference ("Batch": create, retrieve, cancel, list; "Files":
upload, list, retrieve content) and the Batch API guide (the input line
``{custom_id, method, url, body}``; the output line ``{id, custom_id, response: {status_code,
request_id, body}, error}``; an expired or cancelled batch's unfinished lines in the error
file with ``error.code`` ``batch_expired`` / ``batch_cancelled``; a batch that fails
validation carries ``errors.data[]`` of ``{code, line, message, param}``), and on
openai-python's ``openai.types.Batch`` and ``FileObject``, which tests validate these objects
with. Each line's reply is the server's own online reply to that request (same builders, same
markers), so a result via batch is the one an online call would get.

Knobs (attributes of :class:`Batches`, ``server.batches``; read on every call):

- ``processing_s``: from creation to ``completed`` (``validating`` for its first tenth,
  ``in_progress``, then one look at ``finalizing``); 0: completed at the first look.
- ``expire_after_lines``: a batch expires at its first look, its first N lines done and the
  rest in the error file as ``batch_expired``.
- ``drop_marker``: a line whose text holds it appears in neither file (a "missing" line).
- ``invalid_marker``: a batch with such lines fails validation, ``errors.data[]`` naming them.
- ``create_429``: how many creations to refuse with 429 (OpenAI's creation cap) first.
- ``token_limit_batches``: how many batches to fail at creation on the organization's
  enqueued-token limit (``errors.data[]`` of one ``token_limit_exceeded``, no line), first.
- ``hold``: names of calls to hold open, never answered while named: ``upload`` and
  ``create`` before doing anything; ``upload-answer``, ``create-answer`` after doing it (its
  answer lost); ``get`` (a look), ``content`` (a download), ``error-content`` (the download
  of an error file: its batch's output file is read by then), ``cancel`` (before doing
  anything). A test kills aiq meanwhile.
  ``held`` counts the calls held so far by name.

``submitted`` logs every line of every batch created, by prompt: a prompt twice in it was
submitted twice. :meth:`cancel_all` cancels every open batch, as a user would in the
dashboard (``cancelling``, then ``cancelled`` at the next look, its first
``cancel_after_lines`` lines done).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import BodyPartReader, web

from .replies import error_body, prompt_of

if TYPE_CHECKING:
    from .server import FakeServer

_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
_OPEN = ("validating", "in_progress", "finalizing", "cancelling")


class Batches:
    """The Files and Batches endpoints of one FakeServer."""

    def __init__(self, server: FakeServer) -> None:
        self._server = server
        self.processing_s = 0.0
        self.expire_after_lines: int | None = None
        self.cancel_after_lines = 0
        self.drop_marker: str | None = "DROP_LINE"
        self.invalid_marker: str | None = "INVALID_LINE"
        self.create_429 = 0
        self.token_limit_batches = 0
        self.hold: set[str] = set()
        self.held: Counter[str] = Counter()
        self.submitted: list[str] = []  # prompts of every line of every batch created
        self.calls: list[tuple[str, str, int]] = []  # (method, path, status)
        self.files: dict[str, dict[str, Any]] = {}
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def routes(self, app: web.Application) -> None:
        """Register the endpoints (before the server's catch-all POST)."""
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files", self._list_files)
        app.router.add_get("/v1/files/{id}", self._file)
        app.router.add_get("/v1/files/{id}/content", self._content)
        app.router.add_post("/v1/batches", self._create)
        app.router.add_get("/v1/batches", self._list_batches)
        app.router.add_get("/v1/batches/{id}", self._get)
        app.router.add_post("/v1/batches/{id}/cancel", self._cancel)

    # -- what tests read and do ---------------------------------------------------------

    def submitted_twice(self) -> dict[str, int]:
        """Prompts submitted in more than one batch line, and how many times."""
        with self._lock:
            return {p: n for p, n in Counter(self.submitted).items() if n > 1}

    def created(self) -> int:
        with self._lock:
            return len(self.batches)

    def cancel_all(self) -> None:
        """Cancel every open batch, as a user would."""
        with self._lock:
            for b in self.batches.values():
                if b["status"] in ("validating", "in_progress", "finalizing"):
                    b["status"], b["cancelling_at"] = "cancelling", int(time.time())

    # -- helpers ------------------------------------------------------------------------

    def _new_id(self, prefix: str) -> str:
        salt = hashlib.sha256(str(time.time()).encode()).hexdigest()[:8]
        return f"{prefix}-{next(self._ids):06d}{salt}"

    async def _hold(self, name: str) -> None:
        if name in self.hold:
            with self._lock:
                self.held[name] += 1
            while name in self.hold:
                await asyncio.sleep(0.02)

    def _json(self, request: web.Request, payload: Any, status: int = 200) -> web.Response:
        with self._lock:
            self.calls.append((request.method, request.path, status))
        return web.json_response(payload, status=status, dumps=lambda o: orjson.dumps(o).decode())

    def _refusal(self, request: web.Request) -> web.Response | None:
        key = self._server.require_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return self._json(request, error_body(401), 401)
        return None

    # -- files --------------------------------------------------------------------------

    async def _upload(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        await self._hold("upload")
        purpose, filename, content = None, "file", b""
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "purpose":
                purpose = (await part.read()).decode()
            elif part.name == "file":
                filename = part.filename or filename
                content = bytes(await part.read())
        if purpose != "batch":
            return self._json(request, error_body(400, "purpose must be batch"), 400)
        file_id = self._new_id("file")
        obj = {
            "id": file_id, "object": "file", "bytes": len(content),
            "created_at": int(time.time()), "filename": filename, "purpose": "batch",
            "status": "processed",
        }  # fmt: skip
        with self._lock:
            self.files[file_id], self.contents[file_id] = obj, content
        await self._hold("upload-answer")
        return self._json(request, obj)

    async def _list_files(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        purpose = request.query.get("purpose")
        with self._lock:
            files = [f for f in self.files.values() if purpose in (None, f["purpose"])]
        files.sort(key=lambda f: f["id"], reverse=request.query.get("order", "desc") == "desc")
        return self._json(request, _page(files, request))

    async def _file(self, request: web.Request) -> web.Response:
        obj = self.files.get(request.match_info["id"])
        if obj is None:
            return self._json(request, error_body(404, "No such File object"), 404)
        return self._json(request, obj)

    async def _content(self, request: web.Request) -> web.StreamResponse:
        if (no := self._refusal(request)) is not None:
            return no
        await self._hold("content")
        file = self.files.get(request.match_info["id"]) or {}
        if str(file.get("filename", "")).endswith("_error.jsonl"):
            await self._hold("error-content")  # the output file read, the error file not
        content = self.contents.get(request.match_info["id"])
        if content is None:
            return self._json(request, error_body(404, "No such File object"), 404)
        with self._lock:
            self.calls.append((request.method, request.path, 200))
        return web.Response(body=content, content_type="application/octet-stream")

    # -- batches ------------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        await self._hold("create")
        body = orjson.loads(await request.read())
        if self.create_429 > 0:
            self.create_429 -= 1
            payload = error_body(
                429, "Too many batch creations; try again later.", code="rate_limit_exceeded"
            )
            response = self._json(request, payload, 429)
            response.headers["retry-after-ms"] = "200"
            return response
        content = self.contents.get(body.get("input_file_id"))
        if content is None:
            return self._json(request, error_body(400, "No such input file"), 400)
        if body.get("endpoint") not in _ENDPOINTS or body.get("completion_window") != "24h":
            return self._json(request, error_body(400, "Invalid endpoint or window"), 400)
        now = int(time.time())
        lines = [orjson.loads(line) for line in content.splitlines() if line.strip()]
        batch_id = self._new_id("batch")
        obj: dict[str, Any] = {
            "id": batch_id, "object": "batch", "endpoint": body["endpoint"], "errors": None,
            "input_file_id": body["input_file_id"], "completion_window": "24h",
            "status": "validating", "output_file_id": None, "error_file_id": None,
            "created_at": now, "in_progress_at": None, "expires_at": now + 86400,
            "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": body.get("metadata") or {},
        }  # fmt: skip
        invalid = self._invalid(lines, body["endpoint"])
        if self.token_limit_batches > 0:
            self.token_limit_batches -= 1
            invalid = [{
                "code": "token_limit_exceeded", "line": None, "param": None,
                "message": "Enqueued token limit reached for the model in organization "
                "org-fake. Please try again once some in_progress batches have been completed.",
            }]  # fmt: skip
        if invalid:
            obj.update(status="failed", failed_at=now)
            obj["errors"] = {"object": "list", "data": invalid}
        with self._lock:
            self.batches[batch_id] = obj
            obj["_lines"], obj["_started"] = lines, time.monotonic()
            if not invalid:
                self.submitted.extend(prompt_of(ln["url"], ln["body"]) for ln in lines)
        await self._hold("create-answer")
        return self._json(request, _public(obj))

    def _invalid(self, lines: list[dict], endpoint: str) -> list[dict]:
        """errors.data[] of a batch failing validation: lines with the marker, or of another
        endpoint, or repeating a custom_id."""
        out, seen = [], set()
        marker = self.invalid_marker
        for n, line in enumerate(lines, 1):
            text = orjson.dumps(line.get("body")).decode()
            why = None
            if line.get("url") != endpoint:
                why = ("invalid_url", "The url of this line differs from the batch's endpoint.")
            elif line.get("custom_id") in seen:
                why = ("duplicate_custom_id", "The custom_id of this line is a duplicate.")
            elif marker is not None and marker in text:
                why = ("invalid_request", "This line is not a valid request.")
            seen.add(line.get("custom_id"))
            if why is not None:
                out.append({"code": why[0], "line": n, "message": why[1], "param": None})
        return out

    async def _list_batches(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        with self._lock:
            batches = sorted(self.batches.values(), key=lambda b: b["id"], reverse=True)
            batches = [_public(b) for b in batches]
        return self._json(request, _page(batches, request))

    async def _get(self, request: web.Request) -> web.Response:
        if (no := self._refusal(request)) is not None:
            return no
        await self._hold("get")
        obj = self.batches.get(request.match_info["id"])
        if obj is None:
            return self._json(request, error_body(404, "No such Batch object"), 404)
        with self._lock:
            self._advance(obj)
            public = _public(obj)
        return self._json(request, public)

    async def _cancel(self, request: web.Request) -> web.Response:
        await self._hold("cancel")
        obj = self.batches.get(request.match_info["id"])
        if obj is None:
            return self._json(request, error_body(404, "No such Batch object"), 404)
        with self._lock:
            if obj["status"] in ("validating", "in_progress", "finalizing"):
                obj["status"], obj["cancelling_at"] = "cancelling", int(time.time())
            public = _public(obj)
        return self._json(request, public)

    # -- a batch's life -----------------------------------------------------------------

    def _advance(self, obj: dict[str, Any]) -> None:
        """Move a batch on by the clock at a look (under the lock)."""
        status = obj["status"]
        if status not in _OPEN:
            return
        now = int(time.time())
        lines = obj["_lines"]
        if status == "cancelling":
            self._finish(obj, "cancelled", self.cancel_after_lines, "batch_cancelled")
            return
        if self.expire_after_lines is not None:
            self._finish(obj, "expired", self.expire_after_lines, "batch_expired")
            return
        elapsed = time.monotonic() - obj["_started"]
        if self.processing_s > 0:
            if elapsed < self.processing_s / 10:
                return
            if elapsed < self.processing_s:
                obj["status"], obj["in_progress_at"] = "in_progress", obj["in_progress_at"] or now
                share = elapsed / self.processing_s
                obj["request_counts"]["completed"] = int(len(lines) * share)
                return
            if status != "finalizing":
                obj["status"], obj["finalizing_at"] = "finalizing", now
                obj["request_counts"]["completed"] = len(lines)
                return
        self._finish(obj, "completed", len(lines), None)

    def _finish(self, obj: dict[str, Any], status: str, done: int, code: str | None) -> None:
        """End a batch: its first ``done`` lines answered (output or error file), the rest
        with ``code`` in the error file; dropped lines in neither."""
        out, errors = [], []
        completed = failed = 0
        for n, line in enumerate(obj["_lines"]):
            url, body, custom_id = line["url"], line["body"], line["custom_id"]
            prompt = prompt_of(url, body)
            text = orjson.dumps(body).decode()
            if self.drop_marker is not None and self.drop_marker in text:
                continue
            seed = f"{obj['id']}:{n}".encode()
            line_id = "batch_req_" + hashlib.sha256(seed).hexdigest()[:24]
            if n >= done:
                message = f"This request could not be executed before the batch was {status}."
                errors.append({
                    "id": line_id, "custom_id": custom_id, "response": None,
                    "error": {"code": code, "message": message},
                })  # fmt: skip
                continue
            status_code, payload = self._server.batch_reply(url, body, prompt)
            request_id = "req_" + hashlib.sha256(orjson.dumps(body)).hexdigest()[:24]
            entry = {
                "id": line_id, "custom_id": custom_id,
                "response": {"status_code": status_code, "request_id": request_id, "body": payload},
                "error": None,
            }  # fmt: skip
            if status_code == 200:
                out.append(entry)
                completed += 1
            else:
                errors.append(entry)
                failed += 1
        now = int(time.time())
        obj["status"] = status
        obj[f"{status}_at"] = now
        obj["request_counts"].update(completed=completed, failed=failed)
        for key, lines in (("output_file_id", out), ("error_file_id", errors)):
            if lines:
                file_id = self._new_id("file")
                content = b"".join(orjson.dumps(x) + b"\n" for x in lines)
                self.contents[file_id] = content
                self.files[file_id] = {
                    "id": file_id, "object": "file", "bytes": len(content), "created_at": now,
                    "filename": f"{obj['id']}_{key[:-8]}.jsonl", "purpose": "batch_output",
                    "status": "processed",
                }  # fmt: skip
                obj[key] = file_id


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def _page(items: list[dict[str, Any]], request: web.Request) -> dict[str, Any]:
    """A list page, as OpenAI's cursor pagination gives it (``after``, ``limit``)."""
    after = request.query.get("after")
    if after is not None:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    limit = int(request.query.get("limit", "20"))
    page = items[:limit]
    return {
        "object": "list", "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }  # fmt: skip
