"""An online run (``--via online``, the default): the worker built over the store, worked
under the signals, the deadline and a progress ticker, and what it did summed up, for
runner.run_batch. A stop (signal, deadline, fatal error) drains: in-flight requests get
``grace_s`` to finish and be recorded, then are abandoned (released, retried on resume).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import calibration, machine
from .config import Config
from .contract import StopReason
from .costs import CostMeter
from .errors import FatalProviderError, UsageError
from .interrupts import stopped_by
from .joblog import OnAttempt
from .metrics import MetricsWriter
from .outputs import export_all
from .pricing import price_for
from .records import EnqueueCounts
from .run_records import Export, Progress, RunSummary
from .stats import Stats
from .store import JobStore
from .timeouts import Timeouts

if TYPE_CHECKING:
    import httpx

    from .worker import Worker

# The worker, the limiters and the providers with their HTTP clients are imported by the
# functions that send (through providers.factory), not here: `aiq status` imports none.

ProgressCallback = Callable[[Progress], None]


async def run_online(
    store: JobStore,
    config: Config,
    input_path: Path | None,
    added: EnqueueCounts | None,
    *,
    out: str | None,
    dead: str | None,
    on_progress: ProgressCallback | None,
    progress_interval_s: float,
    handle_signals: bool,
    on_attempt: OnAttempt | None,
    metrics: MetricsWriter | None,
) -> tuple[RunSummary, FatalProviderError | None]:
    """Work the store's due jobs until none is left or the run stops, learn the tokens the
    replies showed, export every input file; the summary, and the error to raise for a
    fatal stop (raised by the caller once the store is closed)."""
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
    return summary, _fatal_error(worker, summary)


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


def _fatal_error(worker: Worker, summary: RunSummary) -> FatalProviderError | None:
    if worker.fatal is None:
        return None
    # A status: the server said no. None: aiq gave up on it (an outage, no answer at all).
    why = "the provider refused the run" if worker.fatal.status_code else "the run stopped"
    return FatalProviderError(
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
    with stopped_by(stops, max_runtime_s=config.max_runtime_s, handle_signals=handle_signals):
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

    def __call__(self, reason: StopReason) -> None:
        """A signal (``interrupted``) or the deadline (``limit``; a signal's word wins)."""
        self._worker.stop()
        if reason != "interrupted":
            self.reason = self.reason or reason
            return
        self._signals += 1
        self.reason = reason
        if self._signals > 1:
            self._task.cancel()


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
