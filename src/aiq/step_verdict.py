"""Whether a startup step of aiq.capacity had room: a round's latencies against the bar's.

The round's mean latency over the bar's (every reply in rounds that grew: no queue then), as a
log, is 0 if the server had room for the step and ``full`` if it had none (no more slots than
the last limit that grew, or one fewer than this one). Which of the two the round is nearer
decides; a decision waits until the round is _DOUBT standard errors from the other one, or
has waited long. So a steady server decides at once and a noisy one later.
"""

from __future__ import annotations

import math

from .latency_bar import LatencyBar

# Above a step of two: a round grew if throughput rose by this share of the step or more.
# Three quarters: from 5 to 9 at eight slots, it rises by three quarters of the step.
_GAIN_SHARE = 0.75
_FLAT_REPLIES = 6  # replies at one limit before it may be called flat
# A decision once a round is this many standard errors (the spread of latency times
# root(1/replies + 1/replies in the bar)) from the other answer: at once at a server of steady
# latency, later at a noisy one. After _MOST times the replies a "no" takes, a round nearer
# "grew" grows; after _MOST_FLAT times, one nearer "flat" is flat: a false no at a small limit
# costs a large server minutes, a false yes one step.
_DOUBT = 2
_MOST = 3
_MOST_FLAT = 6


def verdict(
    bar: LatencyBar, replies: int, total: float, square: float, *, best: int, limit: int
) -> bool | None:
    """A round at ``limit`` (``replies`` latencies summing to ``total``, their squares to
    ``square``) after the last limit that grew, ``best``: True if the server had room for the
    step, False if it had none, None while the replies leave it in doubt."""
    ratio = math.log(max(total / replies, 1e-9) / bar.mean)
    full, mid = thresholds(best, limit)
    error = bar.spread(replies, total, square) * math.sqrt(1 / replies + 1 / bar.count)
    enough = max(_FLAT_REPLIES, limit)
    if ratio <= mid:
        if full - ratio < _DOUBT * error and replies < _MOST * enough:
            return None
        return True
    if replies < enough or (ratio < _DOUBT * error and replies < _MOST_FLAT * enough):
        return None
    return False


def thresholds(best: int, limit: int) -> tuple[float, float]:
    """The log latency ratio of a round at a server with no room for the step from ``best``
    to ``limit``, and the line between that and room. A step of one or two has a clear "no
    room" (twice the latency from one to two, 1.5 from two to three, 1.25 from three to five
    at four slots); above, it fades to one, and the line is where throughput rose by
    _GAIN_SHARE of the step (a limit that grew is then at most 7/6 of the server's size)."""
    gained = math.log(limit / (best * (1.0 + _GAIN_SHARE * (limit / best - 1.0))))
    full = max(math.log(limit / max(best, limit - 1)), 2 * gained)
    return full, max(full / 2, gained)
