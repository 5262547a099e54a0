"""The library behind each command: add, run/resume, status, replay-dead, export.

Each function takes a Config and returns data; the CLI only parses flags and renders. Progress
is reported through a callback, so nothing here knows about terminals. A run's steps, in
order: the store made ready (``_ready``), the worker built (``_worker``), worked under the
signals and the deadline (``_work``), and the outcome summed up and exported (``_summary``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from . import calibration, inspection, machine, routing
from .config import Config
from .contract import StopReason
from .costs import CostMeter
from .database import require_store
from .errors import FatalProviderError, UsageError
from .intake import enqueue_file, no_store_left_on_bad_input
from .joblog import OnAttempt
from .lock import StoreLock, run_state
from .metrics import MetricsWriter
from .outputs import export_all
from .overrides import parse_sets
from .pricing import price_for
from .records import EnqueueCounts, Replayed, Stats
from .replay import replay
from .requestfile import read_requests
from .retention import Pruned, prune, store_size, vacuum
from .run_records import Export, Progress, RunSummary
from .store import JobStore, open_store
from .timeouts import Timeouts

if TYPE_CHECKING:
    import httpx

    from .worker import Worker

# The worker, the limiters and the providers with their HTTP clients are imported by the
# functions that send (run_batch, through providers.factory), not here: `aiq status`, `add`
# and `export` use this module too, and start in half the time without them.

ProgressCallback = Callable[[Progress], None]


async def add_file(
    config: Config, path: Path, *, out: str | None = None, dead: str | None = None
) -> EnqueueCounts:
    """Enqueue one JSONL file (idempotent); returns new / known / changed / invalid counts."""
    read_requests(path, config.defaults).check()  # before any store is made
    with no_store_left_on_bad_input(config.db):
        return await _add_file(config, path, out, dead)


async def _add_file(config: Config, path: Path, out: str | None, dead: str | None) -> EnqueueCounts:
    async with open_store(config.db) as store:
        stored = await store.target()  # its defaults, as `run` would apply them
        config = config if stored is None else config.aimed_at(stored)
        return (await enqueue_file(store, config, path, out, dead))[1]


async def run_batch(
    config: Config,
    *,
    input_path: Path | None = None,
    out: str | None = None,
    dead: str | None = None,
    on_progress: ProgressCallback | None = None,
    on_added: Callable[[EnqueueCounts], None] | None = None,
    progress_interval_s: float = 0.5,
    handle_signals: bool = False,
    lock_wait_s: float = 0.0,
    detach: bool = False,
    on_note: Callable[[str], None] | None = None,
    on_attempt: OnAttempt | None = None,
) -> RunSummary:
    """``aiq run FILE`` (with ``input_path``) or ``aiq resume`` (without).

    Holds the store's lock throughout, recovers jobs a dead run left ``running``, works until
    nothing is due, then exports every input file's results and dead letters. ``on_added``
    hears what the file added (and its invalid lines) before anything is sent; ``on_attempt``
    what each attempt came to, named by custom_id and request id (aiq.joblog), for a log.
    With ``config.via`` batch, the provider's batch engine sends them (aiq.batch_engine):
    ``on_note`` hears each batch's steps, and ``detach`` returns once they are submitted.
    """
    from .batch_run import check_via

    check_via(config)
    started = time.monotonic()
    if input_path is None:
        require_store(config.db)  # resume
    else:
        read_requests(input_path, config.defaults).check()  # before any store is made
    metrics = MetricsWriter(config.metrics_file) if config.metrics_file else None
    with no_store_left_on_bad_input(config.db):
        async with StoreLock(config.db, wait_s=lock_wait_s) as lock, open_store(config.db) as store:
            config, added = await _ready(store, config, lock, input_path, out, dead, on_added)
            check_via(config)  # as the store recorded it, for a resume
            if detach and config.via != "batch":
                raise UsageError("--detach works with --via batch only (an online run waits)")
            if config.via != "batch" and on_note and (held := await store.in_batches()):
                on_note(
                    f"{held:,} jobs are in open provider batches, left to them: "
                    "`aiq resume --via batch` collects them"
                )
            if config.via == "batch":
                summary = await _batch_run(
                    store, config, input_path, out, dead, added, detach=detach,
                    note=on_note or (lambda _: None), handle_signals=handle_signals,
                )  # fmt: skip
                summary.duration_s = time.monotonic() - started
                if summary.fatal is not None:
                    raise FatalProviderError(str(summary.fatal), summary=summary)
                return summary
            worker, transport = await _worker(store, config, on_attempt)
            tick = _ticker(on_progress, metrics)
            try:
                stopped = await _work(worker, config, tick, progress_interval_s, handle_signals)
            finally:
                await transport.aclose()
            await calibration.learn(store)  # for the next --dry-run's prompt figures
            # A run that changed nothing leaves files that already say what the store holds.
            exports = await export_all(
                store, input_path, order=config.order, out=out, dead=dead, skip_unchanged=True
            )
            summary = await _summary(store, config, worker, added, exports, stopped)
            if metrics is not None:
                metrics.finish(worker.progress, summary.stats, summary.exit_code)
    summary.duration_s = time.monotonic() - started
    _raise_if_fatal(worker, summary)
    return summary


async def cancel_batches(
    config: Config,
    *,
    out: str | None = None,
    dead: str | None = None,
    handle_signals: bool = False,
    lock_wait_s: float = 0.0,
    on_note: Callable[[str], None] | None = None,
) -> RunSummary:
    """``aiq cancel``: cancel the store's open provider batches, wait for them to end, and
    collect them as a resume would (finished lines kept, the rest queued again at no
    attempt; aiq.batch_cancel); nothing new is submitted. Then export, as a run does."""
    from .batch_run import check_via

    started = time.monotonic()
    require_store(config.db)
    async with StoreLock(config.db, wait_s=lock_wait_s) as lock, open_store(config.db) as store:
        config, _ = await _ready(store, config, lock, None, out, dead, None)
        # Whatever way the store sends now: its open batches are the batch engine's.
        config = dataclasses.replace(config, via="batch", max_cost_usd=None)
        check_via(config)
        note = on_note or (lambda _: None)
        if not await store.batches(open_only=True):
            note("no open batches: nothing to cancel")
        summary = await _batch_run(
            store, config, None, out, dead, None, detach=False, note=note,
            handle_signals=handle_signals, cancel=True,
        )  # fmt: skip
    summary.duration_s = time.monotonic() - started
    if summary.fatal is not None:
        raise FatalProviderError(str(summary.fatal), summary=summary)
    return summary


async def _batch_run(
    store: JobStore, config: Config, input_path: Path | None, out: str | None,
    dead: str | None, added: EnqueueCounts | None, *, detach: bool,
    note: Callable[[str], None], handle_signals: bool, cancel: bool = False,
) -> RunSummary:  # fmt: skip
    """The run's jobs through the provider's batch engine (or, with ``cancel``, the open
    batches cancelled and collected), then exported as online."""
    from .batch_run import work_batches

    stats = await store.stats()
    progress = Progress(total=stats.total, done=stats.counts["done"], dead=stats.counts["dead"])
    batch, stopped, fatal = await work_batches(
        store, config, progress, detach=detach, note=note, handle_signals=handle_signals,
        cancel=cancel,
    )  # fmt: skip
    exports = await export_all(
        store, input_path, order=config.order, out=out, dead=dead, skip_unchanged=True
    )
    stats = await store.stats()
    if stopped in ("interrupted", "limit") and not stats.remaining:
        stopped = None  # every job had finished by the time it stopped: a finished run
    return RunSummary(
        added=added, progress=progress, stats=stats, exports=exports,
        stopped=stopped, on_truncated=config.on_truncated, batch=batch, fatal=fatal,
    )  # fmt: skip


async def _ready(
    store: JobStore, config: Config, lock: StoreLock, input_path: Path | None,
    out: str | None, dead: str | None, on_added: Callable[[EnqueueCounts], None] | None,
) -> tuple[Config, EnqueueCounts | None]:  # fmt: skip
    """The store ready to work: aimed where its jobs go, the file in (if one), jobs a dead
    run left ``running`` recovered, deferred ones due again. The config aimed, and the
    file's counts."""
    config = await routing.aim(store, config)
    added = None
    if input_path is not None:
        _source, added = await enqueue_file(store, config, input_path, out, dead)
        if on_added is not None:
            on_added(added)
    await routing.record(store, config)
    await store.recover_running(config.max_attempts)
    await store.undefer()
    lock.note(sending_since=time.time())  # status's rate starts here, not at the read
    return config, added


