"""The shape of src/aiq's imports: no cycle, layers that point one way, and start-up that
loads only what a command uses (real subprocesses, their ``sys.modules``).

The import graph is read from the source with ast, so it holds every import: at the top of a
module, inside a function (a lazy one) and under ``if TYPE_CHECKING:``. A cycle through any of
them is a cycle in the design, even where Python would not trip over it at run time.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from conftest import aiq_env

import aiq

SRC = Path(aiq.__file__).parent

# The views: they render records, so they import records, never what produces them.
VIEWS = (
    "aiq.progress",
    "aiq.metrics",
    "aiq.report",
    "aiq.report_batches",
    "aiq.report_forecast",
    "aiq.report_store",
)
# Third-party packages of the engine (the store, the HTTP clients): a module importing one is
# below the library's records and above none of the views.
ENGINE_PACKAGES = frozenset({"aiosqlite", "httpx", "aiohttp"})
RENDERERS = frozenset({"rich", "typer", "click"})


@dataclass(frozen=True)
class Edge:
    target: str  # a module of aiq, or the top-level name of any other package
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`: never imported at run time


def module_name(path: Path) -> str:
    parts = ("aiq", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


class _Imports(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool) -> None:
        self.package = name if is_package else name.rpartition(".")[0]
        self.edges: list[Edge] = []
        self._type_only = 0

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        self._type_only += checking
        for child in node.body:
            self.visit(child)
        self._type_only -= checking
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            sub = f"{module}.{alias.name}"
            self._add(sub if sub in modules() else module, node.lineno)

    def _add(self, target: str, line: int) -> None:
        if target.split(".")[0] != "aiq":
            target = target.split(".")[0]
        self.edges.append(Edge(target, line, bool(self._type_only)))


@cache
def graph() -> dict[str, tuple[Edge, ...]]:
    """Each module's imports of aiq modules and of other packages. Importing ``aiq.a.b`` from
    outside the package ``aiq.a`` imports ``aiq.a`` first: that is an edge too."""
    out = {}
    for name, path in modules().items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        edges = list(visitor.edges)
        for e in visitor.edges:
            parent = e.target.rpartition(".")[0]
            if parent not in ("", "aiq") and parent in modules() and not name.startswith(parent):
                edges.append(Edge(parent, e.line, e.type_only))
        out[name] = tuple(edges)
    return out


def find_cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """One cycle of the directed graph ``edges`` (its nodes, the first repeated at the end),
    or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


# The CLI's modules: the package and each module of commands in it.
CLI = frozenset(n for n in modules() if n == "aiq.cli" or n.startswith("aiq.cli."))


def _where(a: str, b: str) -> str:
    line = next(e.line for e in graph()[a] if e.target == b)
    return f"{modules()[a].relative_to(SRC.parent)}:{line}"


def test_find_cycle_finds_one_and_only_one() -> None:
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": ["b"]}) == ["b", "b"]
    assert find_cycle({"x": ["a"], "a": ["b", "d"], "b": ["d"], "d": []}) is None


def test_the_cli_is_a_package_of_command_modules() -> None:
    assert {"aiq.cli", "aiq.cli.app", "aiq.cli.batch", "aiq.cli.entry"} <= CLI


def test_the_graph_holds_lazy_and_type_only_imports() -> None:
    # cli imports the runner inside its commands, and Config only for its annotations:
    # neither may drop out of the graph, or a cycle through them would go unseen.
    cli = {(e.target, e.type_only) for name in CLI for e in graph()[name]}
    assert ("aiq.runner", False) in cli
    assert ("aiq.records", True) in cli
    assert {("typer", False), ("rich", True), ("rich", False)} <= cli


def test_no_import_cycle_in_src() -> None:
    internal = {
        name: [e.target for e in edges if e.target in modules()] for name, edges in graph().items()
    }
    cycle = find_cycle(internal)
    if cycle is not None:
        steps = [f"{a} -> {b} ({_where(a, b)})" for a, b in itertools.pairwise(cycle)]
        pytest.fail("import cycle: " + " · ".join(steps))


def runtime_closure(start: str) -> dict[str, list[str]]:
    """The aiq modules importing ``start`` can load (type-only imports aside), each with the
    chain of imports that reaches it."""
    chains = {start: [start]}
    todo = [start]
    while todo:
        name = todo.pop()
        for e in graph()[name]:
            if not e.type_only and e.target in modules() and e.target not in chains:
                chains[e.target] = [*chains[name], e.target]
                todo.append(e.target)
    return chains


@pytest.mark.parametrize("view", VIEWS)
def test_views_reach_records_not_the_engine(view: str) -> None:
    for name, chain in runtime_closure(view).items():
        engine = ENGINE_PACKAGES & {e.target for e in graph()[name] if not e.type_only}
        assert name not in ("aiq.worker", "aiq.runner", "aiq.store"), " -> ".join(chain)
        assert not engine, f"{' -> '.join(chain)} imports {', '.join(sorted(engine))}"


