"""``aiq add``, ``aiq run`` (and ``--dry-run``) and ``aiq resume``: a file into the store, and
the store's jobs sent."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import AiqError, UsageError
from ..text import plural
from .app import guard, load_config, sync
from .display import Display
from .options import (
    AttemptsOpt,
    BaseUrlOpt,
    ConcurrencyOpt,
    ConfigOpt,
    DbOpt,
    DeadlineOpt,
    DeadOpt,
    DetachOpt,
    DryRunOpt,
    JsonOpt,
    LogFileOpt,
    LogFormatOpt,
    MaxCostOpt,
    MaxOutageOpt,
    MaxRuntimeOpt,
    MetricsOpt,
    ModelOpt,
    OnTruncatedOpt,
    OrderOpt,
    OutOpt,
    PriorityOpt,
    ProviderOpt,
    QuietOpt,
    RerouteOpt,
    RpmOpt,
    StrictOpt,
    TimeoutOpt,
    TpmOpt,
    TracebackOpt,
    ViaOpt,
    WaitOpt,
)

if TYPE_CHECKING:
    from ..config import Config
    from ..records import EnqueueCounts
    from ..run_records import RunSummary


def _print_counts(path: Path, c: EnqueueCounts, cfg: Config) -> None:
    from .. import report

    sys.stderr.writelines(f"{line}\n" for line in report.input_warnings(path, c))
    print(f"{path}: {report.add_counts(c)} ({plural(c.jobs_added, 'new request')} to send)")
    if cfg.defaults:
        print(report.defaults_line(c.defaults))


def add(
    file: Annotated[Path, typer.Argument(help="JSONL file of prompts.")],
    db: DbOpt = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    out: OutOpt = None,
    dead: DeadOpt = None,
    strict: StrictOpt = False,
    priority: PriorityOpt = None,
    traceback: TracebackOpt = False,
) -> None:
    """Enqueue a file without running it: prints new / known / changed / invalid."""

    def body() -> None:
        cfg = load_config(db, config, model=model, strict=strict or None, priority=priority)
        new = not cfg.db.exists()
        from .. import runner

        counts = sync(runner.add_file(cfg, file, out=out, dead=dead))
        _print_counts(file, counts, cfg)
        if new:  # a mistyped --db would otherwise start a store quietly
            print(f"new store at {cfg.db}", file=sys.stderr)
        raise typer.Exit(counts.exit_code)  # 6: lines were skipped, 7: the file was empty

    guard(traceback, body)


def _log_format(value: str) -> str:
    if value not in ("text", "json"):
        raise UsageError(f"--log-format {value!r}: give text or json")
    return value


def _check_wait(wait: float) -> None:
    if not wait >= 0:  # NaN too
        raise UsageError(f"--wait {wait:g}: give the seconds to wait for the store, 0 or more")


def _run(
    input_path: Path | None, cfg: Config, out: str | None, dead: str | None,
    display: Display, wait: float, detach: bool = False,
) -> None:  # fmt: skip
    from .. import runner

    on_added = None if input_path is None else functools.partial(display.added, input_path)
    _shown(
        display,
        runner.run_batch(
            cfg,
            input_path=input_path,
            out=out,
            dead=dead,
            on_progress=display.progress,
            on_added=on_added,
            handle_signals=True,
            lock_wait_s=wait,
            detach=detach,
            on_note=display.note,
            on_attempt=display.on_attempt,
        ),
    )


def _shown(display: Display, work: Coroutine[Any, Any, RunSummary]) -> None:
    """Run ``work`` (a run's library call), show its summary, exit with its code."""
    try:
        summary = sync(work)
        display.summary(summary)
    except AiqError as exc:
        from ..run_records import RunSummary as Summary  # not loaded before it is needed

        if isinstance(exc.summary, Summary):
            display.summary(exc.summary)
        display.error(str(exc), exc.exit_code)
        raise
    finally:
        display.close()
    raise typer.Exit(summary.exit_code)


def run(
    file: Annotated[Path, typer.Argument(help="JSONL file of prompts.")],
    db: DbOpt = None,
    config: ConfigOpt = None,
    out: OutOpt = None,
    dead: DeadOpt = None,
    provider: ProviderOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    concurrency: ConcurrencyOpt = None,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    max_attempts: AttemptsOpt = None,
    timeout: TimeoutOpt = None,
    order: OrderOpt = None,
    strict: StrictOpt = False,
    max_runtime: MaxRuntimeOpt = None,
    max_outage: MaxOutageOpt = None,
    metrics_file: MetricsOpt = None,
    log_file: LogFileOpt = None,
    log_format: LogFormatOpt = "text",
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    wait: WaitOpt = 0.0,
    dry_run: DryRunOpt = False,
    max_cost: MaxCostOpt = None,
    on_truncated: OnTruncatedOpt = None,
    reroute: RerouteOpt = False,
    via: ViaOpt = None,
    deadline: DeadlineOpt = None,
    detach: DetachOpt = False,
    priority: PriorityOpt = None,
    traceback: TracebackOpt = False,
) -> None:
    """Enqueue FILE (idempotent), work until nothing is due, write results and dead letters."""

    def body() -> None:
        cfg = _send_config(
            db, config, wait=wait, deadline=deadline, provider=provider, base_url=base_url,
            model=model, concurrency=concurrency, rpm=rpm, tpm=tpm, max_attempts=max_attempts,
            timeout_s=timeout, order=order, strict=strict or None, max_runtime_s=max_runtime,
            max_outage_s=max_outage, metrics_file=metrics_file, max_cost_usd=max_cost,
            on_truncated=on_truncated, reroute=reroute or None, via=via, priority=priority,
        )  # fmt: skip
        if dry_run:
            _dry_run(file, cfg, as_json)
        display = Display(quiet, as_json, log_file, _log_format(log_format))
        display.new_store = None if quiet or cfg.db.exists() else cfg.db
        _run(file, cfg, out, dead, display, wait, detach)

    guard(traceback, body)


def _send_config(
    db: Path | None, config: Path | None, *, wait: float, deadline: str | None, **flags: Any
) -> Config:
    """The Config of ``run`` and ``resume``, the flags by Config's names: ``--wait`` checked
    first, ``--deadline`` against the way of sending the config comes to."""
    _check_wait(wait)
    cfg = load_config(db, config, deadline=deadline, **flags)
    _check_deadline(cfg, deadline)
    return cfg


def _check_deadline(cfg: Config, deadline: str | None) -> None:
    """--deadline steers --via auto only: with another way it would be silently ignored."""
    if deadline is not None and cfg.via != "auto":
        raise UsageError(
            f"--deadline {deadline} works with --via auto only (this run sends --via "
            f"{cfg.via}); add --via auto, or leave --deadline out"
        )


def _dry_run(file: Path, cfg: Config, as_json: bool) -> None:
    from ..dry_run import forecast_file
    from ..report_forecast import forecast_lines

    forecast = sync(forecast_file(cfg, file))
    for bad in forecast.bad_lines[:50]:
        print(f"invalid: {bad}", file=sys.stderr)
    if forecast.invalid > 50:
        print(f"invalid: … and {forecast.invalid - 50:,} more", file=sys.stderr)
    if as_json:
        print(json.dumps(forecast.as_dict()))
    else:
        print("\n".join(forecast_lines(forecast)))
    # As the run would exit: 6 if it would skip lines, 7 if the file is empty.
    raise typer.Exit(6 if forecast.invalid else 0 if forecast.valid else 7)


def resume(
    db: DbOpt = None,
    config: ConfigOpt = None,
    out: OutOpt = None,
    dead: DeadOpt = None,
    provider: ProviderOpt = None,
    base_url: BaseUrlOpt = None,
    concurrency: ConcurrencyOpt = None,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    max_attempts: AttemptsOpt = None,
    timeout: TimeoutOpt = None,
    order: OrderOpt = None,
    max_runtime: MaxRuntimeOpt = None,
    max_outage: MaxOutageOpt = None,
    metrics_file: MetricsOpt = None,
    log_file: LogFileOpt = None,
    log_format: LogFormatOpt = "text",
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    wait: WaitOpt = 0.0,
    max_cost: MaxCostOpt = None,
    on_truncated: OnTruncatedOpt = None,
    reroute: RerouteOpt = False,
    via: ViaOpt = None,
    deadline: DeadlineOpt = None,
    detach: DetachOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Carry on with what is queued or was running when a run stopped; export outputs."""

    def body() -> None:
        cfg = _send_config(
            db, config, wait=wait, deadline=deadline, provider=provider, base_url=base_url,
            concurrency=concurrency, rpm=rpm, tpm=tpm, max_attempts=max_attempts,
            timeout_s=timeout, order=order, max_runtime_s=max_runtime, max_outage_s=max_outage,
            metrics_file=metrics_file, max_cost_usd=max_cost, on_truncated=on_truncated,
            reroute=reroute or None, via=via,
        )  # fmt: skip
        display = Display(quiet, as_json, log_file, _log_format(log_format))
        _run(None, cfg, out, dead, display, wait, detach)

    guard(traceback, body)


def cancel(
    db: DbOpt = None,
    config: ConfigOpt = None,
    out: OutOpt = None,
    dead: DeadOpt = None,
    base_url: BaseUrlOpt = None,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    wait: WaitOpt = 0.0,
    traceback: TracebackOpt = False,
) -> None:
    """Cancel the store's open provider batches (--via batch), collect what they finished
    and put the rest back in the queue at no attempt; export outputs.

    Nothing new is submitted: `aiq resume` sends what is queued (--via online to send it
    online).
    """

    def body() -> None:
        from .. import runner

        _check_wait(wait)
        cfg = load_config(db, config, base_url=base_url)
        display = Display(quiet, as_json, None)
        work = runner.cancel_batches(
            cfg, out=out, dead=dead, handle_signals=True, lock_wait_s=wait, on_note=display.note
        )
        _shown(display, work)

    guard(traceback, body)
