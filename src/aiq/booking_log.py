"""One limit's bookings over the last window, in time order, with running sums.

A :class:`~aiq.budget.Budget` asks its log how much is booked in a window, how much is
booked ahead of now (senders hold those slots; no provider's count holds them yet), and
takes back what is ahead when senders are to book again. The sums are kept as bookings come
and go, so asking costs no walk of them: a walk per reply was 6.6% of aiq's CPU at 500
replies a second (bench/README "CPU").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator

# A request sent this recently and not answered may not have reached the provider yet, whatever
# was sent after it: one on a new connection arrives after later ones on open connections.
RECENT_S = 1.0


class Booking:
    """One booking; ``cost`` changes when it is settled or given back. ``mark`` is what the
    log had booked before it, so what was booked after it is ``BookingLog.total - mark``.
    ``open`` until its request is answered (or given back)."""

    __slots__ = ("at", "cost", "mark", "open")

    def __init__(self, at: float, cost: float, mark: float) -> None:
        self.at = at
        self.cost = cost
        self.mark = mark
        self.open = True


class BookingLog:
    """Bookings of the last ``window_s`` (and every one booked ahead of the last ``ahead``
    asked about, whatever its age: a sender holds it, and taken back it must be found)."""

    __slots__ = (
        "_ahead_now", "_ahead_sum", "_entries", "_n_ahead", "_open_sum", "_recent",
        "_recent_horizon", "_window_s", "horizon", "last_at", "sum", "total",
    )  # fmt: skip

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._entries: deque[Booking] = deque()
        self.sum = 0.0  # of the costs in the log
        self.total = 0.0  # of every cost booked: ``Booking.mark`` measures from it
        self.last_at = -math.inf  # bookings are made in time order
        self.horizon = -math.inf  # bookings at or before this have left the log
        # What is booked after ``_ahead_now``: the log's last ``_n_ahead`` entries.
        self._ahead_now = -math.inf
        self._n_ahead = 0
        self._ahead_sum = 0.0
        # The bookings of the last RECENT_S (and ahead), and what of them is still open.
        self._recent: deque[Booking] = deque()
        self._recent_horizon = -math.inf
        self._open_sum = 0.0

    def __iter__(self) -> Iterator[Booking]:
        """Oldest first."""
        return iter(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def last(self) -> Booking:
        return self._entries[-1]

    def add(self, at: float, cost: float) -> Booking:
        """Book ``cost`` at ``at``, no earlier than the last booking."""
        entry = Booking(at, cost, self.total)
        self.total += cost
        self.last_at = at
        log = self._entries
        log.append(entry)
        self.sum += cost
        if at > self._ahead_now:
            self._n_ahead += 1
            self._ahead_sum += cost
        self._recent.append(entry)
        self._open_sum += cost
        # (Not to ``at``: booked ahead, it is no time yet. At most a window's worth is kept.)
        self._expire(max(self._ahead_now, at - self._window_s))
        horizon = at - self._window_s
        # No later booking can fall in a window holding these (unless booked ahead).
        while log[0].at <= horizon and log[0].at <= self._ahead_now:
            gone = log.popleft()
            self.sum -= gone.cost
            self.horizon = gone.at  # (equal times go together)
        return entry

    def holds(self, entry: Booking) -> bool:
        """Whether ``entry`` is still in the log (its cost in the sums)."""
        return entry.at > self.horizon

    def close(self, entry: Booking) -> None:
        """``entry``'s request was answered: the provider has counted it."""
        if entry.open:
            entry.open = False
            if entry.at > self._recent_horizon:
                self._open_sum -= entry.cost

    def open_recent(self, now: float, but: Booking | None = None) -> float:
        """What was booked in the last RECENT_S (or ahead) and is not answered yet, but
        ``but``."""
        self._expire(now)
        own = but.cost if but is not None and but.open and but.at > self._recent_horizon else 0
        return max(0.0, self._open_sum - own)

    def _expire(self, now: float) -> None:
        recent, cut = self._recent, now - RECENT_S
        while recent and recent[0].at <= cut:
            gone = recent.popleft()
            if gone.open:
                self._open_sum -= gone.cost
            self._recent_horizon = gone.at  # (equal times go together)
        if not recent:
            self._open_sum = 0.0  # (no float drift left over)

    def after(self, entry: Booking) -> float:
        """What was booked after ``entry``."""
        return max(0.0, self.total - entry.mark - entry.cost)

    def used(self, now: float) -> float:
        """What is booked in the window ending at ``now`` (bookings after it excluded)."""
        used = self.sum - self.ahead(now)
        for e in self._entries:
            if e.at > now - self._window_s:
                break
            used -= e.cost
        return max(0.0, used)

    def since(self, start: float) -> float:
        """What is booked after ``start``, ahead or not (no side effect on what is ahead)."""
        since = self.sum
        for e in self._entries:
            if e.at > start:
                break
            since -= e.cost
        return max(0.0, since)

    def ahead(self, now: float) -> float:
        """What is booked after ``now``."""
        if now < self._ahead_now:  # (an earlier time: walked)
            ahead = 0.0
            for e in reversed(self._entries):
                if e.at <= now:
                    break
                ahead += e.cost
            return ahead
        self.advance(now)
        return max(0.0, self._ahead_sum)

    def advance(self, now: float) -> None:
        """Bookings up to ``now`` are no longer ahead (and old ones may leave the log: with
        no other time asked about, a server with no headers, it would only grow)."""
        if now <= self._ahead_now:
            return
        self._ahead_now = now
        log = self._entries
        while self._n_ahead and log[-self._n_ahead].at <= now:
            self._ahead_sum -= log[-self._n_ahead].cost
            self._n_ahead -= 1
        if not self._n_ahead:
            self._ahead_sum = 0.0  # (no float drift left over)

    def first_ahead(self, now: float) -> Booking | None:
        """The earliest booking after ``now`` not given back (None: none)."""
        self.advance(now)
        log = self._entries
        for i in range(len(log) - self._n_ahead, len(log)):
            if log[i].cost > 0:
                return log[i]
        return None

    def booked(self, start: float, end: float) -> float:
        """What is booked from ``start`` to ``end`` (given back: none); walked from the
        newest, so a recent span costs only its own entries."""
        total = 0.0
        for e in reversed(self._entries):
            if e.at < start:
                break
            if e.at <= end:
                total += e.cost
        return total

    def adjust(self, entry: Booking, cost: float) -> None:
        """``entry`` really cost ``cost`` (0: given back)."""
        if entry.at > self.horizon:  # still in the log
            self.sum += cost - entry.cost
            if entry.at > self._ahead_now:
                self._ahead_sum += cost - entry.cost
        if entry.open and entry.at > self._recent_horizon:
            self._open_sum += cost - entry.cost
        self.total += cost - entry.cost
        entry.cost = cost

    def take_back(self, now: float) -> float:
        """Take back every booking after ``now``; returns what they cost together."""
        log = self._entries
        self.advance(now)  # (what is after ``now`` is then the ahead entries, if any)
        taken = 0.0
        while log and log[-1].at > now:
            entry = log.pop()
            if self._n_ahead and entry.at > self._ahead_now:
                self._n_ahead -= 1
                self._ahead_sum -= entry.cost
            self.sum -= entry.cost
            self.total -= entry.cost
            taken += entry.cost
            self.close(entry)
            if self._recent and self._recent[-1] is entry:  # (they are the log's last ones)
                self._recent.pop()
            entry.cost = 0.0
        self.last_at = log[-1].at if log else -math.inf
        return taken

    def next_booked(self, now: float) -> float | None:
        """When the earliest booking after ``now`` goes (given back ones are no request)."""
        first = None
        for e in reversed(self._entries):
            if e.at <= now:
                break
            if e.cost > 0:
                first = e.at
        return first
