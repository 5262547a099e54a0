"""Whether 429s show a limit, for a server that reports none: a row of them that stood.

A 429 now and then is a busy server's (the simulated provider's 5%), not a window's count, and
the next request sent gets through. A window's count refuses everything sent after its first
429 until it turns. So a row of :data:`IN_A_ROW` 429s, none of the requests sent after the
first of them through, shows a limit; and since a 429 comes back sooner than a reply, only
once the row has stood as long as the slowest recent reply (those sent after its first may
yet get through: a busy server's few at random, with hundreds in flight). aiq.refusal_limit
learns the limit from it.
"""

from __future__ import annotations

import math
from collections import deque

# 429s in a row that show a limit: no request sent after the first of them got through (one
# sent before it may still come back: it was counted before the limit was met). Five in a row
# of a random 5%: one in three million requests.
IN_A_ROW = 5
_LATENCIES = 32  # successes whose latencies say how long a row of 429s must stand


class RefusalRow:
    """The 429s since a request sent after the first of them got through."""

    __slots__ = ("_latencies", "count", "from_at", "latest_through", "pending")

    def __init__(self) -> None:
        self.count = 0  # 429s in the row
        self.from_at = -math.inf  # when the first of them was sent
        self.latest_through = -math.inf  # the send time of the latest sent that got through
        self._latencies: deque[float] = deque(maxlen=_LATENCIES)  # the latest successes'
        # A row long enough that has not stood yet: (when its last 429 came, the window end
        # it named, exact, bound), for aiq.refusal_limit to learn from once it has.
        self.pending: tuple[float, float, bool, bool] | None = None

    def through(self, sent_at: float, now: float) -> None:
        """A request sent at ``sent_at`` got through at ``now``: a row it was sent in ends."""
        if sent_at >= self.from_at:
            self.count, self.pending = 0, None
        self.latest_through = max(self.latest_through, sent_at)
        self._latencies.append(now - sent_at)

    def refused(self, sent_at: float) -> None:
        """One more 429 in the row, to a request sent at ``sent_at``."""
        if self.count and sent_at < self.from_at:
            # The row began before its first answer said; one sent since that got through
            # breaks it (a busy server's few at random, answered out of order).
            self.from_at = sent_at
            if self.latest_through >= sent_at:
                self.count = 0
        if not self.count:
            self.from_at = sent_at
        self.count += 1

    @property
    def long(self) -> bool:
        """Whether the row is long enough to show a limit."""
        return self.count >= IN_A_ROW

    def stood(self, now: float) -> bool:
        """Whether the row has stood as long as the slowest recent reply took: any request
        sent after its first that the server took would be back by now."""
        return now - self.from_at >= max(self._latencies, default=0.0)
