"""The ``aiq`` command: parse flags into a Config, call the library, render the result.

One module a group of commands (``batch``: add, run, resume, cancel; ``stored``: status, errors,
show, export, replay-dead; ``checks``: check, prices; ``retain``: prune), over ``app`` (the
typer app, the config, the error boundary), ``options`` and ``display``; ``entry.main`` is the
console script.
"""

from __future__ import annotations

from .app import app
from .batch import add, cancel, resume, run
from .checks import check, prices_command
from .entry import main
from .retain import prune
from .stored import errors, export, replay_dead, show, status

# Registered here, in the order `aiq --help` lists them.
app.command()(add)
app.command()(run)
app.command()(resume)
app.command()(cancel)
app.command()(status)
app.command()(errors)
app.command()(show)
app.command()(check)
app.command("prices")(prices_command)
app.command("replay-dead")(replay_dead)
app.command()(export)
app.command()(prune)

__all__ = ["app", "main"]
