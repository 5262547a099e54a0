"""What `--help` and a mistyped command line show (real `aiq` subprocesses)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import aiq_env, run_aiq

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

BOX = re.compile("[╭╮╰╯│─]")
# one of each kind of option: flags and a FILE (run), a repeatable --id (replay-dead), --json
COMMANDS = ["run", "replay-dead", "status", "prices"]


def aiq(*args: str, cwd: Path) -> tuple[int, str, str]:
    proc = run_aiq(*args, cwd=cwd, env=aiq_env(COLUMNS="100"))
    return proc.returncode, proc.stdout, proc.stderr


def test_the_command_list_shows_every_summary_whole(tmp_path: Path) -> None:
    # plain help (click's) cuts a summary at ~45 characters with "..." unless it is given whole
    from aiq.cli import app

    code, out, _ = aiq("--help", cwd=tmp_path)
    assert code == 0 and not BOX.search(out), out
    listed = " ".join(out.split("Commands:")[1].split())
    for command in app.registered_commands:
        assert command.callback is not None
        summary = (command.callback.__doc__ or "").strip().splitlines()[0]
        assert f"{command.name or command.callback.__name__} {summary}" in listed, summary
    assert "..." not in listed


def test_run_help_shows_flags_as_flags_and_the_file_argument(tmp_path: Path) -> None:
    code, out, _ = aiq("run", "--help", cwd=tmp_path)
    assert code == 0
    assert re.search(r"Usage: .* run \[OPTIONS\] FILE\s*$", out, re.MULTILINE), out
    for flag in ("--strict", "--json", "--quiet", "--dry-run", "--traceback"):
        (line,) = [ln for ln in out.splitlines() if re.search(rf"\s{flag}\s", ln)]
        # a flag's row: its name, then straight to its help text; no value to give
        assert re.search(rf"{flag}\s+(-q\s+)?[A-Z]", line), line
    assert re.search(r"--wait\s+FLOAT", out) and re.search(r"--db\s+PATH", out)


@pytest.mark.parametrize("command", COMMANDS)
def test_no_help_shows_a_type_in_angle_brackets(tmp_path: Path, command: str) -> None:
    # typer 0.29 prints `<bool>` after every flag, `<list[str]>` after --id: see pyproject.toml
    code, out, _ = aiq(command, "--help", cwd=tmp_path)
    assert code == 0
    assert not re.search(r"<(bool|str|int|float|path|list\[str\])>", out), out
    (usage,) = [line for line in out.splitlines() if "Usage:" in line]
    assert "{" not in usage, usage  # typer 0.27 on: `{file}`


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "--bogus", "p.jsonl"], "no such option: --bogus"),
        (["run", "p.jsonl", "--strict", "true"], "unexpected extra argument"),
        (["run"], "missing argument 'FILE'"),
        (["status", "--rpm", "fast"], "no such option: --rpm"),
        (["nosuch"], "no such command 'nosuch'"),
    ],
)
def test_usage_errors_are_one_error_line_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    code, out, err = aiq(*args, cwd=tmp_path)
    assert code == 2, (out, err)
    assert not BOX.search(err), err
    (line,) = err.splitlines()
    assert line.startswith("error: ") and says in line, line
    command = "aiq" if args[0] == "nosuch" else f"aiq {args[0]}"
    assert line.endswith(f"see `{command} --help`"), line
    assert not (tmp_path / ".aiq").exists()  # nothing ran


@pytest.mark.parametrize("args", [["--api-key", "SECRET"], ["--key=SECRET"]])
def test_a_key_flag_says_where_the_key_comes_from(tmp_path: Path, args: list[str]) -> None:
    secret = "sk-do-not-echo-0123456789"
    flag = args[0].split("=")[0]
    code, out, err = aiq(
        "run", "p.jsonl", *[a.replace("SECRET", secret) for a in args], cwd=tmp_path
    )
    assert code == 2
    assert err.startswith(f"error: aiq takes no {flag}: it reads the key from $OPENAI_API_KEY")
    assert "never takes a key on the command line" in err and "api_key_env" in err
    assert secret not in out + err


@pytest.mark.parametrize(("command", "wait"), [("run", "-1"), ("resume", "nan")])
def test_a_negative_wait_is_refused(tmp_path: Path, command: str, wait: str) -> None:
    args = [command, "p.jsonl"] if command == "run" else [command]
    code, _, err = aiq(*args, "--wait", wait, "--provider", "simulated", cwd=tmp_path)
    assert code == 2
    assert err.startswith("error: --wait "), err
    assert "0 or more" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / ".aiq").exists()


def test_bare_aiq_prints_the_help(tmp_path: Path) -> None:
    code, out, err = aiq(cwd=tmp_path)
    assert code == 2 and "Usage: " in out + err and "error:" not in err
    assert "Commands:" in out and "replay-dead" in out
