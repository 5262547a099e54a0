"""Stream a JSONL prompt file into validated requests, each with its content key.

Four line shapes are accepted (DESIGN.md, "Input lines"):

1. OpenAI Batch API: ``{"custom_id", "method": "POST", "url": "/v1/...", "body": {...}}``
2. Chat: ``{"custom_id"?, "messages": [...], "model"?, any other body fields}``
3. Prompt: ``{"custom_id"?, "prompt": "text", "system"?, "model"?, other body fields}``
4. Anthropic Message Batches: ``{"custom_id", "params": {...}}``, endpoint ``/v1/messages``

The job key is a tagged sha256 over the endpoint and the canonical JSON of the body after
defaults (sorted keys, compact, UTF-8), so key order and whitespace never change it and any
body field does. Reading whole files is ``requestfile``'s job; this module is what one line
means.

`aiq add` must read 100,000 lines/s, so the per-line path avoids copies and calls: the
object orjson returns is this module's to mutate, and a ``Request`` is a named tuple (a
frozen dataclass costs four times as much to build).
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from .defaults import (
    APPLIED_MAX_COMPLETION_TOKENS,
    APPLIED_MAX_TOKENS,
    APPLIED_MODEL,
    APPLIED_SYSTEM,
    APPLIED_TEMPERATURE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    PRIORITY_RANGE,
    WITHHELD_TEMPERATURE,
    Defaults,
    is_reasoning_model,
)

# Named here too, where callers and tests have long imported them.
from .defaults import DEFAULT_NAMES as DEFAULT_NAMES
from .defaults import MASKS as MASKS
from .defaults import count_defaults as count_defaults

if TYPE_CHECKING:
    from .idset import IdSet

# Bump when the canonical form changes: old keys then stop matching new ones visibly.
KEY_TAG = b"aiq-key-v1\n"
# Bump when validation or defaulting changes: files added before are then read again in
# full rather than resumed after the prefix the store remembers.
# 2: Message Batches lines, refused before, are valid. 3: /v1/responses lines too. 4: lines
# without a custom_id are named line-N; defaults skip complete requests, lines that say the
# same another way and models that refuse them.
RULES_VERSION = "4"

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)
MESSAGES = "/v1/messages"  # Anthropic's; only Message Batches lines use it

_NON_JSON_NUMBER = re.compile(rb"-?(?:NaN|Infinity)")
_ID_KEY = struct.Struct(">q")  # a custom_id hash as an IdSet key and as an integer
_ENVELOPE = frozenset({"custom_id", "method", "url", "body"})
_MISSING: Any = object()
_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}
# The key's constant head per endpoint, hashed once: sha256 then only sees the body.
_KEY_HEADS = {e: hashlib.sha256(KEY_TAG + e.encode() + b"\n") for e in (*ENDPOINTS, MESSAGES)}
# Bound once for the per-line path.
_loads, _dumps, _blake2b, _new_tuple = orjson.loads, orjson.dumps, hashlib.blake2b, tuple.__new__


_INSTRUCTION_ROLES = frozenset({"system", "developer"})


class Request(NamedTuple):
    """One valid input line: what to send, under which key, for which custom_id."""

    line_no: int
    custom_id: str
    endpoint: str
    body: bytes  # canonical JSON, exactly what is sent
    key: bytes  # 32-byte sha256 digest
    line: bytes  # the original line, stripped, for dead letters
    derived_id: bool  # the line had no custom_id: it is named by its number, line-N
    id_hash: int  # custom_id_hash(custom_id), the store's short id for the item
    applied: int  # which defaults the line took: APPLIED_* bits (and WITHHELD_TEMPERATURE)
    priority: int = 0  # claimed before lower ones (its own ``priority`` or the file's)


# Invalid lines kept with their reasons, for reports (which show the first 50); the rest are
# only counted. A file that is not JSONL at all (a CSV by mistake) has an invalid line per line:
# a reason kept for each took 625 MB for a million of them.
KEEP_BAD_LINES = 1_000


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
    # orjson hands back bytes holding a 4 KiB buffer however short the JSON: copied to its
    # length, 10,000 bodies in flight take 1.5 MB instead of 40.
    return bytes(memoryview(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)))


def job_key(endpoint: str, body: bytes) -> bytes:
    """The dedup key of a request: sha256 over a version tag, the endpoint and the body."""
    head = _KEY_HEADS.get(endpoint)
    if head is None:
        return hashlib.sha256(KEY_TAG + endpoint.encode() + b"\n" + body).digest()
    h = head.copy()
    h.update(body)
    return h.digest()


def custom_id_hash(custom_id: str) -> int:
    """A stable signed 64-bit hash of a custom_id (``hash()`` changes from run to run)."""
    digest = hashlib.blake2b(custom_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def rules_fingerprint(defaults: Defaults) -> str:
    """What decides how a line reads: a stored prefix read under other rules is read again."""
    head = KEY_TAG + RULES_VERSION.encode()
    rules = astuple(defaults)
    if defaults.priority is None:  # as before priorities: stored prefixes stay good
        rules = rules[:4]
    return hashlib.sha256(head + canonical(rules)).hexdigest()[:32]


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


_REASONING_OF: dict[str, bool] = {}  # by model name: a file names a few, looked up per line


def _remember_reasoning(model: str) -> bool:
    if len(_REASONING_OF) > 10_000:  # a file naming a new model per line: stay bounded
        _REASONING_OF.clear()
    reasoning = _REASONING_OF[model] = is_reasoning_model(model)
    return reasoning


def _apply_defaults(endpoint: str, body: dict[str, Any], d: Defaults, complete: bool) -> int:
    """Fill in what the line leaves out; returns which defaults it took (APPLIED_* bits).

    A default is never added where the line says the same thing another way, nor where the
    model does not take it. A complete request (a Batch API or Message Batches line) takes
    the model at most: it is what the same file would send through those APIs, answers and
    dedup keys alike, so the config's max_tokens, temperature and system are not added to it.
    """
    applied = 0
    if "model" in body:
        _expect(body, "model", (str,), "a string")
    elif d.model is not None:
        body["model"] = d.model
        applied = APPLIED_MODEL
    else:
        raise LineError("field 'model': missing; give --model or set `model` in the config")
    if endpoint == EMBEDDINGS:
        return applied
    # The line's own fields are checked whatever the defaults (inline: this runs every line).
    ceiling = False
    if "max_tokens" in body:
        _expect(body, "max_tokens", (int,), "an integer")
        ceiling = True
    if "max_completion_tokens" in body:
        _expect(body, "max_completion_tokens", (int,), "an integer")
        ceiling = True
    if endpoint == RESPONSES and "max_output_tokens" in body:
        _expect(body, "max_output_tokens", (int,), "an integer")
    if "temperature" in body:
        _expect(body, "temperature", (int, float), "a number")
    if complete or (d.max_tokens is None and d.temperature is None and d.system is None):
        return applied
    return applied | _chat_defaults(body, d, ceiling)


def _chat_defaults(body: dict[str, Any], d: Defaults, ceiling: bool) -> int:
    """The config's max_tokens, temperature and system for a chat or prompt line (``ceiling``:
    it sets its own max_tokens or max_completion_tokens), as the line's model takes them: a
    reasoning model's ceiling is max_completion_tokens, and it refuses a temperature unless
    told ``reasoning_effort: "none"``."""
    applied = 0
    reasoning: bool | None = False
    if d.max_tokens is not None or d.temperature is not None:
        model = body["model"]
        reasoning = _REASONING_OF.get(model)
        if reasoning is None:
            reasoning = _remember_reasoning(model)
    if d.max_tokens is not None and not ceiling:
        if reasoning:  # what the config's ceiling means to them (reasoning tokens included)
            body["max_completion_tokens"] = d.max_tokens
            applied = APPLIED_MAX_COMPLETION_TOKENS
        else:
            body["max_tokens"] = d.max_tokens
            applied = APPLIED_MAX_TOKENS
    if d.temperature is not None and "temperature" not in body:
        if reasoning and body.get("reasoning_effort") != "none":
            applied |= WITHHELD_TEMPERATURE
        else:
            body["temperature"] = d.temperature
            applied |= APPLIED_TEMPERATURE
    if d.system is not None:
        messages = body["messages"]
        if not any(m.get("role") in _INSTRUCTION_ROLES for m in messages):
            body["messages"] = [{"role": "system", "content": d.system}, *messages]
            applied |= APPLIED_SYSTEM
    return applied


def _split_envelope(obj: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(endpoint, body) of a Batch API line; raises LineError."""
    extra = obj.keys() - _ENVELOPE
    if extra:
        raise LineError(f"field {sorted(extra)[0]!r}: not allowed beside 'url' and 'body'")
    for field_ in ("url", "body"):
        if field_ not in obj:
            raise LineError(f"field {field_!r}: missing (a Batch API line needs url and body)")
    _expect(obj, "url", (str,), "a string")
    _expect(obj, "body", (dict,), "an object")
    if obj.get("method", "POST") != "POST":
        raise LineError("field 'method': only POST is supported")
    endpoint = obj["url"]
    if endpoint not in ENDPOINTS:
        raise LineError(f"field 'url': {endpoint!r} is not one of {', '.join(ENDPOINTS)}")
    body: dict[str, Any] = obj["body"]
    if endpoint == CHAT:
        _check_messages(body.get("messages"), "body.messages")
    elif endpoint == COMPLETIONS and "prompt" not in body:
        raise LineError("field 'body.prompt': missing")
    elif endpoint in (EMBEDDINGS, RESPONSES) and "input" not in body:
        raise LineError("field 'body.input': missing")
    return endpoint, body


