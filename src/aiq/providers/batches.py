"""The interface the batch engine (aiq.batch_engine) drives a provider's batch API through,
so the engine holds no provider's names: OpenAI's Files and Batches
(:mod:`.openai_batches`) and Anthropic's Message Batches (:mod:`.anthropic_batches`) each
implement it, and :data:`aiq.providers.factory.BATCH_CLASSES` picks one by the provider's
wire format.

A batch's requests are written to a file from the store first (``encode`` each job, the
whole in ``frame``); then either the file is uploaded and the batch created from its id
(``uploads``: OpenAI), or the create call carries the file as its body (Anthropic). A
creation whose answer was lost is found again with :meth:`BatchService.find_batch`
before anything is sent again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from ..batch_records import Batch
from ..batch_wire import BatchKey, Frame, Limits, Line, Polled
from .base import Reply

# One request as the batch's file holds it, from its job id, endpoint and body (JSON
# bytes); raises a ProviderError for a job the provider cannot run.
Encode = Callable[[int, str, bytes], bytes]


class BatchService(Protocol):
    """One account's batch API."""

    limits: Limits
    uploads: bool  # the requests go as an uploaded file, named by id at creation
    frame: Frame

    def encode(self, key: BatchKey) -> Encode: ...

    async def find_file(self, filename: str, *, since: float) -> dict[str, Any] | None: ...

    async def upload(self, path: Path, filename: str) -> dict[str, Any]: ...

    async def create(self, key: BatchKey, *, input_file_id: str | None, path: Path) -> Polled:
        """Create the batch: from the uploaded file, or with ``path`` as the requests."""
        ...

    async def find_batch(self, key: BatchKey, *, known: frozenset[str]) -> Polled | None:
        """The batch ``key`` names, created after it was planned, if there is one; not one
        of ``known`` (this store's other batches)."""
        ...

    async def get(self, batch_id: str) -> Polled: ...

    async def cancel(self, batch_id: str) -> Polled: ...

    def lines(self, batch: Batch, key: BatchKey) -> AsyncIterator[Line | None]:
        """An ended batch's result lines, each naming its job (``job_id`` None: not this
        batch's); None between two files (what was read is written before the next)."""
        ...

    async def aclose(self) -> None: ...


class Answers(Protocol):
    """Reads a reply that came some other way exactly as an online call's (the online
    provider classes' ``answer``): the Reply, or the classified ProviderError."""

    def answer(
        self, endpoint: str, status_code: int, content: bytes, request_id: str | None = None
    ) -> Reply: ...
