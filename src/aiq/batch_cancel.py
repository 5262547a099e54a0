"""``aiq cancel``: the store's open batches cancelled at the provider, then collected as a
resume collects them, and nothing new submitted.

Each open batch is asked to stop (OpenAI: ``cancelling``, then ``cancelled``; Anthropic:
``canceling``, then ``ended``), then polled until it has ended and ingested by the same rules
as any batch: its finished lines are results (or dead letters), never discarded, and the
rest go back to the queue without costing an attempt (``cancelled``). A batch planned but
not known to be created is first looked for at the provider, as a resume would before
creating it: found, it is cancelled like the others; not found, its jobs go back to the
queue at once. A later ``aiq resume`` sends what is queued (``--via online`` to send it
online).
"""

from __future__ import annotations

from typing import Any

from .batch_engine import BatchEngine
from .batch_records import Batch
from .providers.base import ProviderError
from .run_records import BatchRun


class BatchCanceller(BatchEngine):
    """A batch engine that cancels what is open and submits nothing."""

    submits = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked: set[int] = set()  # batches whose cancel call has been answered

    async def run(self, *, detach: bool = False) -> BatchRun:
        """Cancel and collect every open batch (``detach`` is not for this: it waits)."""
        return await super().run(detach=False)

    async def _plan(self) -> Batch | None:
        return None

    async def _advance(self, batch: Batch) -> None:
        if self._not_before.get(batch.id, 0.0) > self._wall():
            return
        try:
            if batch.step != "created" and (batch := await self._adopt(batch)).step != "created":
                return
            if batch.id not in self._asked:
                await self._cancel(batch)
            if not self.stopping:
                await self._look(await self._reread(batch))
        except ProviderError as err:
            self._failed_call(batch, err)

    async def _adopt(self, batch: Batch) -> Batch:
        """A batch not known to be created: found at the provider (its create's answer was
        lost), recorded as created; else its jobs back to the queue, never sent."""
        ready = "uploaded" if self._api.uploads else "planned"
        found = None
        if batch.step == ready:
            ours = await self._store.batches()
            known = frozenset(b.provider_batch_id for b in ours if b.provider_batch_id)
            found = await self._api.find_batch(self._key(batch), known=known)
        if found is not None:
            await self._store.save_step(
                batch.id, "created", provider_batch_id=found.id, state=found.state,
                counts=found.counts,
            )  # fmt: skip
            self._note(f"batch {batch.id}: found {found.id} at the provider")
            return await self._reread(batch)
        jobs = await self._store.batch_jobs(batch.id)
        not_run = {"cancelled": list(jobs)}
        await self._store.close_batch(batch.id, "not_sent", not_run)
        self._collected(batch, not_run, 0)
        return await self._reread(batch)

    async def _cancel(self, batch: Batch) -> None:
        """Ask the provider to cancel ``batch``. One it refuses for good (it has ended
        already, say) is looked at all the same."""
        try:
            polled = await self._api.cancel(str(batch.provider_batch_id))
        except ProviderError as err:
            if err.fatal or err.retryable or err.error_type == "rate_limit":
                raise
            self._note(f"batch {batch.id} {batch.provider_batch_id}: not cancelled: {err.message}")
        else:
            self._note(f"batch {batch.id} {batch.provider_batch_id}: {polled.state}")
        self._asked.add(batch.id)
