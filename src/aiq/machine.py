"""What the machine allows a run: open files and memory bound the requests in flight.

Each request in flight holds a connection, and each connection an open file. The soft limit on
open files is often 1,024 where the hard limit, up to which a process may raise its own soft
limit, is far higher (Linux: often 524,288 or more; macOS: unlimited, but the kernel refuses
more than ``OPEN_MAX``). A run raises it at start (:func:`raise_open_files_limit`), and
:func:`concurrency_bound` sizes the connection pool to what it then allows, less what the store,
the input and output files and the event loop need; memory bounds it too, and
``max_concurrency``, if set.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

# Files kept open besides connections: the store (its file, -wal, -shm, the lock), the input,
# results, dead-letter, log and metrics files, stdio, the event loop's own, a resolver's.
RESERVED_FILES = 64
# Memory a request in flight costs aiq (its sender task, connection, buffers, request and reply
# objects): bench/README.md ("Concurrency") measured ~35 KiB with short prompts and replies;
# this leaves room for long ones.
BYTES_PER_REQUEST = 256 * 1024
MEMORY_SHARE = 0.25  # of the machine's memory, at most, for requests in flight
_OPEN_MAX = 10_240  # macOS refuses a soft limit above this (its hard limit says unlimited)


@dataclass(frozen=True, slots=True)
class Bound:
    """The most requests a run may have in flight, and what sets that ("max_concurrency 256",
    "the open-files limit (1,024; ...)"), to say when it holds the run back."""

    senders: int
    reason: str


def raise_open_files_limit() -> int | None:
    """Raise the soft limit on open files to the hard limit; return the soft limit now (None if
    there is none, or the platform has no such limit)."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    for target in (hard, min(hard, _OPEN_MAX) if hard != infinite else _OPEN_MAX):
        if soft != infinite and (target == infinite or target > soft):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (ValueError, OSError):
                continue  # macOS, for an unlimited hard limit; then try OPEN_MAX
            soft = target
            break
    return None if soft == infinite else soft


def memory_bytes() -> int | None:
    """The machine's physical memory (None if the platform will not say)."""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def concurrency_bound(
    max_concurrency: int | None, *, open_files: int | None, memory: int | None
) -> Bound:
    """The most requests in flight: ``max_concurrency`` if set and the machine allows it,
    else what ``open_files`` (the soft limit) and ``memory`` (bytes) allow."""
    bounds = []
    if max_concurrency is not None:  # first: on a tie, the user's setting is what to name
        bounds.append(Bound(max_concurrency, f"max_concurrency {max_concurrency:,}"))
    if open_files is not None:
        bounds.append(
            Bound(
                max(1, open_files - RESERVED_FILES),
                f"the open-files limit ({open_files:,}; raise the hard limit, ulimit -Hn)",
            )
        )
    if memory:
        bounds.append(
            Bound(
                max(1, int(memory * MEMORY_SHARE / BYTES_PER_REQUEST)),
                f"memory ({memory / 2**30:.1f} GiB)",
            )
        )
    if not bounds:  # no limit known at all: what the memory of a small machine would allow
        return Bound(4096, "aiq's default bound of 4,096 requests in flight")
    return min(bounds, key=lambda b: b.senders)


def run_bound(max_concurrency: int | None) -> Bound:
    """The bound for a run in this process: the soft open-files limit raised to the hard one,
    then :func:`concurrency_bound` of it and the machine's memory."""
    return concurrency_bound(
        max_concurrency, open_files=raise_open_files_limit(), memory=memory_bytes()
    )
