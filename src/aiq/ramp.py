"""A large token limit ramped up to over a run's first minute.

Anthropic's *acceleration limits* refuse a sharp rise in an organization's usage ("ramp up your
traffic gradually"; docs.anthropic.com/en/api/rate-limits), and name no figure: a limit large
enough to matter starts at a share of its pace and rises to all of it
(:class:`~aiq.split_tokens.SplitTokens` holds one :class:`Ramp` per such budget).
"""

from __future__ import annotations

import math

# A limit this large (tokens per minute) is ramped up to at the start of a run, a smaller one
# used at once: acceleration limits guard against sharp rises in a large organization's usage
# (Anthropic names no figure; Tier 1's 30,000 ITPM / 8,000 OTPM is not one, Tier 2's 450,000
# ITPM is).
RAMP_FROM_PER_MINUTE = 100_000
# The ramp's shape: the pace starts at this share of the limit and rises linearly to all of
# it over RAMP_S seconds from the run's first request (5/8 of a minute's worth in the first
# minute, the whole pace after it).
RAMP_START_SHARE = 0.25
RAMP_S = 60.0


class Ramp:
    """A pace rising from :data:`RAMP_START_SHARE` of a limit to all of it over
    :data:`RAMP_S` seconds from ``started_at``: a virtual clock like the budget's, each booking
    moving it by its cost at the share of the limit its time allows. After the ramp it holds
    nothing back."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self._tat = -math.inf

    def share(self, at: float) -> float:
        """The share of the limit the ramp allows at ``at``."""
        rise = (1.0 - RAMP_START_SHARE) * max(0.0, at - self.started_at) / RAMP_S
        return min(1.0, RAMP_START_SHARE + rise)

    def ready_at(self, at: float) -> float:
        return max(at, self._tat)

    def book(self, at: float, cost: float, per_s: float) -> None:
        """Book ``cost`` at ``at`` against a limit paced at ``per_s`` a second."""
        share = self.share(at)
        if share < 1.0:
            self._tat = max(self._tat, at) + cost / (per_s * share)

    def settle(self, at: float, change: float, per_s: float) -> None:
        """A booking at ``at`` cost ``change`` more (or less) than booked: the pace with it,
        as the budget's (a first estimate of the whole prompt, before replies showed a
        prompt cache, would hold the ramp a long way ahead)."""
        share = self.share(at)
        if share < 1.0:
            self._tat += change / (per_s * share)

    def taken_back(self, now: float) -> None:
        """Every slot booked after ``now`` was taken back: start the pace again from now."""
        self._tat = min(self._tat, now)
