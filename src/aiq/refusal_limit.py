"""A request limit learned from 429s, for a server that reports none.

Most gateways and self-hosted servers send no rate-limit headers (PROVIDERS.md): the first
429 is all a client learns. What got through before five 429s in a row (aiq.refusal_row: when
a row shows a limit) is the server's limit (less any other client's share), and its window is
the one the 429 names. So from then on aiq sends that many per window, each window's at its
start, and none over: a fixed window's count is met with no further 429.

- **A ``retry-after``** says when the window turns (LiteLLM's parallel limiter: the seconds
  to the next minute); the next window's count goes then.
- **No hint, or only a bound** (LiteLLM's router: ``llm_provider-retry-after: 60``, though
  it counts calendar minutes): the window is taken to turn at the clock's next minute, but
  that is a guess (the server's clock, or its count, may differ), so one request goes alone
  first, and the window's count only once one got through. With no hint it goes a second
  after the 429, then two, four... seconds after each refused one, up to the guessed turn
  (a server that refills sooner is found soon); after a router's bound, at the guessed turn
  (its minutes are the clock's), then two, four... seconds on if it was wrong. No window's
  count is sent into a window that has not turned.
- **A 429 in a window kept under the count**: the server does not count fixed windows (a
  sliding minute, a bucket, another client's share). From then on the run is paced at what
  got through in the last minute, lowered at every further refusal.
- **A full server** (LiteLLM's ``max_parallel_requests``: refused while its count of
  requests in flight is met, the same ``retry-after`` to the minute) takes a request sent
  during a 429's pause as soon as another ends (aiq.limiter's test of the pause): then
  ``full_known``, and its 429s teach no window (as it fills, a row of them forms).
"""

from __future__ import annotations

import math
from collections import deque

from .booking_log import Booking
from .budget import Budget
from .refusal_row import RefusalRow

SPAN_S = 60.0  # servers that report nothing still count per minute (LiteLLM's rpm)
# Senders held while a probe is out look again this often (its answer wakes them sooner).
PROBE_WAIT_S = 5.0
# Paced (no fixed windows), the pace is raised by a fifth after this long with no 429 while
# it holds the run back: a bucket refills faster than a burst into it showed.
RAISE_EVERY_S = 10.0
# How late a window's turn may be taken (a guess's margin, a retry-after in whole seconds).
LATE_S = 1.0
# A window guessed at is tried this long after the 429 before its guessed turn: a server
# whose minute is not the clock's, or that refills sooner, is found then.
CHECK_S = 1.0


