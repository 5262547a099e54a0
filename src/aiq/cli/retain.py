"""``aiq prune``: exported jobs' requests and replies out of the store, and the file shrunk."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import UsageError
from .app import guard, load_config, sync
from .options import ConfigOpt, DbOpt, TracebackOpt, WaitOpt

DoneOlderOpt = Annotated[
    str,
    typer.Option(
        "--done-older-than",
        help="Prune done jobs finished longer ago than this: 30d, 12h, 90m, 2w.",
    ),
]
DeadOlderOpt = Annotated[
    str | None,
    typer.Option("--dead-older-than", help="Prune dead jobs too, failed longer ago than this."),
]
KeepResultsOpt = Annotated[
    bool,
    typer.Option(
        "--keep-results",
        help="Keep the replies (and dead letters) in the store; prune only the requests.",
    ),
]
ForgetOpt = Annotated[
    bool,
    typer.Option(
        "--forget",
        help="Delete the jobs whole, keys too: a re-run of their lines sends them again.",
    ),
]


def prune(
    done_older_than: DoneOlderOpt,
    dead_older_than: DeadOlderOpt = None,
    keep_results: KeepResultsOpt = False,
    forget: ForgetOpt = False,
    wait: WaitOpt = 0.0,
    db: DbOpt = None,
    config: ConfigOpt = None,
    traceback: TracebackOpt = False,
) -> None:
    """Remove exported jobs' requests and replies from the store, then shrink its file.

    Only jobs a run has exported since they finished are pruned; their lines stay in the files.
    """

    def body() -> None:
        from .. import report_store, store_commands
        from ..durations import parse_age

        if not wait >= 0:  # NaN too
            raise UsageError(f"--wait {wait:g}: give the seconds to wait for the store, 0 or more")
        try:
            done_s = parse_age(done_older_than)
            dead_s = None if dead_older_than is None else parse_age(dead_older_than)
        except ValueError as exc:
            raise UsageError(f"{exc} (--done-older-than, --dead-older-than)") from None
        pruned = sync(
            store_commands.prune_store(
                load_config(db, config), done_older_than_s=done_s, dead_older_than_s=dead_s,
                keep_results=keep_results, forget=forget, lock_wait_s=wait,
            )
        )  # fmt: skip
        print("\n".join(report_store.prune_lines(pruned)))

    guard(traceback, body)
