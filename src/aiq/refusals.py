"""429s in a row with no success between: how hard to back off, and how long it has lasted.

A 429 costs a job no attempt (it is the client's pace, not the job's fault), so a job's own
backoff never grows on it. A provider that refuses everything and names no delay (a model
that always fails behind LiteLLM, a limit nobody reports) would then be asked again about
once a second, forever. The streak is the run's, not a job's: each round of refusals after
the last pause ended doubles the next pause, and a streak longer than ``--max-outage`` ends
the run (issue 13).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RefusalStreak:
    """Consecutive 429s of a run, counted in rounds: refusals of calls sent during one pause
    (they were in flight together) are one round."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.rounds = 0
        self._since: float | None = None
        self._paused_until = -float("inf")

    def refused(self) -> int:
        """A 429 came: the streak's rounds so far, this one's included."""
        now = self._clock()
        if self._since is None:
            self._since = now
        if now >= self._paused_until:
            self.rounds += 1
        return self.rounds

    def pausing(self, seconds: float) -> None:
        """The run pauses ``seconds`` for this round: refusals meanwhile belong to it."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)

    def succeeded(self) -> None:
        """A call got through: the streak is over."""
        self.rounds, self._since, self._paused_until = 0, None, -float("inf")

    def lasted_s(self) -> float:
        """How long every call has been refused (0: not refused now)."""
        return 0.0 if self._since is None else self._clock() - self._since
