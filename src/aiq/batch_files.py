"""A batch's files: the input file written from the store, and the output and error files'
lines read back (OpenAI's batch input and output line format, as the Batch API guide and
openai-python's batch types give it).

An input line is ``{"custom_id", "method", "url", "body"}``; its custom_id is aiq's job id
(``aiq-<id>``), not the user's: jobs are deduplicated, one request may stand for several
custom_ids, and a batch needs its own unique within the file. An output line is ``{"id",
"custom_id", "response": {"status_code", "request_id", "body"}, "error"}``; an error file's
lines are the same, with a response that failed or an ``error`` (``batch_expired``...).
Both are streamed, a block of lines at a time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .store import JobStore

# The most a provider takes in one input file (OpenAI: 50,000 requests and 200 MB).
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1000 * 1000
# A line's bytes besides its body: the custom_id, method and url around it (an endpoint of
# up to ~40 characters and a job id of up to 19 digits), rounded up.
LINE_OVERHEAD = 120
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


async def write_input(store: JobStore, batch_id: int, path: Path) -> int:
    """Write the batch's input file from the store, a block of jobs at a time, in the order
    its lines are numbered (job id); returns its size in bytes. Written aside and renamed,
    so a file at ``path`` is always whole."""
    part = path.with_name(path.name + ".part")
    size = 0
    with part.open("wb") as f:
        async for rows in store.batch_lines(batch_id):
            block = b"".join(
                b'{"custom_id":"%b","method":"POST","url":%b,"body":%b}\n'
                % (custom_id(i).encode(), orjson.dumps(endpoint), body)
                for i, endpoint, body in rows
            )
            f.write(block)
            size += len(block)
    os.replace(part, path)
    return size


@dataclass(frozen=True, slots=True)
class Line:
    """One output or error file line, as aiq reads it."""

    job_id: int | None
    status_code: int | None  # the response's; None: no response (an ``error`` instead)
    request_id: str | None
    body: bytes  # the response body, as JSON bytes (b"" with no response)
    error_code: str | None  # the line's ``error.code`` (batch_expired, ...)
    error_message: str | None


def read_line(raw: bytes) -> Line | None:
    """A line of an output or error file; None for one that is not a JSON object."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
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
