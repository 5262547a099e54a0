"""What aiq and a provider's batch API pass each other: the key that names one of aiq's
batches there, a batch as polled, one result line, the most one batch takes and what goes
around its input file's requests. Plain records, for the providers' batch clients and the
engine; apart from ``batch_records`` (what the store keeps), which `aiq status` reads without
these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Line:
    """One result line of a batch, as aiq reads it, whichever provider wrote it."""

    job_id: int | None
    status_code: int | None  # the response's; None: no response (an ``error`` instead)
    request_id: str | None
    body: bytes  # the response body, as JSON bytes (b"" with no response)
    error_code: str | None  # why it never ran (batch_expired, batch_cancelled, ...)
    error_message: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchKey:
    """What names one of aiq's batches at the provider: the store's tag and the batch's
    id (metadata, file names, custom_ids), with what a lost creation is found again by."""

    tag: str
    batch_id: int
    endpoint: str
    requests: int
    planned_at: float  # epoch seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class Polled:
    """A provider batch as last looked at, in aiq's terms: its id and state (the
    provider's own word), counts with ``total``, ``completed`` and ``failed`` (and any the
    provider adds), whether it has ended, and the raw object."""

    id: str
    state: str
    counts: dict[str, int]
    ended: bool
    raw: dict[str, Any]
    output_file_id: str | None = None
    error_file_id: str | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """The most one batch takes: requests, bytes, and a line's bytes besides its body."""

    max_requests: int
    max_bytes: int
    overhead: int


@dataclass(frozen=True, slots=True)
class Frame:
    """What goes around an input file's requests: before, between and after them."""

    head: bytes = b""
    sep: bytes = b"\n"
    tail: bytes = b"\n"


JSONL = Frame()  # one request a line (OpenAI's input file)
