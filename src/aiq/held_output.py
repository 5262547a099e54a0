"""What Anthropic holds of its output-token bucket for requests not answered yet.

Anthropic's OTPM is "estimated based on max_tokens at the beginning of each request, and the
estimate is adjusted at the end of the request" (docs.anthropic.com/en/api/rate-limits): a
request arriving takes its whole ``max_tokens``, and gives back what it did not generate with
its reply. aiq books each request at its output estimate (the mean reply), so each one out
holds ``max_tokens - estimate`` more than its booking until its reply. A request arriving
meanwhile needs its own ``max_tokens`` on top of all of that, and with replies seconds late
the requests out are several (2 s replies, a slot a second: a 429 where the bucket held 705
of the 722 a request needed, the other 560 held by the one before it).

:class:`HeldOutput` keeps that extra per booking, and answers what is held when a request
arrives at some time: the extra of every booking made within a reply's latency before then
and not answered yet. Bookings are made in time order, so that is a walk back from the newest
over those within a latency of it: about the requests out, not every booking held.
"""

from __future__ import annotations

from collections import deque

from .booking_log import Booking

# The latency a booking is taken to be out for: the slowest recent reply, eased down by this
# share of the gap to each new one (one quick reply does not make the next requests quick).
_LATENCY_EASE = 0.2


class HeldOutput:
    """The output each booking holds beyond its estimate while out (see the module)."""

    def __init__(self) -> None:
        self._extra: dict[int, tuple[Booking, float]] = {}  # not answered, by id
        self._booked: deque[Booking] = deque()  # the same, oldest first (and some answered)
        self._out: set[int] = set()  # sent, not answered
        self._out_sum = 0.0
        self.latency_s = 0.0

    def booked(self, entry: Booking, extra: float) -> None:
        """``entry`` holds ``extra`` beyond its estimate once sent, until its reply."""
        self._extra[id(entry)] = (entry, extra)
        self._booked.append(entry)

    def extra(self, entry: Booking) -> float:
        """What ``entry`` holds beyond its estimate (0: nothing, or answered)."""
        held = self._extra.get(id(entry))
        return held[1] if held is not None and held[0] is entry else 0.0

    def went(self, entry: Booking) -> None:
        """``entry``'s request was sent."""
        if (extra := self.extra(entry)) and id(entry) not in self._out:
            self._out.add(id(entry))
            self._out_sum += extra

    def ended(self, entry: Booking, now: float | None = None) -> None:
        """``entry``'s request was answered at ``now`` (None: refused, given back, or no
        reply): it holds nothing more."""
        extra = self.extra(entry)
        if not extra:
            return
        del self._extra[id(entry)]
        if id(entry) in self._out:
            self._out.discard(id(entry))
            self._out_sum = self._out_sum - extra if self._out else 0.0  # (no float drift)
        if now is not None and now > entry.at:
            latency_s = now - entry.at
            eased = self.latency_s - _LATENCY_EASE * (self.latency_s - latency_s)
            self.latency_s = max(latency_s, eased)
        booked = self._booked
        while booked and not self.extra(booked[0]):
            booked.popleft()

    def at(self, at: float) -> float:
        """What the bookings before ``at`` hold beyond their estimates when a request
        arrives then: those out, and those booked within a latency before it (sent by then,
        answered after). Walked from the newest: a booking at the end costs a walk over
        those within a latency of it, about the requests out."""
        horizon, held = at - self.latency_s, 0.0
        for entry in reversed(self._booked):
            if entry.at <= horizon:
                break
            if entry.at <= at:
                held += self.extra(entry)
        return max(held, self._out_sum)

    def out_before(self, now: float, but: Booking | None) -> float:
        """What the requests booked by ``now`` and not answered hold, but ``but``'s."""
        held = sum(x for e, x in self._extra.values() if e.at <= now and e is not but)
        return held if held > 0 else 0.0

    @property
    def out(self) -> float:
        """What the requests out now hold."""
        return self._out_sum if self._out_sum > 0 else 0.0

    def taken_back(self, now: float) -> None:
        """Every booking after ``now`` was taken back: none of them will go."""
        booked = self._booked
        while booked and booked[-1].at > now:
            entry = booked.pop()
            if self.extra(entry):
                del self._extra[id(entry)]
