"""Shared fixtures: a real fake server on 127.0.0.1 and real `aiq` subprocesses."""

from __future__ import annotations

import compileall
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeserver import FakeServer

API_KEY = "sk-test-0123456789abcdef-secret"


def pytest_configure(config: pytest.Config) -> None:
    # aiq is installed editable, so no byte-code was compiled for it at install (pip compiles
    # a regular install's). Under PYTHONDONTWRITEBYTECODE (as on this VM) each of the suite's
    # hundreds of `aiq` subprocesses would then compile every module again: 0.1-0.3 s each.
    # Compiled once here, in the controller before any xdist worker starts, as pip would.
    if sys.flags.dont_write_bytecode and not hasattr(config, "workerinput"):
        compileall.compile_dir(Path(__file__).parents[1] / "src" / "aiq", quiet=1)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer(require_key=API_KEY) as s:
        yield s


# A developer's own settings must not reach a test: a real key or base URL in the
# environment would send the tests' traffic somewhere other than 127.0.0.1.
_OWN_SETTINGS = ("AIQ_", "OPENAI_", "ANTHROPIC_")


@pytest.fixture(autouse=True)
def _no_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(_OWN_SETTINGS)]:
        monkeypatch.delenv(name)


def aiq_env(**extra: str) -> dict[str, str]:
    """The environment of an aiq subprocess: a test key, no colour, none of the developer's
    AIQ_, OPENAI_ or ANTHROPIC_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_SETTINGS)}
    env.update({"OPENAI_API_KEY": API_KEY, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def aiq_cmd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "aiq", *map(str, args)]


def start_aiq(
    *args: str | Path, cwd: Path, capture: bool = False, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start ``aiq ARGS`` in the background (to signal or kill it mid-run)."""
    stream = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen(
        aiq_cmd(*args), cwd=cwd, env=env or aiq_env(), stdout=stream, stderr=stream, text=True
    )


def run_aiq(
    *args: str | Path, cwd: Path, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``aiq ARGS`` to completion in ``cwd``; returns the completed process."""
    return subprocess.run(
        aiq_cmd(*args),
        cwd=cwd,
        env=env or aiq_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_prompts(path: Path, prompts: list[tuple[str, str]], *, mode: str = "w") -> None:
    """Write prompt lines ``{"custom_id", "prompt"}``."""
    with path.open(mode) as f:
        for custom_id, prompt in prompts:
            f.write(json.dumps({"custom_id": custom_id, "prompt": prompt}) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# The quick loop (`pytest -m "not slow"`) stays quick only while slow tests carry the marker:
# name the unmarked ones that took long, so a new test gets marked when it is written.
_UNMARKED_SLOW_S = 2.0
_unmarked_slow: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    slow = report.when == "call" and report.duration > _UNMARKED_SLOW_S
    if slow and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _unmarked_slow:
        terminalreporter.section(f"over {_UNMARKED_SLOW_S:g} s, not marked slow")
        for nodeid, seconds in sorted(_unmarked_slow, key=lambda x: -x[1]):
            terminalreporter.write_line(f"{seconds:6.2f}s {nodeid}")


def undo_tiers(conn: sqlite3.Connection) -> None:
    """Take a store back to before migration 0011_tiers, as aiq with 0010_batches its last
    left it: no tier anywhere, and 0008_tallies's key and triggers. The next writing
    command applies 0011 again; every job's tier is then unknown."""
    from aiq.database import _statements
    from aiq.migrations import MIGRATIONS

    conn.execute("DROP TRIGGER jobs_tally_update")  # else no column they read can be dropped
    conn.execute("DROP TRIGGER jobs_tally_delete")
    conn.execute("DROP INDEX tallies_key")
    conn.execute("ALTER TABLE tallies RENAME TO tallies_0011")
    conn.execute("ALTER TABLE jobs DROP COLUMN tier")
    made = [s for s in _statements(dict(MIGRATIONS)["0008_tallies"]) if "CREATE T" in s]
    for statement in made:  # its table, then its triggers
        conn.execute(statement)
    conn.execute("CREATE UNIQUE INDEX tallies_key ON tallies (state, ifnull(model, x'00'), "
                 "ifnull(error_type, x'00'))")  # fmt: skip
    figures = [r[1] for r in conn.execute("PRAGMA table_info(tallies)")][3:]
    conn.execute(  # each tier's tallies folded into one, as 0008 kept them
        f"INSERT INTO tallies SELECT state, model, error_type, "
        f"{', '.join(f'sum({f})' for f in figures)} FROM tallies_0011 GROUP BY 1, 2, 3"
    )
    conn.execute("DROP TABLE tallies_0011")
    conn.execute("DELETE FROM migrations WHERE name = '0011_tiers'")


def undo_tallies(conn: sqlite3.Connection) -> None:
    """Take a store back to before migration 0008_tallies, as an older aiq left it (and so
    before 0011_tiers, which changes them): the next writing command applies both again,
    counting every job."""
    undo_tiers(conn)
    conn.execute("DROP TRIGGER jobs_tally_update")  # else no column they read can be dropped
    conn.execute("DROP TRIGGER jobs_tally_delete")
    conn.execute("DROP TABLE tallies")
    conn.execute("DROP INDEX jobs_queued_created")
    conn.execute("DELETE FROM migrations WHERE name = '0008_tallies'")
