"""A run ``--via auto``: batch first, online once the deadline needs it (aiq.deadline).

Without a deadline (or once it has passed) it is a batch run, said once. With one, the batch
engine asks a :class:`DeadlineWatch` at each wake whether what remains could still be done
online in time; when it no longer could, the engine stops and the switch is made:

1. it is recorded in the store (meta ``auto:online``, the deadline it was made for) before
   anything else, so a run killed at any point after, and every ``aiq resume`` (cron) before
   that deadline, goes on online and submits nothing to batch again. A new ``--deadline``
   starts from batch again; a passed one means batch;
2. the open batches are cancelled and collected by ``aiq cancel``'s engine
   (aiq.batch_cancel): their finished lines are results, the rest back in the queue at no
   attempt;
3. the queue is worked online, by the online runner over the same store.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from .config import Config
from .deadline import Outlook, allowance_s, deadline_text, online_rate
from .errors import FatalProviderError
from .run_records import BatchRun, Progress, RunSummary
from .store import JobStore

SWITCHED_META = "auto:online"  # the deadline (repr) a switch to online was made for

Note = Callable[[str], None]
Result = tuple[RunSummary, FatalProviderError | None]
# The runner's two ways, over the run's store: by batch (with the watch; cancelling the open
# batches instead, with cancel) and online.
ByBatch = Callable[..., Awaitable[Result]]
Online = Callable[[Config], Awaitable[Result]]


class DeadlineWatch:
    """The engine's watch (aiq.batch_engine.Watch): at each wake, where the run stands
    against the deadline; says the plan once, and the switch when it comes, one line each."""

    def __init__(
        self, store: JobStore, config: Config, deadline: float, note: Note,
        *, wall: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self._store = store
        self._deadline = deadline
        self._note = note
        self._wall = wall
        self._allowance_s = allowance_s(deadline - wall())
        self._rpm, self._known = online_rate(
            config.rpm, config.tpm, dict(config.model_limits), config.model
        )
        self._said = False

    async def __call__(self) -> float:
        batches = await self._store.batches(open_only=True)
        counts = (await self._store.stats()).counts
        in_batches = sum(
            max(0, b.requests - b.counts.get("completed", 0) - b.counts.get("failed", 0))
            for b in batches
        )
        outlook = Outlook(
            deadline=self._deadline, now=self._wall(), remaining=counts["queued"] + in_batches,
            rpm=self._rpm, rate_known=self._known, allowance_s=self._allowance_s,
        )  # fmt: skip
        if outlook.switch:
            self._note(outlook.line(open_batches=len(batches)))
            return 0.0
        if not self._said and outlook.remaining:
            self._said = True
            self._note(outlook.line(open_batches=len(batches)))
        return max(0.05, outlook.look_again_s)  # not a busy loop right at the edge


async def run_auto(
    store: JobStore, config: Config, *, by_batch: ByBatch, online: Online, note: Note,
    wall: Callable[[], float] = time.time,
) -> Result:  # fmt: skip
    """The run ``--via auto`` over ``store``: the summary, and the error to raise."""
    as_batch = config.with_(via="batch")
    deadline = config.deadline
    now = wall()
    if deadline is None or deadline <= now:
        why = (
            "no --deadline" if deadline is None
            else f"the deadline {deadline_text(deadline, now=now)} has passed"
        )  # fmt: skip
        note(f"via auto: {why}, so by batch")
        return await by_batch(as_batch)
    record = None
    earlier: list[Progress] = []  # what the batches did before online: in the one summary
    if await store.meta(SWITCHED_META) != repr(deadline):
        summary, fatal = await by_batch(
            as_batch, watch=DeadlineWatch(store, config, deadline, note, wall=wall)
        )
        if fatal is not None or summary.batch is None or not summary.batch.switched_online:
            return summary, fatal
        record = summary.batch
        earlier.append(summary.progress)
        await store.save_meta({SWITCHED_META: repr(deadline)})
    else:
        note(
            f"via auto: deadline {deadline_text(deadline, now=now)}: online, as this store "
            "switched for it"
        )
    if await store.batches(open_only=True):
        summary, fatal = await by_batch(as_batch, cancel=True)
        record = _merged(record, summary.batch)
        if fatal is not None or summary.stopped is not None:
            summary.batch = record
            return _whole(summary, earlier), fatal
        earlier.append(summary.progress)
    summary, fatal = await online(config.with_(via="online"))
    summary.batch = record
    return _whole(summary, earlier), fatal


def _whole(summary: RunSummary, earlier: list[Progress]) -> RunSummary:
    """``summary`` counting what the run's earlier parts did too (done by batch, cost per
    tier), so a run that switched says what it did in all."""
    for p in earlier:
        summary.progress.absorb(p)
    return summary


def _merged(first: BatchRun | None, then: BatchRun | None) -> BatchRun | None:
    """What the batch run and the cancel after it did, as one record."""
    if first is None or then is None:
        return first or then
    requeued = dict(first.requeued)
    for reason, n in then.requeued.items():
        requeued[reason] = requeued.get(reason, 0) + n
    return BatchRun(
        submitted=first.submitted, submitted_lines=first.submitted_lines,
        collected=[*first.collected, *then.collected], open=then.open, requeued=requeued,
        detached=first.detached, switched_online=True,
    )  # fmt: skip
