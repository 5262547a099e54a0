"""Stream a JSONL prompt file into validated requests, each with its content key.

Three line shapes are accepted (DESIGN.md, "Input lines"):

1. OpenAI Batch API: ``{"custom_id", "method": "POST", "url": "/v1/...", "body": {...}}``
2. Chat: ``{"custom_id"?, "messages": [...], "model"?, any other body fields}``
3. Prompt: ``{"custom_id"?, "prompt": "text", "system"?, "model"?, other body fields}``

The job key is a tagged sha256 over the endpoint and the canonical JSON of the body after
defaults (sorted keys, compact, UTF-8), so key order and whitespace never change it and any
body field does. The file is read line by line: memory stays flat however large it is.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import InputError

# Bump when the canonical form changes: old keys then stop matching new ones visibly.
KEY_TAG = b"aiq-key-v1\n"

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS)

_BOM = b"\xef\xbb\xbf"
_ENVELOPE = frozenset({"custom_id", "method", "url", "body"})
_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


@dataclass(frozen=True, slots=True)
class Defaults:
    """Body defaults from config and flags, applied to lines that leave them out."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    system: str | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One valid input line: what to send, under which key, for which custom_id."""

    line_no: int
    custom_id: str
    endpoint: str
    body: bytes  # canonical JSON, exactly what is sent
    key: bytes  # 32-byte sha256 digest
    line: bytes  # the original line, stripped, for dead letters
    derived_id: bool  # custom_id was derived from the key (the line had none)


@dataclass(frozen=True, slots=True)
class BadLine:
    """An invalid input line, reported and skipped."""

    path: str
    line_no: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line_no}: {self.reason}"


class LineError(ValueError):
    """Why one line is invalid; the reader turns it into a BadLine with file and line."""


def canonical(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, UTF-8 (not ASCII-escaped)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def job_key(endpoint: str, body: bytes) -> bytes:
    """The dedup key of a request: sha256 over a version tag, the endpoint and the body."""
    return hashlib.sha256(KEY_TAG + endpoint.encode() + b"\n" + body).digest()


def _kind(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _expect(obj: dict[str, Any], field: str, types: tuple[type, ...], what: str) -> None:
    value = obj[field]
    # bool is an int in Python but not a number in JSON's sense here.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise LineError(f"field {field!r}: expected {what}, got {_kind(value)}")


def _check_messages(messages: Any, field: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise LineError(f"field {field!r}: expected a non-empty array of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise LineError(f"field {field}[{i}]: expected an object with a string 'role'")


def _apply_defaults(endpoint: str, body: dict[str, Any], d: Defaults) -> None:
    if "model" not in body and d.model is not None:
        body["model"] = d.model
    if "model" not in body:
        raise LineError("field 'model': missing; give --model or set `model` in the config")
    _expect(body, "model", (str,), "a string")
    if endpoint == EMBEDDINGS:
        return
    for field, value in (("max_tokens", d.max_tokens), ("temperature", d.temperature)):
        if field not in body and value is not None:
            body[field] = value
    if "max_tokens" in body:
        _expect(body, "max_tokens", (int,), "an integer")
    if "temperature" in body:
        _expect(body, "temperature", (int, float), "a number")
    if endpoint == CHAT and d.system is not None:
        messages = body["messages"]
        if not any(m.get("role") == "system" for m in messages):
            body["messages"] = [{"role": "system", "content": d.system}, *messages]


def _split(obj: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(endpoint, body) of a line of any of the three shapes; raises LineError."""
    if "body" in obj or "url" in obj:
        extra = obj.keys() - _ENVELOPE
        if extra:
            raise LineError(f"field {sorted(extra)[0]!r}: not allowed beside 'url' and 'body'")
        for field in ("url", "body"):
            if field not in obj:
                raise LineError(f"field {field!r}: missing (a Batch API line needs url and body)")
        _expect(obj, "url", (str,), "a string")
        _expect(obj, "body", (dict,), "an object")
        if obj.get("method", "POST") != "POST":
            raise LineError("field 'method': only POST is supported")
        endpoint = obj["url"]
        if endpoint not in ENDPOINTS:
            raise LineError(f"field 'url': {endpoint!r} is not one of {', '.join(ENDPOINTS)}")
        body = dict(obj["body"])
        if endpoint == CHAT:
            _check_messages(body.get("messages"), "body.messages")
        elif endpoint == COMPLETIONS and "prompt" not in body:
            raise LineError("field 'body.prompt': missing")
        elif endpoint == EMBEDDINGS and "input" not in body:
            raise LineError("field 'body.input': missing")
        return endpoint, body
    body = {k: v for k, v in obj.items() if k != "custom_id"}
    if "messages" in body:
        _check_messages(body["messages"], "messages")
        return CHAT, body
    if "prompt" in body:
        _expect(body, "prompt", (str,), "a string")
        messages = [{"role": "user", "content": body.pop("prompt")}]
        if "system" in body:
            _expect(body, "system", (str,), "a string")
            messages.insert(0, {"role": "system", "content": body.pop("system")})
        body["messages"] = messages
        return CHAT, body
    raise LineError("no 'messages', 'prompt' or 'body': not a chat, prompt or Batch API line")


def parse_line(raw: bytes, line_no: int, defaults: Defaults) -> Request:
    """Validate one stripped, non-blank line; raises LineError saying what is wrong."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LineError(f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {_kind(obj)}")
    endpoint, body = _split(obj)
    _apply_defaults(endpoint, body, defaults)
    data = canonical(body)
    key = job_key(endpoint, data)
    custom_id = obj.get("custom_id")
    if custom_id is None:
        return Request(line_no, "k-" + key.hex()[:24], endpoint, data, key, raw, True)
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError(f"field 'custom_id': expected a non-empty string, got {_kind(custom_id)}")
    return Request(line_no, custom_id, endpoint, data, key, raw, False)


def read_requests(path: str | os.PathLike[str], defaults: Defaults) -> Iterator[Request | BadLine]:
    """Yield a Request or a BadLine for every non-blank line of a JSONL file, in order.

    A custom_id given twice in one file makes the later line a BadLine. Raises InputError
    when the file itself cannot be read.
    """
    name = str(path)
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{name}: is a directory; give a JSONL file")
    try:
        f = p.open("rb")
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read ({exc.strerror})") from None
    # Hashes, not strings: a million custom_ids would otherwise cost ~100 MB. A false
    # "appears twice" needs a 64-bit hash collision within one file.
    seen: set[int] = set()
    with f:
        for line_no, raw in enumerate(f, 1):
            if line_no == 1 and raw.startswith(_BOM):
                raw = raw[3:]
            raw = raw.strip()
            if not raw:
                continue
            try:
                req = parse_line(raw, line_no, defaults)
            except LineError as exc:
                yield BadLine(name, line_no, str(exc))
                continue
            if not req.derived_id:
                h = hash(req.custom_id)
                if h in seen:
                    yield BadLine(name, line_no, f"custom_id {req.custom_id!r} appears twice")
                    continue
                seen.add(h)
            yield req
