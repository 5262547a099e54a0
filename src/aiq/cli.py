"""The ``aiq`` command: parse flags into a Config, call the library, render the result.

Errors aiq expects (AiqError) are caught once here and printed as one ``error: …`` line with
the exit code they carry; anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

# typer's own copy of click (typer >= 0.26, pinned in pyproject.toml): the errors it raises.
from typer._click.exceptions import Abort, ClickException, NoArgsIsHelpError, NoSuchOption

from . import __version__
from .contract import PROVIDER_NAMES
from .errors import AiqError, UsageError
from .files import open_log
from .text import plural

if TYPE_CHECKING:
    from rich.console import Console

    from .config import Config
    from .records import EnqueueCounts
    from .run_records import RunSummary

# What a command uses and the others do not (the runner with the store and the HTTP clients,
# the checks, the text report, rich's live panel, asyncio) is imported inside it: `aiq --help`
# and `aiq status` then start in half the time (tests/test_layers.py checks what they load).

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run large batches of prompts against LLM APIs: durable, resumable, rate-limited.",
    pretty_exceptions_enable=False,
)
T = TypeVar("T")

DbOpt = Annotated[
    Path | None, typer.Option("--db", help="Store path (default: .aiq/aiq.db, or $AIQ_DB).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML config (default: aiq.yaml if present).")
]
TracebackOpt = Annotated[bool, typer.Option("--traceback", help="Show tracebacks for errors.")]
OutOpt = Annotated[
    str | None, typer.Option("--out", help="Results file (default: <input>.results.jsonl).")
]
DeadOpt = Annotated[
    str | None, typer.Option("--dead", help="Dead letters (default: <input>.dead.jsonl).")
]
ProviderOpt = Annotated[
    str | None, typer.Option("--provider", help=f"{' | '.join(PROVIDER_NAMES)}.")
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="API base URL (default: $OPENAI_BASE_URL, or $ANTHROPIC_BASE_URL for anthropic).",
    ),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Model for lines naming none.")]
ConcurrencyOpt = Annotated[
    str | None,
    typer.Option(
        "--concurrency", help="Requests in flight: a number, or auto (sized to the rate limits)."
    ),
]
MaxOutageOpt = Annotated[
    float | None,
    typer.Option(
        "--max-outage", help="Seconds to wait for a provider that is down, then exit 4 (resumable)."
    ),
]
RpmOpt = Annotated[int | None, typer.Option("--rpm", help="Requests per minute limit.")]
TpmOpt = Annotated[int | None, typer.Option("--tpm", help="Tokens per minute limit.")]
AttemptsOpt = Annotated[
    int | None, typer.Option("--max-attempts", help="Failed attempts before a job is dead.")
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        help="Longest a call may take, seconds (default 600); shorter per model once its "
        "replies show how long they take.",
    ),
]
OrderOpt = Annotated[
    str | None, typer.Option("--order", help="Results order: done (finish time) | input.")
]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Refuse the whole file if any line is invalid.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final summary.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")]
MaxRuntimeOpt = Annotated[
    float | None,
    typer.Option("--max-runtime", help="Stop claiming after SECONDS, drain, exit 5 (resumable)."),
]
MetricsOpt = Annotated[
    str | None,
    typer.Option("--metrics-file", help="Write Prometheus metrics here (textfile collector)."),
]
LogFileOpt = Annotated[
    Path | None, typer.Option("--log-file", help="Append timestamped progress and summary here.")
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run", help="Validate and forecast requests, tokens, cost and ETA; send nothing."
    ),
]
MaxCostOpt = Annotated[
    float | None,
    typer.Option(
        "--max-cost", help="Stop claiming before the store's spend would pass USD; exit 5."
    ),
]
RerouteOpt = Annotated[
    bool,
    typer.Option(
        "--reroute",
        help="Send the store's unfinished jobs to this provider or base URL, not the recorded one.",
    ),
]
OnTruncatedOpt = Annotated[
    str | None,
    typer.Option(
        "--on-truncated",
        help="A reply cut off at max_tokens: keep it as a result (default) | dead-letter it.",
    ),
]
WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        help="Wait up to SECONDS for another run to release the store (default: 0, fail at once).",
        show_default=False,  # as every other option: in the help text, in parentheses
    ),
]


def _print_version(wanted: bool) -> None:
    if wanted:
        print(f"aiq {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Run large batches of prompts against LLM APIs: durable, resumable, rate-limited."""


