"""The library behind each command: add, run/resume, status, replay-dead, export.

Each function takes a Config and returns data; the CLI only parses flags and renders. Progress
is reported through a callback, so nothing here knows about terminals.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from . import calibration, enqueue, machine, routing
from .config import Config
from .contract import StopReason
from .costs import CostMeter
from .database import require_store
from .errors import (
    FatalProviderError,
    InputError,
    StoreError,
    UsageError,
)
from .forecast import Forecast, Forecaster
from .inputs import BadLine, count_defaults
from .lock import StoreLock, run_state
from .metrics import MetricsWriter
from .outputs import export_source
from .pricing import price_for
from .records import DEAD, EnqueueCounts, Replayed, Source, Stats
from .replay import replay
from .requestfile import read_requests
from .run_records import Export, Progress, RunSummary
from .store import JobStore
from .text import plural
from .timeouts import Timeouts

if TYPE_CHECKING:
    from .worker import Worker

# The worker, the limiters and the providers with their HTTP clients are imported by the
# functions that send (run_batch, through providers.factory), not here: `aiq status`, `add`
# and `export` use this module too, and start in half the time without them.

ProgressCallback = Callable[[Progress], None]


def default_outputs(input_path: Path) -> tuple[str, str]:
    """``<stem>.results.jsonl`` and ``<stem>.dead.jsonl`` beside the input file."""
    base = input_path.with_suffix("") if input_path.suffix else input_path
    return f"{base}.results.jsonl", f"{base}.dead.jsonl"


@contextlib.asynccontextmanager
async def open_store(config: Config, *, readonly: bool = False) -> AsyncIterator[JobStore]:
    """The store named by the config, closed on exit."""
    store = await JobStore.open(config.db, readonly=readonly)
    try:
        with store.errors():  # a full disk mid-run: one `error:` line, not a traceback
            yield store
    finally:
        await store.close()


async def _enqueue(
    store: JobStore, config: Config, path: Path, out: str | None, dead: str | None
) -> tuple[Source, EnqueueCounts]:
    resolved = path.resolve()
    default_out, default_dead = default_outputs(resolved)
    if config.strict:
        first: list[BadLine] = []  # to show; the rest only counted
        invalid = 0
        for line in read_requests(resolved, config.defaults):
            if isinstance(line, BadLine):
                invalid += 1
                if len(first) < 20:
                    first.append(line)
        if invalid:
            listing = "\n".join(f"  {b}" for b in first)
            more = f"\n  … and {invalid - 20:,} more" if invalid > 20 else ""
            raise InputError(
                f"{path}: {plural(invalid, 'invalid line')}; nothing was enqueued (--strict):\n"
                f"{listing}{more}"
            )
    source = await store.add_source(
        str(resolved), out_path=out or default_out, dead_path=dead or default_dead
    )
    counts = await enqueue.add_file(store, source, read_requests(resolved, config.defaults))
    if counts.invalid and not counts.valid:
        shown = "\n".join(f"  {b}" for b in counts.bad_lines[:5])
        raise InputError(
            f"{path}: no valid line in {counts.invalid:,} (first ones below); is it a JSONL "
            f"file of requests, one JSON object per line? Fix it and run again:\n{shown}"
        )
    return source, counts


async def add_file(
    config: Config, path: Path, *, out: str | None = None, dead: str | None = None
) -> EnqueueCounts:
    """Enqueue one JSONL file (idempotent); returns new / known / changed / invalid counts."""
    read_requests(path, config.defaults).check()  # before any store is made
    with _no_store_left_on_bad_input(config.db):
        return await _add_file(config, path, out, dead)


async def _add_file(config: Config, path: Path, out: str | None, dead: str | None) -> EnqueueCounts:
    async with open_store(config) as store:
        stored = await store.target()  # its defaults, as `run` would apply them
        config = config if stored is None else config.aimed_at(stored)
        return (await _enqueue(store, config, path, out, dead))[1]


@contextlib.contextmanager
def _no_store_left_on_bad_input(path: str | os.PathLike[str]) -> Iterator[None]:
    """A command that made a new store and then found no valid line to put in it removes the
    store again: a mistyped or garbage file must not leave one behind to be found later."""
    db = Path(path)
    made_dir = not db.parent.exists()
    made = not db.exists()
    try:
        yield
    except InputError:
        if made:
            for suffix in ("", "-wal", "-shm", ".lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f"{db}{suffix}")
            if made_dir:
                with contextlib.suppress(OSError):
                    db.parent.rmdir()  # only if empty
        raise


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
) -> RunSummary:
    """``aiq run FILE`` (with ``input_path``) or ``aiq resume`` (without).

    Holds the store's lock throughout, recovers jobs a dead run left ``running``, works until
    nothing is due, then exports every input file's results and dead letters. ``on_added``
    hears what the file added (and its invalid lines) before anything is sent.
    """
    from .breaker import Breakers
    from .limiter import Limiters
    from .worker import RetryPolicy, Worker

    started = time.monotonic()
    if input_path is None:
        require_store(config.db)  # resume
    else:
        read_requests(input_path, config.defaults).check()  # before any store is made
    metrics = MetricsWriter(config.metrics_file) if config.metrics_file else None
    with _no_store_left_on_bad_input(config.db):
        async with StoreLock(config.db, wait_s=lock_wait_s) as lock, open_store(config) as store:
            config = await routing.aim(store, config)
            added = None
            if input_path is not None:
                _source, added = await _enqueue(store, config, input_path, out, dead)
                if on_added is not None:
                    on_added(added)
            await routing.record(store, config)
            await store.recover_running(config.max_attempts)
            await store.undefer()
            lock.note(sending_since=time.time())  # status's rate starts here, not at the read
            bound = machine.run_bound(config.max_concurrency)
            from .providers.factory import make_provider  # (it loads the HTTP clients)

            provider, transport = make_provider(
                config, pool_size=config.fixed_concurrency or bound.senders
            )
            stats = await store.stats()
            progress = Progress(
                total=stats.total, done=stats.counts["done"], dead=stats.counts["dead"]
            )
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
                progress=progress,
                costs=await _cost_meter(store, config, stats),
                timeouts=Timeouts(ceiling_s=config.timeout_s),
                on_truncated=config.on_truncated,
            )
            tick = _ticker(on_progress, metrics)
            try:
                stopped = await _work(worker, config, tick, progress_interval_s, handle_signals)
            finally:
                await transport.aclose()
            await calibration.learn(store)  # for the next --dry-run's prompt figures
            # A run that changed nothing leaves files that already say what the store holds.
            exports = await _export_all(store, config, input_path, out, dead, skip_unchanged=True)
            summary = RunSummary(
                added=added, progress=progress, stats=await store.stats(), exports=exports,
                stopped=stopped, on_truncated=config.on_truncated,
            )  # fmt: skip
            if stopped in ("interrupted", "limit") and not summary.stats.remaining:
                summary.stopped = None  # the drain finished every job: a finished run
            if worker.fatal is not None:
                summary.stopped = "fatal"
            elif worker.costs.reached:
                summary.stopped = "budget"
            if metrics is not None:
                metrics.finish(progress, summary.stats, summary.exit_code)
    summary.duration_s = time.monotonic() - started
    if worker.fatal is not None:
        # A status: the server said no. None: aiq gave up on it (an outage, no answer at all).
        why = "the provider refused the run" if worker.fatal.status_code else "the run stopped"
        raise FatalProviderError(
            f"{why}: {worker.fatal.message}; every job is kept, fix it and run `aiq resume`",
            summary=summary,
        )
    return summary


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
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(worker.run())
    reason: StopReason | None = None
    signals = 0

    def on_signal() -> None:
        nonlocal signals, reason
        signals += 1
        reason = "interrupted"
        worker.stop()
        if signals > 1:  # a second signal abandons what is in flight at once
            task.cancel()

    def on_deadline() -> None:
        nonlocal reason
        reason = reason or "limit"
        worker.stop()

    deadline = loop.call_later(config.max_runtime_s, on_deadline) if config.max_runtime_s else None
    # asyncio puts back the defaults, not what was there: keep the CLI's, for the export.
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if handle_signals:
        for sig in previous:
            loop.add_signal_handler(sig, on_signal)
    abandon_at: float | None = None
    try:
        while not task.done():
            await asyncio.wait([task], timeout=interval_s)
            worker.note_waits()
            if on_progress is not None:
                try:
                    on_progress(worker.progress)
                except Exception:  # a metrics or log file that cannot be written: stop
                    worker.stop()  # drain first, so what is in flight is recorded
                    await asyncio.wait([task], timeout=config.grace_s)
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    raise
            if worker.stopping and abandon_at is None:
                abandon_at = loop.time() + config.grace_s
            if abandon_at is not None and loop.time() >= abandon_at:
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        if deadline is not None:
            deadline.cancel()
        if handle_signals:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                if handler is not None:  # None: not set from Python, nothing to put back
                    signal.signal(sig, handler)
    return "fatal" if worker.fatal is not None else reason


async def _export_all(
    store: JobStore,
    config: Config,
    input_path: Path | None,
    out: str | None,
    dead: str | None,
    *,
    skip_unchanged: bool = False,
) -> list[Export]:
    sources = await store.sources()
    if input_path is not None:
        wanted = str(input_path.resolve())
        sources = [s for s in sources if s.path == wanted]
    elif (out or dead) and len(sources) > 1:
        raise UsageError("--out/--dead need a single input file; this store has several")
    return [
        await export_source(
            store,
            s,
            order=config.order,
            results_path=out,
            dead_path=dead,
            skip_unchanged=skip_unchanged,
        )
        for s in sources
    ]


async def export_outputs(
    config: Config, *, out: str | None = None, dead: str | None = None
) -> list[Export]:
    """``aiq export``: rewrite every input file's results and dead letters from the store."""
    async with open_store(config, readonly=True) as store:
        return await _export_all(store, config, None, out, dead)


