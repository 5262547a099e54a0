"""aiq.reset_turn: a window's turn pinned from resets in whole seconds, against the formulas
of the gateways that write them (Kong's rate-limiting-advanced: the window's end less
``ngx.time()``; express-rate-limit: the time to the end rounded up), on any clock offset."""

from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from aiq.booking_log import Booking
from aiq.budget import Budget
from aiq.ratelimit_headers import Window
from aiq.reset_turn import LOOK_SHARE, ResetTurn


def kong_reset(server_t: float, span: int) -> int:
    """Kong/kong plugins/rate-limiting-advanced/handler.lua: ``max(1, window - (now -
    window_start))`` with ``now = ngx.time()`` (whole seconds), windows from the epoch."""
    whole = math.floor(server_t)
    start = math.floor(whole / span) * span
    return int(max(1, span - (whole - start)))


def express_reset(server_t: float, span: int) -> int:
    """express-rate-limit source/headers.ts: ``Math.ceil`` of the milliseconds to the end."""
    end = (math.floor(server_t / span) + 1) * span
    return max(1, math.ceil(end - server_t))


def true_turn(server_t: float, span: int, offset: float) -> float:
    """When the window that counts ``server_t`` turns, on our clock."""
    return (math.floor(server_t / span) + 1) * span - offset


samples = st.lists(
    st.tuples(
        st.floats(0.0, 0.4),  # from the last send to this one
        st.floats(0.0, 0.3),  # latency
        st.floats(0.0, 1.0),  # where in the latency the server wrote the reset
    ),
    min_size=1,
    max_size=60,
)


@given(
    span=st.sampled_from([1, 2, 3, 5, 10, 60]),
    offset=st.floats(-100.0, 100.0),
    start=st.floats(0.0, 120.0),
    kind=st.sampled_from(["kong", "express"]),
    steps=samples,
)
@example(span=1, offset=0.0, start=0.99, kind="kong", steps=[(0.0, 0.02, 1.0), (0.0, 0.02, 0.0)])
def test_the_turn_is_never_taken_before_the_servers(
    span: int, offset: float, start: float, kind: str, steps: list[tuple[float, float, float]]
) -> None:
    """Whatever the clocks' offset and the replies' latencies, the turn a sample's window is
    taken at is never before the server's own (a request sent then would count in the old
    window); and once a sample of the window was written in the first tenth of the server's
    second, no later than that sample's latency (and the tenth) after it, where the resets
    seen show the window too long for two turns to hide in a sample's interval (a second's
    window is taken from each sample alone)."""
    reset = kong_reset if kind == "kong" else express_reset
    turn, sent, pinned_by, longest = ResetTurn(), start, math.inf, 0
    window = None
    for gap, latency, at in steps:
        sent += gap
        now = sent + latency
        server_t = sent + at * latency + offset
        truth = true_turn(server_t, span, offset)
        said = reset(server_t, span)
        longest = max(longest, said)
        taken = turn.turn_at(sent, now, said)
        assert taken >= truth - 1e-9, (taken, truth)
        if truth != window:  # a new window: what pins it starts over
            window, pinned_by = truth, math.inf
        if server_t - math.floor(server_t) < 0.1:
            pinned_by = min(pinned_by, latency + 0.1)
        if longest >= 3:  # (two samples' intervals, each at most 1.3 s, hold one turn)
            assert taken - truth <= pinned_by + 1e-9


def test_a_minutes_turn_is_pinned_by_samples_at_other_fractions_of_the_servers_second() -> None:
    """One sample of a minute's window, written 0.9 s into the server's second, says the turn
    is 0.9 s further than it is; samples later in the same window narrow it to a latency."""
    turn = ResetTurn()
    truth, latency = 60.0, 0.05
    taken = []
    for sent in (10.85, 12.02, 12.6, 13.35):  # (written 0.9, 0.07, 0.65, 0.4 into a second)
        server_t = sent + latency  # (written as it arrived)
        taken.append(turn.turn_at(sent, sent + latency, kong_reset(server_t, 60)))
    assert taken[0] == 60.9
    assert all(t >= truth for t in taken)
    assert taken[-1] - truth <= 2 * latency + 1e-9
    assert taken == sorted(taken, reverse=True)


def test_the_next_windows_samples_start_over() -> None:
    """A sample written in a window's last second keeps its turn; one sent after the
    pinned turn is the next window's and starts over."""
    turn = ResetTurn()
    assert turn.turn_at(50.0, 50.1, 10) == 60.1
    assert turn.turn_at(59.98, 60.05, 1) == 60.1  # (alone: 61.05)
    assert turn.turn_at(60.2, 60.3, 60) == 120.3


def test_exact_resets_are_taken_at_the_least_latency() -> None:
    """A reset with a fraction is the server's own to the millisecond: the turn is taken at
    the sample whose reply came back soonest after the reset was written."""
    turn = ResetTurn()
    assert turn.turn_at(1.0, 1.3, 8.75) == 10.05  # (written at 1.25: 0.05 late)
    assert math.isclose(turn.turn_at(2.0, 2.01, 7.995), 10.005)


def test_a_server_that_cuts_its_reset_down_is_followed_a_second_later_after_one_429() -> None:
    """A reset cut down to the whole second (the turn up to a second further than it says)
    shows as a 429 to a request sent within a second after the turn it pinned: every turn
    from then on is taken a second later."""
    turn = ResetTurn()
    # Turn at 60.0, the server floors its reset: written at 10.4, it says 49.
    assert turn.turn_at(10.3, 10.5, 49) == 59.5
    turn.refused(59.6)  # sent at 59.6 (after the turn taken), refused: it had not turned
    assert turn.turn_at(59.6, 59.7, 0) == 60.7  # (the 429's own sample, a second later)
    assert turn.turn_at(61.0, 61.1, 59) == 121.1


