"""What a window that shows only what is left allows, before anything says how long it is.

Azure's docs name only ``x-ratelimit-remaining-requests`` (PROVIDERS.md): no limit, no reset.
Until a 429's exact ``retry-after-ms`` names the window's turn (aiq.implied_limit then makes
it a rate), nothing says what it holds per minute, and the ramp of ``--concurrency auto``
sent into a spent window: a first round of up to 66 429s (bench/README, session 16).

What is left is known all the same, so it caps the requests before any rate is: the last
reply's ``remaining`` less ours sent after the request it answers (a provider counts at
arrival; a reply is a latency old). At none left, one request looks again a second after
that reply (the first one refused names the turn) and the rest wait for its answer. A cap,
never a pace nor a burst: a ``remaining`` with no reset may be a day's count, and taken for
a rate it would flood a server with it.
"""

from __future__ import annotations

import math
from collections import deque

LOOK_S = 1.0  # a spent window is looked at again this long after the reply that showed it


class LeftCap:
    """Our requests against what the latest reply said is left (:meth:`sample`). Each
    request booked names itself (``owner``): the one that books the look holds it."""

    def __init__(self) -> None:
        self.active = False  # a window with only what is left was seen
        self._left = math.inf
        self._answers_from = -math.inf  # when the request the latest sample answers went
        self._seen_at = -math.inf  # when that sample came
        self._since: deque[float] = deque()  # ours sent after that request, when each went
        self._look: object | None = None  # the request booked to look, not yet sent
        self._look_out = False  # a look sent, not yet answered

    def sample(self, remaining: int, sent_at: float, now: float) -> bool:
        """A reply to a request sent at ``sent_at`` says ``remaining`` are left; True if
        requests held should book again (it opened, or a look was answered)."""
        if sent_at < self._answers_from:
            return False  # an older request's reply, come back late: the newer one stands
        self.active = True
        self._answers_from, self._seen_at = sent_at, now
        since = self._since
        while since and since[0] <= sent_at:
            since.popleft()
        shut, looked = self._left <= 0, self._look_out
        self._left = remaining - len(since)
        self._look_out = False
        return shut and (self._left > 0 or looked)

    @property
    def open(self) -> bool:
        """Whether one more may go now without waiting."""
        return self._left > 0

    def ready_at(self, at: float, owner: object | None = None) -> float:
        """The first time from ``at`` one more may go: then, at a spent window a look
        :data:`LOOK_S` after the reply that showed it (booked by ``owner``, if none is), and
        never while another holds the look or it is out."""
        if self._left > 0:
            return at
        if self._look_out:
            return math.inf
        if self._look is None:
            self._look = owner
        if self._look is not owner:
            return math.inf
        return max(at, self._seen_at + LOOK_S)

    def sent(self, at: float, owner: object) -> None:
        """``owner`` goes at ``at`` (the look, if it held it)."""
        if self._look is owner:
            self._look, self._look_out = None, True
        self._since.append(at)
        self._left -= 1

    def release(self, owner: object) -> None:
        """``owner`` was booked and will not go: the look it held is free."""
        if self._look is owner:
            self._look = None

    def unanswered(self) -> None:
        """A request got no answer (a connection lost): a look among them may go again."""
        self._look_out = False
