"""What stops a run from outside while it works: SIGINT and SIGTERM, and --max-runtime. Both
engines (aiq.online_run, aiq.batch_run) route them to their own ``stop``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

from .contract import StopReason


@contextlib.contextmanager
def stopped_by(
    stop: Callable[[StopReason], None], *, max_runtime_s: float | None, handle_signals: bool
) -> Iterator[None]:
    """Meanwhile, SIGINT and SIGTERM (with ``handle_signals``) call ``stop("interrupted")``,
    each time one comes, and ``max_runtime_s`` seconds on, ``stop("limit")``; the process's
    own handlers are put back after."""
    loop = asyncio.get_running_loop()
    limit = loop.call_later(max_runtime_s, stop, "limit") if max_runtime_s else None
    # asyncio puts back the defaults, not what was there: keep the CLI's, for the export.
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if handle_signals:
        for sig in previous:
            loop.add_signal_handler(sig, stop, "interrupted")
    try:
        yield
    finally:
        if limit is not None:
            limit.cancel()
        if handle_signals:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                if handler is not None:  # None: not set from Python, nothing to put back
                    signal.signal(sig, handler)