async def _worker(
    store: JobStore, config: Config, on_attempt: OnAttempt | None = None
) -> tuple[Worker, httpx.AsyncBaseTransport]:
    """The run's Worker over ``store``, and the transport under its provider (to close)."""
    from .breaker import Breakers
    from .limiters import Limiters
    from .providers.factory import make_provider  # (it loads the HTTP clients)
    from .worker import RetryPolicy, Worker

    bound = machine.run_bound(config.max_concurrency)
    provider, transport = make_provider(config, pool_size=config.fixed_concurrency or bound.senders)
    stats = await store.stats()
    worker = Worker(
        store,
        provider,
        concurrency=config.fixed_concurrency,
        max_concurrency=bound.senders,
        held_by=bound.reason,
        limiter=Limiters(rpm=config.rpm, tpm=config.tpm, per_model=config.model_limits),
        # Probing a down provider every 10 s at most: one request, and a run resumes
        # within 10 s of the provider coming back.
        breakers=Breakers(probe_cap_s=10.0),
        retry=RetryPolicy(
            config.max_attempts,
            config.backoff_base_s,
            config.backoff_cap_s,
            config.max_outage_s,
        ),
        progress=Progress(total=stats.total, done=stats.counts["done"], dead=stats.counts["dead"]),
        costs=await _cost_meter(store, config, stats),
        timeouts=Timeouts(ceiling_s=config.call_timeout_s),
        on_truncated=config.on_truncated,
        on_attempt=on_attempt,
    )
    return worker, transport