class RefusalLimit:
    """Requests per window, learned from what got through before a 429."""

    def __init__(self, *, headroom: float) -> None:
        self._headroom = headroom
        self._through: deque[float] = deque()  # send times of requests that got through
        self.limit: float | None = None  # per window; None until a 429 teaches one
        self._learned = (-math.inf, -math.inf)  # the window it was learned from: [start, end)
        self._refused_from = -math.inf  # when the first 429 it was learned from went
        # Requests out that were sent with nothing booked here (``went``): one sent into the
        # next window before the 429s taught a limit counts in it once one is learned.
        self._out: set[Booking] = set()
        # Windows are [phase + k * SPAN_S, phase + (k + 1) * SPAN_S); what is booked in each
        # (bookings given back leave any window, so senders booked again fill it again).
        self._phase = 0.0
        self._booked: dict[int, float] = {}
        self._era = 0
        self._confirmed = True  # windows after the learned one start where it ended
        self._probe_at = math.inf  # not confirmed: when one request may go alone
        self._probe: Booking | None = None  # the probe out, if one is
        self._probes = 0  # refused since the 429 that began guessing
        self.paced: Budget | None = None  # a server whose windows are not fixed: the pace
        self._raised_at = -math.inf  # paced: the last 429 or raise
        self._row = RefusalRow()  # the 429s in a row, and whether they show a limit yet
        self.full_known = False  # its 429s say it is full (a parallel limit): see ``full``

    @property
    def pending(self) -> tuple[float, float, bool, bool] | None:
        """A row of 429s long enough that has not stood yet (:meth:`confirm`)."""
        return self._row.pending

    @property
    def per_minute(self) -> float | None:
        """The limit in force, per minute (None: none learned)."""
        if self.paced is not None:
            return self.paced.per_minute
        return None if self.limit is None else self.limit * 60.0 / SPAN_S

    def _index(self, at: float) -> int:
        # (A hair over: a window's start, ``phase + k * SPAN_S``, must fall in window k, not
        # a float rounding short of it in k - 1.)
        return math.floor((at - self._phase) / SPAN_S + 1e-9)

    def _start_windows(self, end: float, booked: float) -> None:
        """Windows from one ending at ``end``, which holds ``booked``."""
        self._phase = end
        self._booked = {-1: booked}
        self._era += 1  # bookings made before count in none of these

    def went(self, at: float) -> Booking:
        """A request sent at ``at`` with nothing booked here (no limit learned yet): its
        entry, to hand back to :meth:`got_through` or :meth:`forget`."""
        entry = Booking(at, 1.0, _SENT)
        self._out.add(entry)
        return entry

    def got_through(self, sent_at: float, now: float, booking: Booking | None = None) -> bool:
        """A request sent at ``sent_at`` got through (``booking``: its, if it was booked
        here). True if it was a probe: the window has turned, and the senders held for it
        may go.

        One sent in the window the limit was learned from was still in flight at its 429,
        so the window allows it too; one sent unbooked after it counts where it went."""
        if booking is not None and booking.mark == _SENT:
            self._out.discard(booking)
        self._row.through(sent_at, now)
        through = self._through
        through.append(sent_at)
        while through[0] < now - 2 * SPAN_S:  # (answers come back nearly in send order)
            through.popleft()
        if self.paced is not None:
            self._raise(now)
            return False
        if self.limit is None:
            if self._confirmed or sent_at < self._probe_at:
                return False
            self._confirmed, self._probe, self._probe_at = True, None, math.inf
            return True  # a look got through: that 429 was no window's (all may go)
        if not self._confirmed and sent_at >= self._probe_at:
            # The probe's window began by the time it went: the next begins a minute later.
            self._confirmed, self._probe, self._probe_at = True, None, math.inf
            self._learned = (self._learned[0], min(self._learned[1], sent_at))
            self._start_windows(sent_at + SPAN_S, 1.0)
            return True
        start, end = self._learned
        if booking is not None and booking.mark == _WINDOW - self._era:
            return False  # booked in the windows (or counted there as they began)
        if sent_at < start:
            return False
        if sent_at < end and sent_at <= self._refused_from:
            self.limit += 1  # in flight at the 429s, in their window: it allowed one more
        elif sent_at < end:
            # Sent after one the window refused, yet through: the window had turned when it
            # went (a 429 answered after its turn named one a reply late), so the windows
            # start no later than that, and what went since counts in them.
            self._learned, self._phase = (start, sent_at), sent_at
            self._count_out(sent_at)
        k = self._index(sent_at)
        self._booked[k] = self._booked.get(k, 0.0) + 1
        return False

    def refused(
        self,
        now: float,
        window_end: float,
        *,
        exact: bool,
        bound: bool = False,
        sent_at: float | None = None,
        met: bool | None = None,
    ) -> None:
        """A 429 at ``now`` to a request sent at ``sent_at`` (None: now), from a window that
        turns at ``window_end``: as the server said (``exact``), or as guessed, from a bound
        a router gave (``bound``: LiteLLM's, whose windows are the clock's minutes) or none.

        Told the limit, ``met`` says whether about that many went before it in the window
        (:meth:`window_start`): then the window is the minute the user meant, and it is
        learned at once; if not, it is another window (per-second enforcement), and the
        configured pace is kept. Not told (None): five in a row teach one."""
        if self.full_known:
            return  # a full server's 429: no window to learn (a row forms as it fills)
        start = now if sent_at is None else sent_at
        row = self._row
        row.refused(start)
        told = met is not None
        if self.limit is None and not told and not exact:
            self._look(now, start, window_end)
        if self.limit is None and not met and (told or not row.long):
            return  # not yet a limit's, or not the configured one's window
        if self.limit is None and not met and not row.stood(now):
            row.pending = (now, window_end, exact, bound)  # (to learn from once it has)
            return
        if self.paced is not None:
            self._lower(now)
        elif self.limit is not None and not self._confirmed and now >= self._probe_at:
            self._probe_refused(now, window_end)
        elif self.limit is not None and start < self._learned[1]:
            # Another of the round that taught the limit (in flight together), or one sent
            # a hair before the turn it named (its 429 comes after it).
            pass
        elif self.limit is not None and self._confirmed:
            self._refused_after_turn(now)
        else:
            self._learn(now, window_end, exact=exact, bound=bound)

    def _look(self, now: float, sent_at: float, window_end: float) -> None:
        """A 429 naming no turn, with no limit known: too few yet to tell a window's from a
        busy server's, so as its pause ends one request looks first and the rest wait for
        its answer (they all went together into a spent minute: 98 429s for 400 jobs). The
        look refused, the next goes two, four... seconds after; through, the rest go."""
        if self._confirmed:
            self._confirmed, self._probe, self._probes = False, None, 0
            # As the 429's own pause ends, whatever it is; any sent by now is no look.
            self._probe_at = math.nextafter(now, math.inf)
        elif sent_at >= self._probe_at:
            self._probe_refused(now, window_end)

    @property
    def books(self) -> bool:
        """Whether requests are booked here (:meth:`ready_at`): a limit learned, or a look
        out after a 429 before any was."""
        return self.limit is not None or not self._confirmed

    def confirm(self, now: float) -> bool:
        """A row of 429s put off (:attr:`pending`) that has stood a latency with none of the
        requests sent after its first getting through is a limit: learned as its last 429
        would have taught it, from the window that 429 named. True if it was."""
        row = self._row
        if row.pending is None or not row.stood(now):
            return False
        (at, window_end, exact, bound), row.pending = row.pending, None
        self._learn(at, window_end, exact=exact, bound=bound)
        return self.limit is not None

    def _probe_refused(self, now: float, window_end: float) -> None:
        """The probe refused: the next twice as long after, or at the guessed turn, or past
        that, at the next guess."""
        self._probes += 1
        turn = self._learned[1] if now < self._learned[1] else window_end
        self._probe = None
        self._probe_at = min(turn, now + CHECK_S * 2**self._probes)

    def _refused_after_turn(self, now: float) -> None:
        """Refused in a window whose turn is known. Kept under what the last one allowed:
        not fixed windows (the refused request's booking is given back already: one under
        is the count met, a little too high); nor if the count halved. Else the count is
        what got through."""
        limit = self.limit
        assert limit is not None
        k = self._index(now)
        got = self._count(self._phase + k * SPAN_S)
        if self._booked.get(k, 0.0) + 1 < limit or got < limit / 2:
            self._pace(now)
            return
        self.limit = max(1.0, got)
        self._booked[k] = self.limit

    def _count_out(self, end: float) -> None:
        """Requests out that went unbooked from ``end`` on, in windows just learned: counted
        where they went (their 429s give them back), or each window's whole count follows
        them in (a first 429 answered after its window's turn)."""
        for entry in [e for e in self._out if e.at >= end]:
            self._out.discard(entry)
            entry.mark = _WINDOW - self._era
            k = self._index(entry.at)
            self._booked[k] = self._booked.get(k, 0.0) + 1

    def _learn(self, now: float, window_end: float, *, exact: bool, bound: bool = False) -> None:
        """The limit is what got through in the window turning at ``window_end``."""
        start = self.window_start(window_end)
        got = self._count(start)
        if got < 1:
            if self.limit is None:
                return  # nothing got through to learn from: the 429's own pause is all
            got = self.limit  # a probe refused: the window had not turned
        looked = self.limit is None and not self._confirmed  # (looks went before: see _look)
        self.limit, self._learned = got, (start, window_end)
        self._refused_from = self._row.from_at
        self._start_windows(window_end, got)
        self._count_out(window_end)
        self._confirmed = exact
        # A router's bound: its minutes are the clock's, the first look at their turn (a look
        # a second on, then two, four..., cost LiteLLM's router rows 1.2% of calls in 429s).
        # With no hint the looks refused before go on doubling.
        self._probes = self._probes if looked else 0
        later_s = CHECK_S * 2**self._probes
        self._probe_at = math.inf if exact else window_end if bound else now + later_s
        self._probe_at = min(self._probe_at, window_end)
        self._probe = None

    def wait_s(
        self, now: float, retry_after_s: float | None, *, upper_bound: bool, minute_s: float
    ) -> float | None:
        """How long a 429 asks to wait, as far as the window goes (None: no hint to go by).
        A turn guessed at: wait for the next probe, no longer (the probes are the backoff).
        A hint that is only an upper bound (a router's, whose windows are the clock's
        minutes) is cut to the clock's minute's turn, where one request looks; a look
        refused, to the next look (the clock's minute was a wrong guess). Looks a second,
        two, four... apart from the first 429 cost four 429s more before the turn (bench
        f-litellm-429-learned: 5 of 405 calls, 1 of them the first round's)."""
        probe_in_s = max(0.0, self.probe_at - now)
        if retry_after_s is not None and upper_bound:
            if self.limit is not None:
                first_s = probe_in_s
            elif not self._confirmed and not self._probes:
                first_s = minute_s  # the look goes at the guessed turn
            else:
                first_s = CHECK_S  # (configured, or a look refused: the looks hold the rest)
            return min(retry_after_s, minute_s, first_s)
        if retry_after_s is None and probe_in_s < math.inf and self.limit is not None:
            return probe_in_s
        return retry_after_s

    @staticmethod
    def window_start(window_end: float) -> float:
        """Where the window turning at ``window_end`` began, as far as counting goes: the
        turn is a little late (a guess, a whole-second retry-after rounded up, a reply a
        latency old), its start too, so a second before."""
        return window_end - SPAN_S - LATE_S

    @property
    def full(self) -> bool:
        """Whether the server's 429s are a full server's, not a window's: a request sent
        while a 429's pause held the rest got through (:meth:`RateLimiter.answered`), and no
        window has been learned before."""
        return self.full_known and self.limit is None and self.paced is None

    @property
    def probing_full(self) -> bool:
        """Whether a 429's pause may be tested by one request (none learned yet, some got
        through before it, and none has shown the server full)."""
        return (
            not self.full_known
            and self.limit is None
            and self.paced is None
            and self._row.latest_through > -math.inf
        )

    @property
    def probe_at(self) -> float:
        """When the next probe goes (infinity: none is due, the window is known)."""
        return math.inf if self._confirmed else self._probe_at

    def _pace(self, now: float) -> None:
        got = max(1.0, self._count(now - SPAN_S))
        self.paced = Budget(got, headroom=self._headroom, configured=False)
        self.paced.stop_bursting(now)
        self._raised_at = now

    def _lower(self, now: float) -> None:
        paced = self.paced
        assert paced is not None
        self._raised_at = now
        got = self._count(now - SPAN_S)
        if 1 <= got < paced.per_minute:
            paced.set_limit(got)
            paced.drop_ahead(now)

    def _raise(self, now: float) -> None:
        paced = self.paced
        assert paced is not None
        if now - self._raised_at < RAISE_EVERY_S:
            return
        # Only while the pace holds the run back: what went lately is near it.
        lately = self._count(self._raised_at) * SPAN_S / (now - self._raised_at)
        self._raised_at = now
        if lately >= 0.8 * paced.per_minute:
            paced.set_limit(paced.per_minute * 1.2)

    def _count(self, since: float) -> float:
        return float(sum(1 for at in self._through if at >= since))

    def ready_at(self, at: float) -> float:
        """The first time from ``at`` that one more request fits (infinity: none before a
        probe is answered)."""
        if self.paced is not None:
            return self.paced.ready_at(at, 1.0)
        if not self._confirmed:  # a window guessed at: one probe first
            return math.inf if self._probe is not None else max(at, self._probe_at)
        limit = self.limit or math.inf
        k = first = self._index(at)
        while self._booked.get(k, 0.0) + 1 > limit:
            k += 1
        return at if k == first else self._phase + k * SPAN_S

    def book(self, at: float, now: float) -> Booking:
        """Book one request at ``at`` (from :meth:`ready_at`), at ``now``."""
        if self.paced is not None:
            return self.paced.book(at, 1.0)
        if not self._confirmed:
            self._probe = Booking(at, 1.0, _PROBE)
            return self._probe
        k = self._index(at)
        booked = self._booked
        booked[k] = booked.get(k, 0.0) + 1
        if len(booked) > 8:  # windows long past (not the newest's: senders book ahead)
            for old in [i for i in booked if i < self._index(now) - 1]:
                del booked[old]
        return Booking(at, 1.0, _WINDOW - self._era)

    def forget(self, entry: Booking) -> None:
        """The booking was never sent, or the server did not count it (its 429)."""
        if entry.cost:
            if entry.mark == _SENT:
                self._out.discard(entry)
            elif entry.mark == _PROBE:
                if entry is self._probe:  # (not one booked before a new limit's probe)
                    self._probe = None
            elif entry.mark == _WINDOW - self._era:
                k = self._index(entry.at)
                if self._booked.get(k, 0.0) >= 1:
                    self._booked[k] -= 1
            elif entry.mark >= 0 and self.paced is not None:  # booked in the pace
                self.paced.forget(entry)
        entry.cost = 0.0


# Marks no pace's booking has (theirs are running totals, never negative): a probe's, one
# sent unbooked (``went``), and a window's, less the windows' era it was booked in.
_PROBE = -1.0
_SENT = -2.0
_WINDOW = -10.0