def _split_params(obj: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(endpoint, body) of an Anthropic Message Batches line; raises LineError."""
    if len(obj) > 1:
        extra = sorted(obj.keys() - {"params"})[0]
        raise LineError(f"field {extra!r}: not allowed beside 'params'")
    _expect(obj, "params", (dict,), "an object")
    body: dict[str, Any] = obj["params"]
    _check_messages(body.get("messages"), "params.messages")
    return MESSAGES, body


def _split(obj: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """(endpoint, body, whether the line is a complete request) of a line of any shape,
    custom_id already taken out; raises LineError.

    ``obj`` is the caller's own fresh object: it becomes the body rather than being copied.
    """
    if "body" in obj or "url" in obj:
        return (*_split_envelope(obj), True)
    if "params" in obj:
        return (*_split_params(obj), True)
    if "messages" in obj:
        _check_messages(obj["messages"], "messages")
        return CHAT, obj, False
    prompt = obj.pop("prompt", _MISSING)
    if prompt is _MISSING:
        raise LineError("no 'messages', 'prompt' or 'body': not a chat, prompt or Batch API line")
    if type(prompt) is not str:
        raise LineError(f"field 'prompt': expected a string, got {_kind(prompt)}")
    messages = [{"role": "user", "content": prompt}]
    system = obj.pop("system", _MISSING)
    if system is not _MISSING:
        if type(system) is not str:
            raise LineError(f"field 'system': expected a string, got {_kind(system)}")
        messages.insert(0, {"role": "system", "content": system})
    obj["messages"] = messages
    return CHAT, obj, False


def parse_line(raw: bytes, line_no: int, defaults: Defaults, seen: IdSet | None = None) -> Request:
    """Validate one stripped, non-blank line; raises LineError saying what is wrong.

    With ``seen``, a custom_id already in it is an error, and is added to it otherwise.
    The hot path of `aiq add`: the key and id hashing of canonical(), job_key() and
    custom_id_hash() is inlined, as each Python call costs about as much as a hash here.
    """
    try:
        obj = _loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LineError(_json_error(raw, exc)) from None
    if type(obj) is not dict:
        raise LineError(f"expected a JSON object, got {_kind(obj)}")
    custom_id = obj.pop("custom_id", None)
    if custom_id is not None and (type(custom_id) is not str or not custom_id):
        raise LineError(f"field 'custom_id': expected a non-empty string, got {_kind(custom_id)}")
    # aiq's, not the body's, in every shape: neither sent nor part of the key.
    priority = obj.pop("priority", _MISSING)
    if priority is _MISSING:
        priority = defaults.priority or 0
    elif type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise LineError(_bad_priority(priority))
    endpoint, body, complete = _split(obj)
    applied = _apply_defaults(endpoint, body, defaults, complete)
    data = bytes(memoryview(_dumps(body, option=orjson.OPT_SORT_KEYS)))  # see canonical()
    hasher = _KEY_HEADS[endpoint].copy()
    hasher.update(data)
    key = hasher.digest()
    derived = custom_id is None
    if derived:
        # Its line number: what a user can join results on, stable as the file grows. Identical
        # lines still share one request (the key), each with its own result line.
        custom_id = f"line-{line_no}"
    id_digest = _blake2b(custom_id.encode(), digest_size=8).digest()
    # Hashes, not strings: a false "appears twice" needs a 64-bit hash collision.
    if seen is not None and not seen.add(id_digest):
        raise LineError(_twice(custom_id, derived))
    id_hash = _ID_KEY.unpack(id_digest)[0]
    return _new_tuple(
        Request,
        (line_no, custom_id, endpoint, data, key, raw, derived, id_hash, applied, priority),
    )


def _bad_priority(value: Any) -> str:
    got = f"{value}" if type(value) is int else _kind(value)
    if type(value) is float:  # orjson reads a whole number past 64 bits as one too
        fits = value.is_integer() and PRIORITY_MIN <= value <= PRIORITY_MAX
        got = f"{value!r}" + (" (write it without the decimal point)" if fits else "")
    return f"field 'priority': expected {PRIORITY_RANGE}, got {got}"


def _twice(custom_id: str, derived: bool) -> str:
    if derived:
        return (
            f"no custom_id, and {custom_id!r}, the one it would get, is an earlier line's; "
            "give this line a custom_id"
        )
    named = " (lines without a custom_id are named line-N)" if custom_id.startswith("line-") else ""
    return f"custom_id {custom_id!r} appears twice{named}"


def _json_error(raw: bytes, exc: orjson.JSONDecodeError) -> str:
    """Why a line is not JSON, in terms of the line (orjson's "line 1" is always 1)."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as bad:
        byte, at = raw[bad.start], bad.start + 1
        return f"not valid JSON: not UTF-8 (byte 0x{byte:02x} at byte {at}); save it as UTF-8"
    at = len(text[: exc.pos].encode())  # orjson counts characters
    # It stops at the N or I, or just after the minus of -Infinity.
    if m := _NON_JSON_NUMBER.match(raw, max(at - 1, 0)) or _NON_JSON_NUMBER.match(raw, at):
        column = exc.colno - (at - m.start())
        return (
            f"not valid JSON: {m[0].decode()} (column {column}) is not a JSON number; "
            "write null or a number"
        )
    return f"not valid JSON: {exc.msg} at column {exc.colno}"
