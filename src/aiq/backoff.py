"""Retry delays: exponential backoff with full jitter, honouring the server's own delay.

Pure functions; the worker does the sleeping. Full jitter (a uniform draw from zero to the
exponential cap) spreads retries of many workers that failed together, which is what keeps
a struggling server from being hit by synchronised waves (AWS Architecture Blog, "Exponential
Backoff and Jitter").
"""

from __future__ import annotations

import random
from collections.abc import Callable

SPREAD_CAP_S = 0.5  # the most added to a server's own delay (``delay``)


def delay(
    attempt: int,
    *,
    base_s: float = 1.0,
    cap_s: float = 60.0,
    retry_after_s: float | None = None,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry).

    Without a server hint: uniform in [0, min(cap, base * 2**(attempt-1))]. With one, never
    sooner than the server asked, plus up to 10% (at most half a second) so waiting workers
    do not return at once. (Ten percent of a wait to a minute's turn, up to 6 s, kept a job
    refused at LiteLLM's minute that long after the turn let the rest go: the rate limiter
    paces those that come back together.)
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt - 1, 62))
    if retry_after_s is not None:
        return retry_after_s + min(0.1 * retry_after_s, SPREAD_CAP_S) * rand()
    return ceiling * rand()
