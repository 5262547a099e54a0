"""aiq.count_phase: a second's window whose reset is always 1 (Kong's ``-Second``) turns where
its counts say, on a simulated gateway that counts each request as it arrives and writes that
count in its headers (Kong's rate-limiting plugins and express-rate-limit's middleware set
them as they let the request through)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from aiq.booking_log import Booking
from aiq.budget import Budget
from aiq.count_phase import JITTER_S, PRECISE, REFUSALS, CountPhase
from aiq.ratelimit_headers import Window


class SecondWindows:
    """``limit`` a fixed window of a second, turning at ``phase`` past each second of our
    clock; refused requests count too (Kong)."""

    def __init__(self, limit: int, phase: float) -> None:
        self.limit, self.phase = limit, phase
        self.counts: dict[int, int] = {}
        self.first: dict[int, float] = {}  # window -> its first arrival

    def window(self, t: float) -> int:
        return math.floor(t - self.phase)

    def arrive(self, t: float) -> int:
        """Count a request arriving at ``t``; what is left (negative: refused)."""
        k = self.window(t)
        self.counts[k] = self.counts.get(k, 0) + 1
        self.first.setdefault(k, t)
        return self.limit - self.counts[k]


def sends_counter(sends: list[float], now: float) -> Callable[[float, float], float]:
    """Our requests sent from ``a`` to ``b``, by ``now``."""
    return lambda a, b: sum(1 for t in sends if a <= t <= b and t <= now)


@given(
    phase=st.floats(0.0, 0.999),
    delay=st.floats(0.0, 0.05),  # one way, the same for every request
    start=st.floats(0.0, 10.0),
    steps=st.lists(
        st.tuples(st.floats(0.0, 0.4), st.floats(0.0, 0.3)),  # gap to the send, service time
        min_size=2,
        max_size=80,
    ),
)
def test_the_phase_found_always_holds_the_servers_turn(
    phase: float, delay: float, start: float, steps: list[tuple[float, float]]
) -> None:
    """Whatever the sends and service times, the turns the counts allow hold the server's
    (on our clock of sends: its turn less the way there), and the window a request counts in
    is never said to turn before it does."""
    server, counting = SecondWindows(1000, phase), CountPhase(1.0)
    sends: list[float] = []
    replies: list[tuple[float, float, int]] = []
    t = start
    for gap, service in steps:
        t += gap
        sends.append(t)
        left = server.arrive(t + delay)
        heapq.heappush(replies, (t + delay + service, t, left))
    turn = phase - delay  # a request sent at a turn of this phase arrives at the server's
    while replies:
        now, sent, left = heapq.heappop(replies)
        counting.sample(sent, now, left, 1000, sends_counter(sends, now))
        if counting.lo is not None:
            # (lo, hi] holds a turn of the server's.
            k = math.ceil(counting.lo - turn)
            assert turn + k <= counting.hi + 1e-9, (counting.lo, counting.hi, turn)
        end = counting.end_of(sent)
        if end is not None:
            assert end >= math.floor(sent - turn) + 1 + turn - 1e-9


def test_held_back_requests_narrow_the_turn_to_a_hundredth_of_the_window() -> None:
    """Each window's last request sent halfway across where the turn may be: a dozen
    windows pin it to PRECISE, and the phase still holds the server's turn."""
    server, counting = SecondWindows(20, 0.37), CountPhase(1.0)
    sends: list[float] = []
    replies: list[tuple[float, float, int]] = []
    turn_at = 0.9  # (where the first sample's reset put it: its reply plus a second)

    def send(t: float) -> None:
        sends.append(t)
        heapq.heappush(replies, (t + 0.2, t, server.arrive(t)))

    for _ in range(14):
        probe = counting.probe_before(turn_at)
        if probe > sends[-1] if sends else probe > -math.inf:
            send(probe)  # (the last window's last request)
        for i in range(19 if probe > -math.inf else 20):
            send(turn_at + i * 0.001)
        while replies:
            now, sent, left = heapq.heappop(replies)
            counting.sample(sent, now, left, 20, sends_counter(sends, now))
        turn_at = counting.end_of(turn_at) or turn_at + 1.0
    assert counting.width_s <= PRECISE
    assert counting.probe_before(10.0) == -math.inf
    assert counting.lo is not None
    k = math.ceil(counting.lo - 0.37)
    assert counting.lo < 0.37 + k <= counting.hi


