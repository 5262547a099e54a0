"""The library behind the commands that send: add, and run/resume.

Each function takes a Config and returns data; the CLI only parses flags and renders. Progress
is reported through a callback, so nothing here knows about terminals. A run's steps, in
order: the store made ready (``_ready``), then worked by the engine the config names, online
(aiq.online_run: the worker under the signals and the deadline, the outcome summed up and
exported) or the provider's batches (aiq.batch_run). The commands that send nothing (status,
export, replay-dead, errors, show, prune) are in aiq.store_commands.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import routing
from .config import Config
from .database import require_store
from .errors import FatalProviderError, UsageError
from .intake import enqueue_file, no_store_left_on_bad_input
from .joblog import OnAttempt
from .lock import StoreLock
from .metrics import MetricsWriter
from .outputs import export_all
from .records import EnqueueCounts
from .requestfile import read_requests
from .run_records import Progress, RunSummary
from .store import JobStore, open_store

if TYPE_CHECKING:
    from .auto_run import ByBatch, Online, Result
    from .batch_engine import Watch
    from .online_run import ProgressCallback

# The worker, the limiters and the providers with their HTTP clients are imported by the
# functions that send (through aiq.online_run and providers.factory), not here: `aiq add`
# uses this module too, and starts in half the time without them.


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
    ``on_note`` hears each batch's steps, and ``detach`` returns once they are submitted;
    with auto, batch first and online once ``config.deadline`` needs it (aiq.auto_run).
    """
    from .batch_run import check_via

    check_via(config)
    started = time.monotonic()
    _check_input(config, input_path)
    metrics = MetricsWriter(config.metrics_file) if config.metrics_file else None
    with no_store_left_on_bad_input(config.db):
        async with StoreLock(config.db, wait_s=lock_wait_s) as lock, open_store(config.db) as store:
            config, added = await _ready(store, config, lock, input_path, out, dead, on_added)
            await _check_engine(store, config, detach=detach, on_note=on_note)
            note = on_note or (lambda _: None)
            by_batch = functools.partial(
                _batch_run, store, input_path=input_path, out=out, dead=dead, added=added,
                detach=detach, note=note, handle_signals=handle_signals,
            )  # fmt: skip
            online = functools.partial(
                _online_run, store, input_path=input_path, added=added, out=out, dead=dead,
                on_progress=on_progress, progress_interval_s=progress_interval_s,
                handle_signals=handle_signals, on_attempt=on_attempt, metrics=metrics,
            )  # fmt: skip
            summary, fatal = await _by_via(store, config, by_batch, online, note)
    summary.duration_s = time.monotonic() - started
    if fatal is not None:
        raise fatal
    return summary


async def _by_via(
    store: JobStore, config: Config, by_batch: ByBatch, online: Online,
    note: Callable[[str], None],
) -> Result:  # fmt: skip
    """The run's jobs sent the way ``config.via`` says: online, by the provider's batches,
    or (auto) batches first and online once the deadline needs it (aiq.auto_run)."""
    if config.via == "auto":
        from .auto_run import run_auto

        return await run_auto(store, config, by_batch=by_batch, online=online, note=note)
    return await (by_batch if config.via == "batch" else online)(config)


async def _online_run(
    store: JobStore, config: Config, *, input_path: Path | None, added: EnqueueCounts | None,
    out: str | None, dead: str | None, on_progress: ProgressCallback | None,
    progress_interval_s: float, handle_signals: bool, on_attempt: OnAttempt | None,
    metrics: MetricsWriter | None,
) -> Result:  # fmt: skip
    """An online run (aiq.online_run: the worker, imported here, so a batch run loads none)."""
    from .online_run import run_online

    return await run_online(
        store, config, input_path, added, out=out, dead=dead, on_progress=on_progress,
        progress_interval_s=progress_interval_s, handle_signals=handle_signals,
        on_attempt=on_attempt, metrics=metrics,
    )  # fmt: skip


def _check_input(config: Config, input_path: Path | None) -> None:
    """Before any store is made: the file's lines well formed, or, for a resume, a store."""
    if input_path is None:
        require_store(config.db)
    else:
        read_requests(input_path, config.defaults).check()


async def _check_engine(
    store: JobStore, config: Config, *, detach: bool, on_note: Callable[[str], None] | None
) -> None:
    """The engine the store recorded, for a resume, and what it cannot do; an online run
    hears of jobs left in open provider batches."""
    from .batch_run import check_via

    check_via(config)
    if detach and config.via not in ("batch", "auto"):
        raise UsageError("--detach works with --via batch or auto only (an online run waits)")
    if config.via not in ("batch", "auto") and on_note and (held := await store.in_batches()):
        on_note(
            f"{held:,} jobs are in open provider batches, left to them: "
            "`aiq resume --via batch` collects them"
        )


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
        summary, fatal = await _batch_run(
            store, config, input_path=None, out=out, dead=dead, added=None, detach=False, note=note,
            handle_signals=handle_signals, cancel=True,
        )  # fmt: skip
    summary.duration_s = time.monotonic() - started
    if fatal is not None:
        raise fatal
    return summary


async def _batch_run(
    store: JobStore, config: Config, *, input_path: Path | None, out: str | None,
    dead: str | None, added: EnqueueCounts | None, detach: bool,
    note: Callable[[str], None], handle_signals: bool, cancel: bool = False,
    watch: Watch | None = None,
) -> tuple[RunSummary, FatalProviderError | None]:  # fmt: skip
    """The run's jobs through the provider's batch engine (or, with ``cancel``, the open
    batches cancelled and collected), then exported as online; the summary, and the error
    to raise for a fatal stop."""
    from .batch_run import work_batches

    stats = await store.stats()
    progress = Progress(total=stats.total, done=stats.counts["done"], dead=stats.counts["dead"])
    batch, stopped, fatal = await work_batches(
        store, config, progress, detach=detach, note=note, handle_signals=handle_signals,
        cancel=cancel, watch=watch,
    )  # fmt: skip
    exports = await export_all(
        store, input_path, order=config.order, out=out, dead=dead, skip_unchanged=True
    )
    stats = await store.stats()
    if stopped in ("interrupted", "limit") and not stats.remaining:
        stopped = None  # every job had finished by the time it stopped: a finished run
    summary = RunSummary(
        added=added, progress=progress, stats=stats, exports=exports,
        stopped=stopped, on_truncated=config.on_truncated, batch=batch, fatal=fatal,
    )  # fmt: skip
    return summary, None if fatal is None else FatalProviderError(str(fatal), summary=summary)


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