def _guard(show_traceback: bool, fn: Callable[[], T]) -> T:
    """Run a command body: AiqError → one ``error:`` line and its exit code."""
    try:
        return fn()
    except AiqError as exc:
        if show_traceback:
            raise
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None


def _sync(work: Coroutine[Any, Any, T]) -> T:
    """Run one of the library's coroutines to its end."""
    import asyncio

    return asyncio.run(work)


def _config(db: Path | None, config: Path | None, **flags: Any) -> Config:
    from .config import Config

    cfg = Config.resolve(config_path=config, flags={"db": db, **flags})
    if cfg.config_path is not None:  # ./aiq.yaml is read unasked: say so
        print(f"config: {cfg.config_path}", file=sys.stderr)
    return cfg


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def _print_counts(path: Path, c: EnqueueCounts, cfg: Config) -> None:
    from . import report

    sys.stderr.writelines(f"{line}\n" for line in report.input_warnings(path, c))
    print(f"{path}: {report.add_counts(c)} ({plural(c.jobs_added, 'new request')} to send)")
    if cfg.defaults:
        print(report.defaults_line(c.defaults))


@app.command()
def add(
    file: Annotated[Path, typer.Argument(help="JSONL file of prompts.")],
    db: DbOpt = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    out: OutOpt = None,
    dead: DeadOpt = None,
    strict: StrictOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Enqueue a file without running it: prints new / known / changed / invalid."""

    def body() -> None:
        cfg = _config(db, config, model=model, strict=strict or None)
        new = not cfg.db.exists()
        from . import runner

        counts = _sync(runner.add_file(cfg, file, out=out, dead=dead))
        _print_counts(file, counts, cfg)
        if new:  # a mistyped --db would otherwise start a store quietly
            print(f"new store at {cfg.db}", file=sys.stderr)
        raise typer.Exit(counts.exit_code)  # 6: lines were skipped, 7: the file was empty

    _guard(traceback, body)


class _Display:
    """Where a run's progress and summary go: terminal, plain lines, JSON, a log file."""

    def __init__(self, quiet: bool, as_json: bool, log_file: Path | None) -> None:
        self.as_json = as_json
        self.new_store: Path | None = None  # said once the file is in it
        from .progress import LiveProgress, PlainProgress, wants_live_panel

        self._log = open_log(log_file) if log_file else None
        shows: list[Any] = []
        if not (quiet or as_json):
            live = wants_live_panel(sys.stdout.isatty(), os.environ)
            shows.append(LiveProgress(_console()) if live else PlainProgress(sys.stderr))
        if self._log is not None:
            shows.append(PlainProgress(self._log))
        self._shows = shows

    def progress(self, p: Any) -> None:
        for show in self._shows:
            show(p)

    def added(self, path: Path, c: EnqueueCounts) -> None:
        """The file is read: say what was wrong with it now, not hours later at the end."""
        from . import report

        lines = report.input_warnings(path, c)
        if self.new_store is not None:  # a mistyped --db would otherwise start a store quietly
            lines.append(f"new store at {self.new_store}")
        sys.stderr.writelines(f"{line}\n" for line in lines)
        self._write_log(lines)

    def summary(self, s: RunSummary) -> None:
        from . import report

        self._stop_shows()  # the panel's last frame first, then the summary under it
        lines = report.run_summary_lines(s)
        if self.as_json:
            print(json.dumps(report.run_summary_json(s)))
        else:
            print("\n".join(lines))
        self._write_log(lines)

    def _write_log(self, lines: list[str]) -> None:
        if self._log is not None:
            stamp = datetime.now().astimezone().isoformat(timespec="seconds")
            self._log.writelines(f"{stamp} {line}\n" for line in lines)

    def _stop_shows(self) -> None:
        shows, self._shows = self._shows, []
        for show in shows:
            show.close()

    def close(self) -> None:
        self._stop_shows()
        if self._log is not None:
            self._log.close()


def _check_wait(wait: float) -> None:
    if not wait >= 0:  # NaN too
        raise UsageError(f"--wait {wait:g}: give the seconds to wait for the store, 0 or more")


def _run(
    input_path: Path | None, cfg: Config, out: str | None, dead: str | None,
    display: _Display, wait: float,
) -> None:  # fmt: skip
    from . import runner

    on_added = None if input_path is None else functools.partial(display.added, input_path)
    try:
        summary = _sync(
            runner.run_batch(
                cfg,
                input_path=input_path,
                out=out,
                dead=dead,
                on_progress=display.progress,
                on_added=on_added,
                handle_signals=True,
                lock_wait_s=wait,
            )
        )
        display.summary(summary)
    except AiqError as exc:
        from .run_records import RunSummary

        if isinstance(exc.summary, RunSummary):
            display.summary(exc.summary)
        raise
    finally:
        display.close()
    raise typer.Exit(summary.exit_code)


@app.command()
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
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    wait: WaitOpt = 0.0,
    dry_run: DryRunOpt = False,
    max_cost: MaxCostOpt = None,
    on_truncated: OnTruncatedOpt = None,
    reroute: RerouteOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Enqueue FILE (idempotent), work until nothing is due, write results and dead letters."""

    def body() -> None:
        _check_wait(wait)
        cfg = _config(
            db, config, provider=provider, base_url=base_url, model=model,
            concurrency=concurrency, rpm=rpm, tpm=tpm, max_attempts=max_attempts,
            timeout_s=timeout, order=order, strict=strict or None,
            max_runtime_s=max_runtime, max_outage_s=max_outage, metrics_file=metrics_file,
            max_cost_usd=max_cost, on_truncated=on_truncated, reroute=reroute or None,
        )  # fmt: skip
        if dry_run:
            _dry_run(file, cfg, as_json)
        display = _Display(quiet, as_json, log_file)
        if not (quiet or cfg.db.exists()):
            display.new_store = cfg.db
        _run(file, cfg, out, dead, display, wait)

    _guard(traceback, body)


def _dry_run(file: Path, cfg: Config, as_json: bool) -> None:
    from . import report, runner

    forecast = _sync(runner.forecast_file(cfg, file))
    for bad in forecast.bad_lines[:50]:
        print(f"invalid: {bad}", file=sys.stderr)
    if forecast.invalid > 50:
        print(f"invalid: … and {forecast.invalid - 50:,} more", file=sys.stderr)
    if as_json:
        print(json.dumps(forecast.as_dict()))
    else:
        print("\n".join(report.forecast_lines(forecast)))
    # As the run would exit: 6 if it would skip lines, 7 if the file is empty.
    raise typer.Exit(6 if forecast.invalid else 0 if forecast.valid else 7)


@app.command()
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
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    wait: WaitOpt = 0.0,
    max_cost: MaxCostOpt = None,
    on_truncated: OnTruncatedOpt = None,
    reroute: RerouteOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Carry on with what is queued or was running when a run stopped; export outputs."""

    def body() -> None:
        _check_wait(wait)
        cfg = _config(
            db, config, provider=provider, base_url=base_url, concurrency=concurrency,
            rpm=rpm, tpm=tpm, max_attempts=max_attempts, timeout_s=timeout, order=order,
            max_runtime_s=max_runtime, max_outage_s=max_outage, metrics_file=metrics_file,
            max_cost_usd=max_cost, on_truncated=on_truncated, reroute=reroute or None,
        )  # fmt: skip
        _run(None, cfg, out, dead, _Display(quiet, as_json, log_file), wait)

    _guard(traceback, body)


@app.command()
def status(
    db: DbOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Where the store stands: counts by state, rate, ETA, tokens, oldest waiting, errors."""

    def body() -> None:
        from . import report, runner

        stats = _sync(runner.store_status(_config(db, config)))
        if as_json:
            print(json.dumps(stats.as_dict()))
        else:
            print("\n".join(report.status_lines(stats)))

    _guard(traceback, body)


@app.command()
def check(
    db: DbOpt = None,
    config: ConfigOpt = None,
    provider: ProviderOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    as_json: JsonOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Check config, API key, endpoint, model, prices and store; one line each, with fixes."""

    def body() -> None:
        def resolve() -> Config:
            return _config(db, config, provider=provider, base_url=base_url, model=model)

        from . import preflight

        result = _sync(preflight.run_checks(resolve))
        if as_json:
            print(json.dumps({"exit_code": result.exit_code,
                              "findings": [f.as_dict() for f in result.findings]}))  # fmt: skip
        else:
            print("\n".join(map(str, result.findings)))
        raise typer.Exit(result.exit_code)

    _guard(traceback, body)


@app.command("prices")
def prices_command(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """The prices in force: aiq's dated list prices with the config's `prices:` over them."""

    def body() -> None:
        from . import prices

        rows = prices.prices_in_force(_config(None, config).prices)
        today = date.today()
        if as_json:
            print(json.dumps({"max_age_days": prices.PRICE_MAX_AGE_DAYS,
                              "prices": [r.as_dict(today) for r in rows]}))  # fmt: skip
        else:
            print("\n".join(prices.table_lines(rows, today)))

    _guard(traceback, body)


@app.command("replay-dead")
def replay_dead(
    db: DbOpt = None,
    config: ConfigOpt = None,
    error: Annotated[
        str | None, typer.Option("--error", help="Only dead jobs whose last error is TYPE.")
    ] = None,
    ids: Annotated[
        list[str] | None, typer.Option("--id", help="Only this custom_id (repeatable).")
    ] = None,
    traceback: TracebackOpt = False,
) -> None:
    """Move dead jobs back to the queue with attempts reset (then `aiq resume`)."""

    def body() -> None:
        from . import report, runner

        replayed = _sync(
            runner.replay_dead(_config(db, config), error_type=error, custom_ids=tuple(ids or ()))
        )
        print("\n".join(report.replay_lines(replayed)))

    _guard(traceback, body)


@app.command()
def export(
    db: DbOpt = None,
    config: ConfigOpt = None,
    out: OutOpt = None,
    dead: DeadOpt = None,
    order: OrderOpt = None,
    traceback: TracebackOpt = False,
) -> None:
    """(Re)write results and dead-letter files from the store."""

    def body() -> None:
        from . import report, runner

        exports = _sync(runner.export_outputs(_config(db, config, order=order), out=out, dead=dead))
        for e in exports:
            print("\n".join(report.export_lines(e)))

    _guard(traceback, body)


def main() -> None:
    """Console-script entry point."""
    # SIGTERM (cron, systemd, a container stopping) ends a command as Ctrl-C does: files being
    # written are removed, not left half-done. `run` drains on it instead, while it works.
    signal.signal(signal.SIGTERM, _terminated)
    # The cyclic GC's first threshold, 700 allocations, ran it ~500 times in a run at 500
    # requests/s, each pass walking the objects of ~1,500 calls in flight: 8% of aiq's CPU
    # (bench/README.md, "CPU at 500 requests/s"). At 50,000 it runs ~12 times, for ~0.4%.
    # Set here, for the aiq process: the library leaves its caller's GC alone.
    gc.set_threshold(50_000, *gc.get_threshold()[1:])
    try:
        # Not standalone: a usage error comes back here, to be printed as aiq prints errors
        # (typer's own way is a rich box), and typer.Exit comes back as its exit code.
        code = app(prog_name="aiq", standalone_mode=False)
    except ClickException as exc:
        code = _usage_error(exc)
    except Abort:  # end of input at a prompt; aiq has none, but typer may raise it
        print("error: aborted", file=sys.stderr)
        code = 1
    finally:
        if _signalled:
            # Files being written are gone by now (their context managers ran as SystemExit
            # unwound). A store the signal cut off before it closed leaves aiosqlite's thread
            # (not a daemon) waiting for work, and the interpreter would wait for it at exit:
            # an export stopped by SIGTERM hung instead of exiting (tests/test_bad_env.py).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
    sys.exit(code if isinstance(code, int) else 0)


_signalled = False


def _terminated(signum: int, frame: object) -> None:
    # 130 for any signal, as for Ctrl-C and as `run` exits when a signal stops it (DESIGN.md's
    # exit codes): a wrapper must not see 143 or 130 depending on when SIGTERM landed.
    global _signalled
    _signalled = True
    raise SystemExit(130)


# Flags people try for the API key; aiq takes keys from the environment only.
_KEY_FLAGS = frozenset({"--api-key", "--key", "--openai-api-key", "--anthropic-api-key"})


def _usage_error(exc: ClickException) -> int:
    """Print a usage error as one ``error: …`` line with where to look; its exit code (2)."""
    if isinstance(exc, NoArgsIsHelpError):  # bare `aiq`: the help is already printed
        return exc.exit_code
    if isinstance(exc, NoSuchOption) and exc.option_name in _KEY_FLAGS:
        message = (
            f"aiq takes no {exc.option_name}: it reads the key from $OPENAI_API_KEY "
            "($ANTHROPIC_API_KEY with --provider anthropic, or the variable the config's "
            "api_key_env names); it never takes a key on the command line, where shell "
            "history and `ps` would show it"
        )
    else:
        message = exc.format_message().rstrip(".")
        message = message[:1].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    hint = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
    print(f"error: {message}{hint}", file=sys.stderr)
    return exc.exit_code
