"""The ``aiq`` command: parse flags into a Config, call the library, render the result.

One module a group of commands (``batch``: add, run, resume, cancel; ``stored``: status, errors,
show, export, replay-dead; ``checks``: check, prices; ``retain``: prune), over ``app`` (the
typer app, the config, the error boundary), ``options`` and ``display``; ``entry.main`` is the
console script.
"""

from __future__ import annotations

from collections.abc import Callable

from .app import app
from .batch import add, cancel, resume, run
from .checks import check, prices_command
from .entry import main
from .retain import prune
from .stored import errors, export, replay_dead, show, status


def _command(fn: Callable[..., None], name: str | None = None) -> None:
    # Plain help (app.py) cuts a summary in the list of commands at ~45 characters, unless
    # the command names its short help: the whole first line of its docstring, then.
    summary = (fn.__doc__ or "").strip().splitlines()[0]
    app.command(name, short_help=summary)(fn)


# Registered here, in the order `aiq --help` lists them.
_command(add)
_command(run)
_command(resume)
_command(cancel)
_command(status)
_command(errors)
_command(show)
_command(check)
_command(prices_command, "prices")
_command(replay_dead, "replay-dead")
_command(export)
_command(prune)

__all__ = ["app", "main"]