async def store_status(config: Config) -> Stats:
    """``aiq status``: read-only, so it works while a run holds the store. Whether a run is
    active comes from the lock (never taken here); its rate, from the time it has sent for."""
    run = run_state(config.db)
    since = (run.sending_since or run.started_at) if run.active else None
    async with open_store(config, readonly=True) as store:
        return dataclasses.replace(await store.stats(since=since), run=run)


async def replay_dead(
    config: Config, *, error_type: str | None = None, custom_ids: tuple[str, ...] = ()
) -> Replayed:
    """``aiq replay-dead``: dead jobs (all, of one error type, of these custom_ids) back to
    queued, attempts reset; UsageError, and nothing replayed, for a filter that names what
    the store does not have (see replay.replay)."""
    require_store(config.db)
    async with open_store(config) as store:
        return await replay(store, error_type=error_type, custom_ids=custom_ids)


async def forecast_file(config: Config, path: Path) -> Forecast:
    """``aiq run FILE --dry-run``: validate and count FILE, send nothing, change nothing.

    Requests the store has already done, or dead-lettered, are not counted (a run sends
    neither: dead jobs wait for ``replay-dead``); the store is opened read-only, and only if
    it exists.
    """
    forecast = Forecast(str(path), config.rpm, config.tpm, config.model_limits)
    default_output = 0
    if config.spec.default_max_tokens is not None:  # it requires max_tokens; aiq sends one
        default_output = config.max_tokens or config.spec.default_max_tokens
    async with contextlib.AsyncExitStack() as stack:
        store: JobStore | None = None
        if config.db.exists():
            try:
                store = await stack.enter_async_context(open_store(config, readonly=True))
            except StoreError as exc:
                forecast.store_note = f"the store was not consulted: {exc}"
        learned = await calibration.current(store) if store is not None else {}
        counter = Forecaster(
            forecast, config.price_table, default_output=default_output, learned=learned
        )
        reader = read_requests(path, config.defaults)
        for batch in reader.batches(10_000):
            fresh = counter.add(batch)
            if store is not None and fresh:
                finished = await store.finished_among([k for k, _ in fresh])
                dead = sum(state == DEAD for state in finished.values())
                forecast.done_before += len(finished) - dead
                forecast.dead_before += dead
                fresh = [(k, r) for k, r in fresh if k not in finished]
            counter.count(r for _, r in fresh)
    if config.defaults:
        forecast.defaults = count_defaults(reader.applied)
    if forecast.invalid and (config.strict or not forecast.valid):  # run would refuse it
        first = "\n".join(f"  {b}" for b in forecast.bad_lines[:5])
        why = (
            f"{plural(forecast.invalid, 'invalid line')}, and --strict refuses the file"
            if forecast.valid
            else f"no valid line in {forecast.invalid:,}"
        )
        raise InputError(f"{path}: {why} (first ones below); fix it and run again:\n{first}")
    return forecast