async def _cost_meter(store: JobStore, config: Config, stats: Stats) -> CostMeter:
    """The run's CostMeter; with --max-cost, every model it will send to must have a price."""
    prices = config.price_table
    if config.max_cost_usd is not None:
        unpriced = sorted(
            str(m) for m in await store.waiting_models() if price_for(m, prices) is None
        )
        if unpriced:
            raise UsageError(
                f"--max-cost needs the price of every model queued; none for {', '.join(unpriced)}:"
                " add them to the config as prices: {MODEL: {input: USD, output: USD}} "
                "(per 1M tokens)"
            )
    return CostMeter(prices, cap_usd=config.max_cost_usd, spent_usd=stats.cost_usd or 0.0)


async def _summary(
    store: JobStore, config: Config, worker: Worker, added: EnqueueCounts | None,
    exports: list[Export], stopped: StopReason | None,
) -> RunSummary:  # fmt: skip
    """What the run did, and why it stopped as the exit code should say it."""
    summary = RunSummary(
        added=added, progress=worker.progress, stats=await store.stats(), exports=exports,
        stopped=stopped, on_truncated=config.on_truncated,
    )  # fmt: skip
    if stopped in ("interrupted", "limit") and not summary.stats.remaining:
        summary.stopped = None  # the drain finished every job: a finished run
    if worker.fatal is not None:
        summary.stopped = "fatal"
    elif worker.costs.reached:
        summary.stopped = "budget"
    return summary


def _raise_if_fatal(worker: Worker, summary: RunSummary) -> None:
    if worker.fatal is not None:
        # A status: the server said no. None: aiq gave up on it (an outage, no answer at all).
        why = "the provider refused the run" if worker.fatal.status_code else "the run stopped"
        raise FatalProviderError(
            f"{why}: {worker.fatal.message}; every job is kept, fix it and run `aiq resume`",
            summary=summary,
        )


def _ticker(
    on_progress: ProgressCallback | None, metrics: MetricsWriter | None
) -> ProgressCallback | None:
    if metrics is None:
        return on_progress

    def tick(p: Progress) -> None:
        if on_progress is not None:
            on_progress(p)
        metrics.tick(p)

    return tick


async def _work(
    worker: Worker,
    config: Config,
    on_progress: ProgressCallback | None,
    interval_s: float,
    handle_signals: bool,
) -> StopReason | None:
    """Run the worker with a progress ticker, signals and --max-runtime; returns why it stopped.

    A stop (signal, deadline, fatal error) drains: in-flight requests get ``grace_s`` to finish
    and be recorded, then are abandoned (their jobs are released and retried on resume).
    """
    task = asyncio.ensure_future(worker.run())
    stops = _Stops(worker, task)
    with _stopped_by(stops, config.max_runtime_s, handle_signals):
        await _tick_until_done(worker, task, on_progress, interval_s, config.grace_s)
    return "fatal" if worker.fatal is not None else stops.reason


class _Stops:
    """Why a run stopped, as a signal or the deadline says it: either stops the worker, and a
    second signal abandons what is in flight at once."""

    def __init__(self, worker: Worker, task: asyncio.Task[Progress]) -> None:
        self.reason: StopReason | None = None
        self._worker = worker
        self._task = task
        self._signals = 0

    def on_signal(self) -> None:
        self._signals += 1
        self.reason = "interrupted"
        self._worker.stop()
        if self._signals > 1:
            self._task.cancel()

    def on_deadline(self) -> None:
        self.reason = self.reason or "limit"
        self._worker.stop()