def run_budget(
    *, jobs: int, phase: float, at_arrival: bool, held_up: int = 0, delay: float = 0.0
) -> tuple[SecondWindows, int]:
    """A Budget told nothing sends ``jobs`` requests to Kong's 1,200 a minute as 20 a second
    (reset always 1, 0.2 s latency), asking when each may go; the server and how many it
    refused. ``at_arrival``: the headers are the count as the request arrived (Kong's), else
    as its reply left (written a latency later). The ``held_up``-th request (from 1) reaches
    the server ``delay`` late."""
    budget = Budget(1200, configured=False, outside=True)  # (as a learned request limit)
    server = SecondWindows(20, phase)
    latency, now, sent, refused = 0.2, 0.0, 0, 0
    replies: list[tuple[float, int, Booking, int]] = []
    while sent < jobs or replies:
        at = budget.ready_at(now, 1) if sent < jobs else math.inf
        if at < math.inf and (not replies or at <= replies[0][0]):
            now, entry, sent = at, budget.book(at, 1), sent + 1
            arrived = at + (delay if sent == held_up else 0.0)
            left = server.arrive(arrived)
            done = arrived if left < 0 else arrived + latency  # (a gateway refuses at its door)
            heapq.heappush(replies, (done, sent, entry, left))
            continue
        now, _, entry, left = heapq.heappop(replies)
        no = left < 0
        budget.close(entry, now, through=not no)
        if not at_arrival:
            left = server.limit - server.counts.get(server.window(now), 0)
        refused += no
        window = Window(1200, max(0, left), 1, span_s=1)
        budget.sync(now, window, entry, minute_left_s=60 - now % 60, refused=no)
    return server, refused


def test_a_budget_sends_each_window_whole_at_its_turn() -> None:
    """Told nothing, Kong's second: after the windows it takes to find the phase, every
    window holds its 20, the first sent within 15 ms of its turn (and the jitter's margin
    after it); none refused."""
    server, refused = run_budget(jobs=600, phase=0.613, at_arrival=True)
    assert refused == 0
    assert max(server.counts.values()) <= 20
    windows = sorted(server.counts)[12:-1]
    assert all(server.counts[k] == 20 for k in windows)
    late = [server.first[k] - (k + 0.613) for k in windows]
    assert min(late) >= JITTER_S and max(late) <= JITTER_S + 0.015, late


def test_a_request_held_up_on_its_way_costs_no_429() -> None:
    """One request reaching the server 50 ms late (a GC pause, a network's jitter) while the
    phase is being found: the phase comes out that much early, and the turn taken with
    JITTER_S to spare still sends no request into a spent window (without the margin, three
    of these were refused)."""
    refused = {
        k: run_budget(jobs=300, phase=0.613, at_arrival=True, held_up=k, delay=0.05)[1]
        for k in range(1, 240, 3)
    }
    assert not any(refused.values()), {k: n for k, n in refused.items() if n}


def test_a_server_writing_its_count_as_the_reply_leaves_costs_a_few_429s_and_no_more() -> None:
    """Headers written a latency after the count (the phase found a latency early): a
    request sent at a turn so found is refused, at most REFUSALS times, and the turns are the
    resets' again
    (no window after it over its 20, and 19 a window at least on the whole)."""
    server, refused = run_budget(jobs=600, phase=0.613, at_arrival=False)
    assert 1 <= refused <= REFUSALS
    windows = sorted(server.counts)
    over = [k for k in windows if server.counts[k] > 20]
    after = windows[windows.index(over[-1]) + 1 : -1]
    assert after and all(server.counts[k] <= 20 for k in after)
    assert sum(server.counts[k] for k in after) >= 19 * len(after)


def test_a_bucket_whose_reset_had_a_fraction_is_never_read_for_a_phase() -> None:
    """A bucket refilled continuously (per-second enforcement reported OpenAI's way) says
    ``1s`` or ``0s`` at times: whole, but no window's turn. Once a reset had a fraction, the
    last request left goes at once (not held back to look for a turn)."""
    for first_reset, held in ((0.35, False), (1.0, True)):
        budget = Budget(1200, configured=False, outside=True)
        entry = budget.book(0.0, 1)
        budget.close(entry, 0.2)
        budget.sync(0.2, Window(1200, 19, first_reset, span_s=1), entry, minute_left_s=59.8)
        for e in [budget.book(0.2 + i * 0.001, 1) for i in range(17)]:
            budget.close(e, 0.4)
        last = budget.book(0.25, 1)
        budget.close(last, 0.45)
        budget.sync(0.45, Window(1200, 1, 1, span_s=1), last, minute_left_s=59.55)
        assert (budget.ready_at(0.46, 1) > 0.46) is held, first_reset
