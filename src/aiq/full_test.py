"""Whether a server that shows no limit is only full: the test of a 429's pause.

LiteLLM's parallel limiter refuses while its count of requests in flight is met, and asks
for its minute's turn (``retry-after: 52.905443``) though a slot frees as soon as any
request ends: a pause for every sender to that turn held a run that takes 4 s for minutes.
So with no limit known, a 429 that names a wait pauses every sender, and once a request
sent before it gets through (a slot is free, if the server refuses only when full) one
request goes through the pause to see. If that one gets through, the server was full, not
out of its window: the pause ends, and its 429s pause no one again (each is its refused
job's alone, retried after its backoff). When the test counts as let in before its reply
comes: :mod:`aiq.pause_test`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .refusal_limit import RefusalLimit
from .slot_waits import SlotWaits


class Ticket(Protocol):
    """What the test reads of a request's :class:`~aiq.limiter.Ticket`."""

    sent_at: float
    full_probe: bool


class FullTest:
    """:class:`~aiq.limiter.RateLimiter`'s test of a 429's pause (its state is set and
    documented in ``RateLimiter.__init__``)."""

    _clock: Callable[[], float]
    _refusal: RefusalLimit
    _slots: SlotWaits
    _paused_until: float
    _full_from: float | None
    _full_pass: bool
    _let_in: Ticket | None

    if TYPE_CHECKING:

        def _headers_rule(self) -> bool: ...

    @property
    def server_full(self) -> bool:
        """Whether the latest 429 (:meth:`~aiq.feedback.Feedback.rate_limited`) was a full
        server's, not a window's: no limit shown or learned, and a request let through an
        earlier 429's pause got through. The 429 is the refused job's alone, retried after
        its backoff."""
        return self._refusal.full and not self._headers_rule()

    @property
    def pause_tested(self) -> bool:
        """Whether the pause of the latest 429 is being tested (:meth:`server_full`): it may
        end before its time, so the refused job is held by it, not by its own wait."""
        return self._full_from is not None

    def let_in(self, ticket: Ticket) -> None:
        """The pause's test request (``ticket``) is out past the time a 429 takes: the server
        let it in (aiq.pause_test), and the pause ends as if its reply had come. If a 429
        comes for it after all, that is undone (:meth:`_let_in_refused`)."""
        if ticket.full_probe and self._full_from is not None:
            self._let_in = ticket
            self._full_test(ticket, self._full_from)

    def _let_in_refused(self) -> None:
        """The pause's test, taken as let in (aiq.pause_test), was refused after all: a slow
        429, not a full server's. Its 429 pauses as a first would."""
        self._let_in = None
        self._refusal.full_known = False

    def _test_pause(self, ticket: Ticket | None, *, exact: bool, now: float) -> None:
        """Whether the pause a 429 brings is tested by one request (:meth:`_tested_by`)."""
        if ticket is not None and ticket.full_probe:
            self._full_from = None  # the test refused: the pause holds
        elif (
            exact
            and self._refusal.probing_full
            and self._full_from is None
            and self._paused_until <= now
        ):
            # One test a pause (a 429 in one, in flight with it, tests nothing new). Only a
            # delay the server named, as LiteLLM's parallel limiter does: behind its router
            # (a bound of 60 s, or no hint) a test left the learned window's row to stand
            # past the pause, and 80 more were refused at the minute's count.
            self._full_from = now

    def _tested_by(self, ticket: Ticket, *, through: bool) -> None:
        """``ticket``'s request was answered (``through``: got through) while a pause may be
        tested: one sent before it got through lets the test go; the test's own decides."""
        if self._full_from is None:
            return
        if through:
            self._full_test(ticket, self._full_from)
        elif ticket.full_probe:
            self._full_from = None  # no answer: the test is off, the pause holds

    def _full_test(self, ticket: Ticket, since: float) -> None:
        """A 429's pause is being tested (paused since ``since``): one sent before it got
        through, so one request goes to see; if that one got through (``full_probe``), the
        server is full, not out of its window: the pause ends, and its 429s pause no one."""
        if ticket.full_probe:
            self._refusal.full_known, self._full_from = True, None
            self._paused_until = -math.inf
            self._slots.wake_all()
        elif ticket.sent_at < since and self._paused_until > self._clock():
            self._full_pass, self._full_from = True, -math.inf  # (one pass per pause)
            self._slots.wake_all()
