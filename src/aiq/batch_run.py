"""A run ``--via batch``: the batch engine (aiq.batch_engine) built from the config and worked
under the signals, for runner.run_batch. Built here, not in the runner, so ``aiq status``
and ``add`` never load httpx's transport."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx

from .batch_cancel import BatchCanceller
from .batch_engine import BatchEngine, Watch
from .config import Config
from .contract import StopReason
from .database import rollback
from .errors import FatalProviderError, UsageError
from .interrupts import stopped_by
from .outcomes import RetryPolicy
from .providers.batches import BatchService
from .providers.factory import BATCH_CLASSES, make_batch_service
from .run_records import BatchRun, Progress
from .store import JobStore

Note = Callable[[str], None]


def check_via(config: Config) -> None:
    """UsageError for a way of sending not built yet, or a provider batch cannot use."""
    if config.via == "flex" and config.spec.api != "openai":
        raise UsageError(
            f"--via flex is OpenAI's flex tier; provider {config.provider} has none: use "
            "--via online"
        )
    via = config.via
    batch = via in ("batch", "auto")  # auto starts by batch
    if batch and config.spec.api not in BATCH_CLASSES:
        raise UsageError(
            f"--via {via} with provider {config.provider} is not built yet; it works with "
            "OpenAI (and OpenAI-compatible servers offering /v1/files and /v1/batches) and "
            "Anthropic's Message Batches"
        )
    if batch and config.spec.offline:
        raise UsageError(f"--via {via} needs a real server: the simulated provider has no batches")
    if batch and config.max_cost_usd is not None:
        # A batch is billed as a whole once submitted: a cap checked per reply cannot hold.
        raise UsageError(
            f"--max-cost is not built for --via {via} yet (a submitted batch is billed whole); "
            "leave max_cost out for this run, or use --via online"
        )


def _engine(
    store: JobStore, config: Config, progress: Progress, note: Note, *, cancel: bool = False,
    watch: Watch | None = None,
) -> tuple[BatchEngine, BatchService, httpx.AsyncBaseTransport]:  # fmt: skip
    """The run's engine over ``store`` (with ``cancel``, aiq cancel's), its API client and
    the transport under both."""
    transport = httpx.AsyncHTTPTransport(retries=0)
    api, answers = make_batch_service(config, transport)
    engine = (BatchCanceller if cancel else BatchEngine)(
        store, api, answers, provider=config.provider,
        files_dir=config.db.parent / "batches", progress=progress,
        prices=config.price_table,
        retry=RetryPolicy(config.max_attempts, config.backoff_base_s, config.backoff_cap_s),
        note=note, watch=watch,
    )  # fmt: skip
    return engine, api, transport


async def work_batches(
    store: JobStore, config: Config, progress: Progress, *, detach: bool, note: Note,
    handle_signals: bool, cancel: bool = False, watch: Watch | None = None,
) -> tuple[BatchRun, StopReason | None, FatalProviderError | None]:  # fmt: skip
    """Run the batch engine over ``store`` (with ``cancel``: cancel and collect the open
    batches, submitting nothing); what it did, why it stopped (a signal or --max-runtime
    stops the waiting, leaving every batch recorded for resume), and the fatal error that
    stopped it, if one did."""
    engine, api, transport = _engine(store, config, progress, note, cancel=cancel, watch=watch)
    task = asyncio.ensure_future(engine.run(detach=detach))
    stops: list[StopReason] = []

    def stop(reason: StopReason) -> None:
        # The first stop lets the step under way end (a call cut off mid-transaction would
        # leave the store's connection inside it); a second signal abandons it at once.
        stops.append(reason)
        if len(stops) == 1:
            engine.stop()
        else:
            task.cancel()

    stopped: StopReason | None = None
    fatal = None
    try:
        with stopped_by(stop, max_runtime_s=config.max_runtime_s, handle_signals=handle_signals):
            await task
        stopped = stops[0] if stops else None
    except asyncio.CancelledError:
        if not stops:
            raise
        stopped = stops[0]
        await _out_of_transaction(store)
    except FatalProviderError as exc:
        stopped, fatal = "fatal", exc
    finally:
        with contextlib.suppress(Exception):
            await api.aclose()
        await transport.aclose()
    engine.run_record.open = len(await store.batches(open_only=True))
    engine.run_record.switched_online = engine.switching
    return engine.run_record, stopped, fatal


async def _out_of_transaction(store: JobStore) -> None:
    """After a step abandoned halfway: the connection out of any transaction it began.
    aiosqlite runs calls in order, so one more call finds what the abandoned one did."""
    db = store.connection
    await db.execute("SELECT 1")
    await rollback(db)
