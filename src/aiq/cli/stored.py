"""``aiq status``, ``aiq errors``, ``aiq show``, ``aiq export`` and ``aiq replay-dead``: what
the store holds, read out or put back in the queue."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .app import guard, load_config, sync
from .options import ConfigOpt, DbOpt, DeadOpt, JsonOpt, OrderOpt, OutOpt, TracebackOpt


def status(
    db: DbOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Where the store stands: counts by state, rate, ETA, tokens, oldest waiting, errors."""

    def body() -> None:
        from .. import report, store_commands

        stats = store_commands.store_status_now(load_config(db, config))
        if as_json:
            print(json.dumps(stats.as_dict()))
        else:
            print("\n".join(report.status_lines(stats)))

    guard(traceback, body)


def errors(
    db: DbOpt = None,
    config: ConfigOpt = None,
    error_type: Annotated[
        str | None, typer.Option("--type", help="Only dead jobs whose last error is TYPE.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", help="Example custom_ids to show per type (default 5).")
    ] = 5,
    as_json: JsonOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Dead jobs by error type: how many, the latest message, example custom_ids."""

    def body() -> None:
        from .. import inspection, store_commands

        cfg = load_config(db, config)
        types = sync(store_commands.dead_errors(cfg, error_type=error_type, limit=limit))
        if as_json:
            print(json.dumps({"dead": sum(t.jobs for t in types),
                              "types": [t.as_dict() for t in types]}))  # fmt: skip
        else:
            print("\n".join(inspection.errors_lines(types)))

    guard(traceback, body)


def show(
    custom_id: Annotated[str, typer.Argument(help="The custom_id of an input line.")],
    db: DbOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """One custom_id's job: state, attempts, every error, timings, request and reply."""

    def body() -> None:
        from .. import inspection, store_commands

        shown = sync(store_commands.show_job(load_config(db, config), custom_id))
        if as_json:
            print(json.dumps({"custom_id": custom_id, "lines": [s.as_dict() for s in shown]}))
        else:
            print("\n".join(inspection.show_lines(shown)))

    guard(traceback, body)


def replay_dead(
    db: DbOpt = None,
    config: ConfigOpt = None,
    error: Annotated[
        str | None, typer.Option("--error", help="Only dead jobs whose last error is TYPE.")
    ] = None,
    ids: Annotated[
        list[str] | None, typer.Option("--id", help="Only this custom_id (repeatable).")
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="FIELD=VALUE: send with this body field changed (VALUE as JSON, else text; "
            "null takes it out); repeatable.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say how many jobs and which fields would change.")
    ] = False,
    traceback: TracebackOpt = False,
) -> None:
    """Move dead jobs back to the queue with attempts reset (then `aiq resume`)."""

    def body() -> None:
        from .. import report_store, store_commands

        replayed = sync(
            store_commands.replay_dead(
                load_config(db, config),
                error_type=error,
                custom_ids=tuple(ids or ()),
                sets=tuple(sets or ()),
                dry_run=dry_run,
            )
        )
        print("\n".join(report_store.replay_lines(replayed)))

    guard(traceback, body)


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
        from .. import report, store_commands

        exports = sync(
            store_commands.export_outputs(load_config(db, config, order=order), out=out, dead=dead)
        )
        for e in exports:
            print("\n".join(report.export_lines(e)))

    guard(traceback, body)