def test_a_429_far_from_a_turn_changes_nothing() -> None:
    turn = ResetTurn()
    assert turn.turn_at(10.3, 10.5, 50) == 60.5
    turn.refused(30.0)
    assert turn.turn_at(61.0, 61.1, 59) == 120.1


def test_a_budget_sends_into_the_next_window_at_the_pinned_turn() -> None:
    """Kong's minute (600, told nothing): the first reply's reset, written 0.9 s into the
    server's second, puts the turn at 60.9; one written 0.07 s in pins it at 60.07, and the
    senders waiting for 60.9 are woken to book again (sync returns True); a later one at
    0.65 s in does not move it back. The window spent, the next request goes at 60.07."""
    budget = Budget(600, configured=False)
    minute = Window(600, 599, 50, span_s=60)
    first = budget.book(10.85, 1)
    budget.sync(10.9, minute, first, minute_left_s=49.1)
    for i in range(598):
        budget.book(10.9 + i * 0.001, 1)
    second = budget.book(12.02, 1)
    assert budget.sync(12.07, Window(600, 0, 48, span_s=60), second, minute_left_s=47.93)
    third = budget.book(12.6, 1)  # (past the 600: the server refuses it)
    budget.sync(12.65, Window(600, 0, 48, span_s=60), third, minute_left_s=47.35, refused=True)
    assert budget.ready_at(12.7, 1) == pytest.approx(60.07, abs=0.001)


class FixedWindows:
    """express-rate-limit's memory store: ``limit`` a window of ``span`` seconds from
    ``start`` on our clock, refused requests counted, and its headers written as the request
    arrives: what is left and the time to the window's end, rounded up."""

    def __init__(self, limit: int, span: int, start: float) -> None:
        self.limit, self.span, self.start = limit, span, start
        self.counts: dict[int, int] = {}
        self.arrivals: dict[int, list[float]] = {}

    def window(self, t: float) -> int:
        return math.floor((t - self.start) / self.span)

    def turn_of(self, k: int) -> float:
        return self.start + (k + 1) * self.span

    def arrive(self, t: float) -> tuple[int, int]:
        """Count a request arriving at ``t``: what is left (negative: refused), the reset."""
        k = self.window(t)
        self.counts[k] = self.counts.get(k, 0) + 1
        self.arrivals.setdefault(k, []).append(t)
        return self.limit - self.counts[k], max(1, math.ceil(self.turn_of(k) - t))


def run_fixed_windows(
    jobs: int, *, waiting: bool, start: float = -0.37
) -> tuple[FixedWindows, int, list[float]]:
    """A Budget told nothing sends ``jobs`` requests to express's 600 a minute (its window
    turning 59.63 s after our first request, 0.1 s each way), asking when each may go and
    saying how many wait behind it (``waiting``; else none is said to); the server, how many
    it refused, and the send times."""
    server = FixedWindows(600, 60, start)
    budget = Budget(600, configured=False, outside=True)  # (as a learned request limit)
    now, sends, refused = 0.0, list[float](), 0
    replies: list[tuple[float, int, Booking, int, int]] = []
    while len(sends) < jobs or replies:
        backlog = jobs - len(sends) - 1 if waiting else 0
        at = budget.ready_at(now, 1, backlog=backlog) if len(sends) < jobs else math.inf
        if at < math.inf and (not replies or at <= replies[0][0]):
            now, entry = at, budget.book(at, 1)
            sends.append(at)
            left, reset = server.arrive(at + 0.1)
            heapq.heappush(replies, (at + 0.2, len(sends), entry, left, reset))
            continue
        now, _, entry, left, reset = heapq.heappop(replies)
        no = left < 0
        refused += no
        budget.close(entry, now, through=not no)
        window = Window(600, max(0, left), reset, span_s=60)
        budget.sync(now, window, entry, minute_left_s=60 - now % 60, refused=no)
    return server, refused, sends


def test_a_windows_last_requests_look_for_its_turn_while_more_wait() -> None:
    """700 jobs at a minute of 600 turning 59.63 s in: the burst's replies pin the turn to a
    second and a latency; its last few requests go across that interval instead of at once,
    and the one counted in the new window shows it: the other 100 go a look's spacing and a
    reply after the turn (taken at the replies' reset, without looks: 0.87 s after). None is
    refused, and no window holds more than 600."""
    server, refused, _ = run_fixed_windows(700, waiting=True)
    assert refused == 0
    assert max(server.counts.values()) <= 600
    turn = server.turn_of(0)
    late = max(server.arrivals[1]) - turn
    # (Pinned to 1.2 s: its three looks (one per LOOK_SHARE) a quarter of it apart, then a
    # round trip.)
    assert late <= 1.2 / (600 // LOOK_SHARE) + 0.2 + 0.1, late
    _, _, unlooked = run_fixed_windows(700, waiting=False)
    assert max(unlooked) + 0.1 - turn > late + 0.3


def test_no_request_is_held_back_where_nothing_waits_for_the_turn() -> None:
    """600 jobs, the window's whole count: nothing waits for its turn, so none is held back
    to look for it (the run's last request would wait for nothing)."""
    server, refused, sends = run_fixed_windows(600, waiting=True)
    assert refused == 0 and server.counts == {0: 600}
    assert max(sends) < 1.0, max(sends)
