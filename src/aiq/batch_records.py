"""What the store keeps of a provider batch (aiq.batchqueue): a plain record, for the engine
and status alike. What a batch run did is ``run_records.BatchRun``; what aiq and a provider's
batch API pass each other, ``batch_wire``."""

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
