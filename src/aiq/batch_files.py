"""A batch's requests written from the store to a file, in the provider's format (its
service's ``encode`` and ``frame``: OpenAI's JSONL input file, Anthropic's ``{"requests":
[...]}`` create body), a block of jobs at a time. The line formats themselves are the
providers' (aiq.providers.openai_batches, aiq.providers.anthropic_batches); OpenAI's are
re-exported here, as they were first defined here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .batch_wire import JSONL, Frame, Line
from .providers.base import ProviderError
from .providers.batches import Encode
from .providers.openai_batches import (
    LINE_OVERHEAD,
    MAX_BYTES,
    MAX_REQUESTS,
    custom_id,
    job_id_of,
    openai_line,
    read_line,
)
from .store import JobStore

__all__ = [
    "LINE_OVERHEAD", "MAX_BYTES", "MAX_REQUESTS", "Line", "custom_id", "job_id_of",
    "read_line", "write_input", "write_requests",
]  # fmt: skip


@dataclass(slots=True)
class Written:
    """An input file written: its size, its requests, and the jobs refused (not in it)."""

    size: int = 0
    requests: int = 0
    refused: list[tuple[int, ProviderError]] = field(default_factory=list)


async def write_requests(
    store: JobStore, batch_id: int, path: Path, *, encode: Encode = openai_line,
    frame: Frame = JSONL,
) -> Written:  # fmt: skip
    """Write the batch's requests from the store, a block of jobs at a time, in the order
    its lines are numbered (job id). A job ``encode`` refuses is left out, named in
    ``refused``. Written aside and renamed, so a file at ``path`` is always whole."""
    part = path.with_name(path.name + ".part")
    out = Written()
    with part.open("wb") as f:
        f.write(frame.head)
        async for rows in store.batch_lines(batch_id):
            lines = []
            for i, endpoint, body in rows:
                try:
                    lines.append(encode(i, endpoint, body))
                except ProviderError as err:
                    out.refused.append((i, err))
            if not lines:
                continue
            block = (frame.sep if out.requests else b"") + frame.sep.join(lines)
            f.write(block)
            out.size += len(block)
            out.requests += len(lines)
        f.write(frame.tail)
    out.size += len(frame.head) + len(frame.tail)
    os.replace(part, path)
    return out


async def write_input(store: JobStore, batch_id: int, path: Path) -> int:
    """Write the batch's OpenAI input file from the store; returns its size in bytes."""
    return (await write_requests(store, batch_id, path)).size
