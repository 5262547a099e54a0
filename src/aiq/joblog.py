"""A run's attempts, one event each, for a log that follows a job by its custom_id and the
provider's request id through every retry (``aiq run --log-format json``).

The core builds an ``AttemptEvent`` only when a log asked for them (``Worker(on_attempt=)``):
with no log there is no lookup, no record and no string per job. The custom_ids come from the
store in one pass when the run starts (a job knows its key, not the lines naming it, and
there is no index from a job to its items: it would cost ``add`` a third of its speed), and
again when a claimed job is not among them (a file added while the run works).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .records import DEAD, DONE, Job, Outcome
from .run_records import AttemptEvent
from .store import JobStore

__all__ = ["AttemptEvent", "JobNames", "attempt_event"]

OnAttempt = Callable[[AttemptEvent], None]


class JobNames:
    """The custom_id of each job a run works (the first line naming it, when several do)."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._ids: dict[int, str | None] = {}

    def get(self, job_id: int) -> str | None:
        return self._ids.get(job_id)

    async def cover(self, jobs: Sequence[Job]) -> None:
        """Know the custom_ids of ``jobs``: one pass over the store's lines if any is new."""
        ids = self._ids
        if all(j.id in ids for j in jobs):
            return
        for job_id, custom_id in (await self._store.unfinished_custom_ids()).items():
            ids.setdefault(job_id, custom_id)
        for j in jobs:  # a job no line names (re-pointed since): not looked up again
            ids.setdefault(j.id, None)


def attempt_event(job: Job | None, o: Outcome, custom_id: str | None, now: float) -> AttemptEvent:
    """What one attempt of ``job`` came to, as a log line says it."""
    if o.state == DONE:
        what = "done"
    elif o.state == DEAD:
        what = "dead"
    else:  # queued again: a retry at next_at, or (no time) put back as the run stopped
        what = "retry" if o.next_at else "requeued"
    return AttemptEvent(
        at=now,
        event=what,
        custom_id=custom_id,
        job_id=o.job_id,
        # (the job is always known, as it was claimed; without it, the attempts recorded)
        attempt=job.attempts + 1 if job is not None else o.attempts,
        status=o.status_code,
        request_id=o.request_id,
        error_type=o.error_type,
        message=o.error_message,
        wait_s=round(max(0.0, o.next_at - now), 3) if what == "retry" else None,
        latency_s=None if o.latency_s is None else round(o.latency_s, 3),
        model=o.model if o.model is not None else (job.model if job is not None else None),
    )