@contextlib.contextmanager
def _stopped_by(stops: _Stops, max_runtime_s: float | None, handle_signals: bool) -> Iterator[None]:
    """SIGINT and SIGTERM (with ``handle_signals``) and the deadline routed to ``stops``
    meanwhile; the process's own handlers put back after."""
    loop = asyncio.get_running_loop()
    deadline = loop.call_later(max_runtime_s, stops.on_deadline) if max_runtime_s else None
    # asyncio puts back the defaults, not what was there: keep the CLI's, for the export.
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if handle_signals:
        for sig in previous:
            loop.add_signal_handler(sig, stops.on_signal)
    try:
        yield
    finally:
        if deadline is not None:
            deadline.cancel()
        if handle_signals:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                if handler is not None:  # None: not set from Python, nothing to put back
                    signal.signal(sig, handler)


async def _tick_until_done(
    worker: Worker, task: asyncio.Task[Progress], on_progress: ProgressCallback | None,
    interval_s: float, grace_s: float,
) -> None:  # fmt: skip
    """Tick the progress every ``interval_s`` until the worker ends; once it is stopping,
    abandon what is still in flight after ``grace_s``."""
    loop = asyncio.get_running_loop()
    abandon_at: float | None = None
    while not task.done():
        await asyncio.wait([task], timeout=interval_s)
        worker.note_waits()
        if on_progress is not None:
            try:
                on_progress(worker.progress)
            except Exception:  # a metrics or log file that cannot be written: stop
                worker.stop()  # drain first, so what is in flight is recorded
                await asyncio.wait([task], timeout=grace_s)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise
        if worker.stopping and abandon_at is None:
            abandon_at = loop.time() + grace_s
        if abandon_at is not None and loop.time() >= abandon_at:
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def export_outputs(
    config: Config, *, out: str | None = None, dead: str | None = None
) -> list[Export]:
    """``aiq export``: rewrite every input file's results and dead letters from the store."""
    async with open_store(config.db, readonly=True) as store:
        return await export_all(store, None, order=config.order, out=out, dead=dead)


async def store_status(config: Config) -> Stats:
    """``aiq status``: read-only, so it works while a run holds the store. Whether a run is
    active comes from the lock (never taken here); its rate, from the time it has sent for."""
    run = run_state(config.db)
    since = (run.sending_since or run.started_at) if run.active else None
    async with open_store(config.db, readonly=True) as store:
        stats = await store.stats(since=since)
    return dataclasses.replace(stats, run=run, size_bytes=store_size(config.db))


async def dead_errors(
    config: Config, *, error_type: str | None = None, limit: int = 5
) -> list[inspection.DeadType]:
    """``aiq errors``: read-only, so it works while a run holds the store."""
    require_store(config.db)
    async with open_store(config.db, readonly=True) as store:
        return await inspection.dead_errors(store, error_type=error_type, limit=limit)


async def show_job(config: Config, custom_id: str) -> list[inspection.Shown]:
    """``aiq show``: read-only, so it works while a run holds the store."""
    require_store(config.db)
    async with open_store(config.db, readonly=True) as store:
        return await inspection.show(store, custom_id)


async def replay_dead(
    config: Config,
    *,
    error_type: str | None = None,
    custom_ids: tuple[str, ...] = (),
    sets: tuple[str, ...] = (),
    dry_run: bool = False,
) -> Replayed:
    """``aiq replay-dead``: dead jobs (all, of one error type, of these custom_ids) back to
    queued, attempts reset, with ``sets`` (``FIELD=VALUE``) as new requests with those body
    fields changed; UsageError, and nothing replayed, for a filter that names what the store
    does not have or a change that makes a body invalid (see replay.replay). ``dry_run``:
    what it would do, the store unchanged."""
    changes = parse_sets(sets)
    require_store(config.db)
    async with open_store(config.db, readonly=dry_run) as store:
        return await replay(
            store, error_type=error_type, custom_ids=custom_ids, sets=changes, dry_run=dry_run
        )


async def prune_store(
    config: Config,
    *,
    done_older_than_s: float,
    dead_older_than_s: float | None = None,
    keep_results: bool = False,
    forget: bool = False,
    lock_wait_s: float = 0.0,
) -> Pruned:
    """``aiq prune``: exported jobs' requests and replies out of the store, then a VACUUM
    (aiq.retention). Holds the store's lock: a run must not finish or export jobs meanwhile."""
    require_store(config.db)
    async with StoreLock(config.db, wait_s=lock_wait_s), open_store(config.db) as store:
        before = store_size(config.db)
        pruned = await prune(
            store, done_older_than_s=done_older_than_s, dead_older_than_s=dead_older_than_s,
            keep_results=keep_results, forget=forget,
        )  # fmt: skip
        if pruned.done or pruned.dead:
            await vacuum(store, pruned)
    pruned.size_before, pruned.size_after = before, store_size(config.db)
    return pruned
