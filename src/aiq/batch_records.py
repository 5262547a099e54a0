"""What the store keeps of a provider batch (aiq.batchqueue) and what a batch run did: plain
records, for the engine, status and the summary alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# aiq's own steps of a batch, each written before the next call (migration 0010_batches).
Step = Literal["planned", "uploaded", "created", "ingested"]
# The provider's states that end a batch (OpenAI's Batch.status; Anthropic's
# processing_status ``ended``).
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled", "ended"})
# Why a line came back to the queue without costing an attempt.
Requeue = Literal["expired", "cancelled", "missing", "failed", "token_limit", "retry", "not_ours"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """One batch as the store records it."""

    id: int
    provider: str
    endpoint: str
    model: str | None
    step: Step
    state: str | None  # the provider's, as last polled (None: not created yet)
    requests: int
    created_at: float
    updated_at: float
    input_file_id: str | None = None
    provider_batch_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: dict[str, int] = field(default_factory=dict)  # request_counts, as last polled
    requeued: dict[str, int] = field(default_factory=dict)  # reason -> lines, once ingested

    @property
    def open(self) -> bool:
        return self.step != "ingested"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "provider": self.provider,
            "provider_batch_id": self.provider_batch_id,
            "endpoint": self.endpoint,
            "model": self.model,
            "step": self.step,
            "state": self.state,
            "requests": self.requests,
            "counts": self.counts,
            "requeued": self.requeued,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(slots=True, kw_only=True)
class BatchRun:
    """What one batch run did: batches submitted and collected, lines by fate."""

    submitted: list[int] = field(default_factory=list)  # batch ids created by this run
    submitted_lines: int = 0
    collected: list[int] = field(default_factory=list)  # batch ids ingested by this run
    open: int = 0  # batches still with the provider when the run ended
    requeued: dict[str, int] = field(default_factory=dict)
    detached: bool = False
    switched_online: bool = False  # --via auto: the deadline called for online (aiq.auto_run)

    def as_dict(self) -> dict[str, Any]:
        return {
            "submitted": self.submitted,
            "submitted_lines": self.submitted_lines,
            "collected": self.collected,
            "open": self.open,
            "requeued": self.requeued,
            "detached": self.detached,
            "switched_online": self.switched_online,
        }


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
