"""Startup's bar (aiq.capacity): the latencies a server showed without a queue.

Every reply in a startup round that grew (the server had room for its step) is one more
sample of the latency with no queue. Pooled, their mean is what the next round's is set
against, and their spread says how far apart the two may be by chance alone.
"""

from __future__ import annotations

import math

# The spread of latency guessed before replies show it, and as many replies' weight in it:
# three replies that happen to agree are no proof of steady latency.
_NOISE = 0.3
_NOISE_WEIGHT = 3
_STEADY = 0.05  # a bar whose latencies vary by less than this (one in twenty) is steady...
# ...once it holds this many: of six at a spread of 0.3, the chance that they vary by under
# 0.05 is about three in ten thousand.
_STEADY_REPLIES = 6


def relative_variance(n: int, total: float, square: float) -> float:
    """The variance of ``n`` latencies over their mean squared, from their sum and squares."""
    mean = total / n
    return max(0.0, square / n - mean * mean) / (mean * mean)


class LatencyBar:
    """Latencies without a queue, pooled: their count, sum and sum of squares."""

    __slots__ = ("count", "square", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.square = 0.0

    def pool(self, total: float, square: float, replies: int) -> None:
        """``replies`` more, summing to ``total`` (their squares to ``square``)."""
        self.total += total
        self.square += square
        self.count += replies

    @property
    def mean(self) -> float:
        return self.total / self.count

    def spread(self, replies: int = 0, total: float = 0.0, square: float = 0.0) -> float:
        """The coefficient of variation of latency without a queue: of the bar's replies (and
        before there are three, the round's given too), drawn towards a guess while few."""
        n, total_, square_ = self.count, self.total, self.square
        if n < 3:
            n, total_, square_ = n + replies, total_ + total, square_ + square
        if n < 2:
            return _NOISE
        variance = relative_variance(n, total_, square_)
        return math.sqrt((n * variance + _NOISE_WEIGHT * _NOISE**2) / (n + _NOISE_WEIGHT))

    def steady(self) -> bool:
        """Whether the bar's latencies vary by less than _STEADY, by their own spread: the
        guess ``spread`` draws towards kept a server steady to the millisecond above it until
        a hundred replies, and the bar went back for more at every steady server."""
        if self.count < _STEADY_REPLIES:
            return False
        return relative_variance(self.count, self.total, self.square) < _STEADY**2
