"""A file into a store: ``--strict``'s refusal, the file's source with its output paths, the
lines enqueued, and a file with no valid line refused, leaving no new store behind."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from . import enqueue
from .config import Config
from .errors import InputError
from .inputs import BadLine
from .outputs import default_outputs
from .records import EnqueueCounts, Source
from .requestfile import read_requests
from .store import JobStore
from .text import plural


async def enqueue_file(
    store: JobStore, config: Config, path: Path, out: str | None, dead: str | None
) -> tuple[Source, EnqueueCounts]:
    """Add ``path``'s lines to ``store`` (idempotent); InputError, and nothing added, for a
    file with no valid line, or with any invalid one under ``--strict``."""
    resolved = path.resolve()
    default_out, default_dead = default_outputs(resolved)
    if config.strict:
        _refuse_any_invalid(resolved, config, path)
    source = await store.add_source(
        str(resolved), out_path=out or default_out, dead_path=dead or default_dead
    )
    counts = await enqueue.add_file(store, source, read_requests(resolved, config.defaults))
    if counts.invalid and not counts.valid:
        shown = "\n".join(f"  {b}" for b in counts.bad_lines[:5])
        raise InputError(
            f"{path}: no valid line in {counts.invalid:,} (first ones below); is it a JSONL "
            f"file of requests, one JSON object per line? Fix it and run again:\n{shown}"
        )
    return source, counts


def _refuse_any_invalid(resolved: Path, config: Config, path: Path) -> None:
    first: list[BadLine] = []  # to show; the rest only counted
    invalid = 0
    for line in read_requests(resolved, config.defaults):
        if isinstance(line, BadLine):
            invalid += 1
            if len(first) < 20:
                first.append(line)
    if invalid:
        listing = "\n".join(f"  {b}" for b in first)
        more = f"\n  … and {invalid - 20:,} more" if invalid > 20 else ""
        raise InputError(
            f"{path}: {plural(invalid, 'invalid line')}; nothing was enqueued (--strict):\n"
            f"{listing}{more}"
        )


@contextlib.contextmanager
def no_store_left_on_bad_input(path: str | os.PathLike[str]) -> Iterator[None]:
    """A command that made a new store and then found no valid line to put in it removes the
    store again: a mistyped or garbage file must not leave one behind to be found later."""
    db = Path(path)
    made_dir = not db.parent.exists()
    made = not db.exists()
    try:
        yield
    except InputError:
        if made:
            for suffix in ("", "-wal", "-shm", ".lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f"{db}{suffix}")
            if made_dir:
                with contextlib.suppress(OSError):
                    db.parent.rmdir()  # only if empty
        raise
