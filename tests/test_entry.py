"""The console script builds only the command it is asked for (aiq.cli.entry.app_for): the
same help and the same usage errors as the whole app, which anything else gets."""

from __future__ import annotations

import pytest
import typer
from typer.main import get_command_name
from typer.models import CommandInfo
from typer.testing import CliRunner

from aiq.cli import app
from aiq.cli.entry import app_for


def _name(command: CommandInfo) -> str:
    assert command.callback is not None
    return command.name or get_command_name(command.callback.__name__)


NAMES = [_name(c) for c in app.registered_commands]


def _shown(app_: typer.Typer, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app_, list(args), prog_name="aiq", terminal_width=100)
    return result.exit_code, result.output


@pytest.mark.parametrize("name", NAMES)
def test_one_command_alone_shows_what_the_whole_app_shows(name: str) -> None:
    one = app_for([name, "--help"])
    assert [_name(c) for c in one.registered_commands] == [name]
    assert _shown(one, name, "--help") == _shown(app, name, "--help")
    assert _shown(one, name, "--no-such-flag") == _shown(app, name, "--no-such-flag")
    assert _shown(one, name, "--no-such-flag")[0] == 2


@pytest.mark.parametrize(
    "args", [[], ["--help"], ["--version"], ["stat"], ["Status"], ["-q", "status"]]
)
def test_anything_but_a_command_first_gets_the_whole_app(args: list[str]) -> None:
    assert app_for(args) is app
    assert len(app.registered_commands) == len(NAMES) == 12
