"""How long `aiq --help` and `aiq status` (on an empty store) take to start, and what typer
and rich alone cost: the floor under any command.

    .venv/bin/python bench/startup.py [--runs 21] [--src OTHER/src]

Each case runs ``--runs`` times in a fresh interpreter from a temporary directory holding an
empty store; it prints the least and the median wall time and CPU time (user + system) of the
child. The least is the figure to compare: on a shared VM the others measure the neighbours.
With ``--src``, the aiq cases run again with that source tree first on the path (the same
venv), e.g. a ``git archive`` of an older commit, for a before/after on one machine and load;
``--interleave`` then runs the two trees' cases in turn (this, other, this, ...), so that a
neighbour's load falls on both alike.

Byte-code is compiled first for each tree, as pip does on install: an interpreter run with
PYTHONDONTWRITEBYTECODE (as this VM's is) would otherwise compile every module every time.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
AIQ = {"aiq --help": ["-m", "aiq", "--help"], "aiq status": ["-m", "aiq", "status"],
       "import aiq": ["-c", "import aiq"]}  # fmt: skip
FLOORS = {
    "python -c pass": ["-c", "pass"],
    "import typer": ["-c", "import typer"],
    "import typer, rich.console": ["-c", "import typer, rich.console"],
    "import typer.rich_utils": ["-c", "import typer.rich_utils"],  # what rich --help loads
    "import asyncio, sqlite3": ["-c", "import asyncio, sqlite3"],  # what status loads
    "import aiosqlite": ["-c", "import aiosqlite"],
}


def measure(args: list[str], cwd: str, src: Path, runs: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = once(args, cwd, src)
        walls.append(wall)
        cpus.append(cpu)
    return walls, cpus


def once(args: list[str], cwd: str, src: Path) -> tuple[float, float]:
    """One run's wall time and CPU time (user + system of the child)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=cwd, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def interleaved(
    args: list[str], cwd: str, srcs: list[Path], runs: int
) -> list[tuple[list[float], list[float]]]:
    """``measure`` for each tree, their runs in turn."""
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in srcs]
    for _ in range(runs):
        for (walls, cpus), src in zip(out, srcs, strict=True):
            wall, cpu = once(args, cwd, src)
            walls.append(wall)
            cpus.append(cpu)
    return out


def row(name: str, tree: str, walls: list[float], cpus: list[float]) -> None:
    print(f"{name:28s} {tree:5s}  wall min {min(walls):.3f} median "
          f"{statistics.median(walls):.3f}  cpu min {min(cpus):.3f} median "
          f"{statistics.median(cpus):.3f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--src", type=Path, help="another source tree to compare with")
    parser.add_argument(
        "--interleave", action="store_true", help="with --src: the two trees' runs in turn"
    )
    opts = parser.parse_args()
    trees = [("this", SRC)] + ([("other", opts.src)] if opts.src else [])
    for _, src in trees:
        compileall.compile_dir(str(src), quiet=1)
    with tempfile.TemporaryDirectory() as cwd:
        Path(cwd, "e.jsonl").write_text("")
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        subprocess.run(
            [sys.executable, "-m", "aiq", "add", "e.jsonl"], cwd=cwd, env=env, capture_output=True
        )  # fmt: skip  (exit 7: an empty file, an empty store)
        for name, args in FLOORS.items():
            row(name, "", *measure(args, cwd, SRC, opts.runs))
        for name, args in AIQ.items():
            if opts.interleave and opts.src:
                results = interleaved(args, cwd, [src for _, src in trees], opts.runs)
                for (tree, _), (walls, cpus) in zip(trees, results, strict=True):
                    row(name, tree, walls, cpus)
                continue
            for tree, src in trees:
                row(name, tree, *measure(args, cwd, src, opts.runs))


if __name__ == "__main__":
    main()