def test_nothing_below_the_cli_imports_it_or_typer() -> None:
    for name, edges in graph().items():
        if name in CLI or name == "aiq.__main__":
            continue
        for e in edges:
            assert e.target not in CLI, f"{_where(name, e.target)} imports the CLI"
            assert e.target not in ("typer", "click"), f"{_where(name, e.target)}: {e.target}"
            # rich draws the live panel (progress.py) for the CLI, and nothing else.
            if name != "aiq.progress":
                assert e.target != "rich", f"{_where(name, e.target)} imports rich"


def test_readme_names_every_module() -> None:
    """README's "How it is built" is the map a new maintainer reads first: a module it does
    not name is one nobody was told about."""
    readme = (SRC.parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.partition("## How it is built")[2].partition("\n## ")[0]
    unnamed = [
        name
        for name, path in modules().items()
        if path.stem not in ("__init__", "__main__") and f"{path.name}`" not in section
    ]
    assert not unnamed, unnamed


def test_the_lazy_public_names_are_the_type_checked_ones() -> None:
    """``aiq/__init__.py`` names each export twice: in ``_EXPORTS`` (imported on first use)
    and under ``TYPE_CHECKING`` (for mypy and editors). The two must agree."""
    tree = ast.parse((SRC / "__init__.py").read_text(encoding="utf-8"))
    checked = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1
                checked.update({a.name: imp.module for a in imp.names})
    assert checked == aiq._EXPORTS
    assert sorted(aiq.__all__) == sorted([*aiq._EXPORTS, "__version__"])
    for name, module in aiq._EXPORTS.items():
        assert getattr(aiq, name) is getattr(importlib.import_module(f"aiq.{module}"), name)


# -- what a process loads ---------------------------------------------------------------------

_REPORT = (
    "import atexit, json, sys\n"
    "atexit.register(lambda: print('\\nMODULES ' + json.dumps(sorted(sys.modules)), "
    "file=sys.stderr))\n"
)


def loaded(code: str, cwd: Path) -> set[str]:
    """The top-level packages and aiq modules a fresh interpreter holds after ``code``."""
    proc = subprocess.run(
        [sys.executable, "-c", _REPORT + code],
        cwd=cwd, env=aiq_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    line = proc.stderr.rstrip().rpartition("\n")[2]
    assert line.startswith("MODULES "), (proc.returncode, proc.stdout, proc.stderr)
    names = json.loads(line.removeprefix("MODULES "))
    return {n if n.startswith("aiq.") else n.split(".")[0] for n in names}


def test_import_aiq_loads_neither_rich_nor_typer(tmp_path: Path) -> None:
    found = RENDERERS & loaded("import aiq", tmp_path)
    assert not found, sorted(found)
    # Nor does the library when it is used: the runner reports progress through a callback.
    used = loaded("from aiq import JobStore, Worker, run_batch, store_status", tmp_path)
    assert {"aiq.runner", "aiq.worker", "httpx"} <= used
    assert not RENDERERS & used, sorted(RENDERERS & used)


def _cli(*args: str) -> str:
    return f"sys.argv = ['aiq', *{list(args)!r}]\nfrom aiq.cli import main\nmain()\n"


def test_help_loads_no_engine_and_no_config_reader(tmp_path: Path) -> None:
    mods = loaded(_cli("--help"), tmp_path)
    assert "typer" in mods
    unused = {"aiosqlite", "httpx", "aiohttp", "yaml", "aiq.runner", "aiq.store_commands"}
    unused = (unused | {"aiq.store", "rich", "typer.rich_utils"}) & mods  # plain help
    assert not unused, sorted(unused)


def test_status_loads_no_http_client_and_no_renderer(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("")
    subprocess.run(
        [sys.executable, "-m", "aiq", "add", "e.jsonl"],
        cwd=tmp_path, env=aiq_env(), capture_output=True, timeout=60,
    )  # fmt: skip
    assert (tmp_path / ".aiq" / "aiq.db").exists()
    mods = loaded(_cli("status"), tmp_path)
    assert {"aiq.store_commands", "aiq.blocking", "sqlite3"} <= mods  # it did read the store
    # in this thread (aiq.blocking), without an event loop, nor the reader of input lines
    unread = {"asyncio", "aiosqlite", "aiq.inputs", "aiq.batch_wire", "socket", "secrets"}
    assert not unread & mods, sorted(unread & mods)
    engine = {"aiq.runner", "aiq.online_run", "aiq.worker", "aiq.limiter", "aiq.limiters"}
    # nor what other commands read: a run's records, the forecast, the exporter, replay
    engine |= {"aiq.run_records", "aiq.forecast", "aiq.outputs", "aiq.replay", "aiq.inspection"}
    unused = {"httpx", "aiohttp", "yaml", "rich", *engine} & mods
    assert not unused, sorted(unused)
