"""The typer app and what every command shares: the config, the error boundary, the loop.

Errors aiq expects (AiqError) are caught once, by ``guard``, and printed as one ``error: …``
line with the exit code they carry; anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from .. import __version__
from ..errors import AiqError

if TYPE_CHECKING:
    from rich.console import Console

    from ..config import Config

# What a command uses and the others do not (the runner with the store and the HTTP clients,
# the checks, the text report, rich's live panel, asyncio) is imported inside it: `aiq --help`
# and `aiq status` then start in half the time (tests/test_layers.py checks what they load).

# Plain help, as click formats it, not typer's rich panels: those import rich's markdown,
# tables and tracebacks (typer.rich_utils), which took 0.13 s of `aiq --help`'s 0.25 s
# (bench/README.md, "Start-up"). No help text here uses rich markup.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run large batches of prompts against LLM APIs: durable, resumable, rate-limited.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},  # as wide as the terminal, to 120 (click: 80)
)
T = TypeVar("T")


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


def guard(show_traceback: bool, fn: Callable[[], T]) -> T:
    """Run a command body: AiqError → one ``error:`` line and its exit code."""
    try:
        return fn()
    except AiqError as exc:
        if show_traceback:
            raise
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None


def sync(work: Coroutine[Any, Any, T]) -> T:
    """Run one of the library's coroutines to its end."""
    import asyncio

    return asyncio.run(work)


def load_config(db: Path | None, config: Path | None, **flags: Any) -> Config:
    """The Config of defaults < config file < env < these flags; says which file it read."""
    from ..config import Config

    cfg = Config.resolve(config_path=config, flags={"db": db, **flags})
    if cfg.config_path is not None:  # ./aiq.yaml is read unasked: say so
        print(f"config: {cfg.config_path}", file=sys.stderr)
    return cfg


def console() -> Console:
    """The terminal, as the live panel draws on it."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)
