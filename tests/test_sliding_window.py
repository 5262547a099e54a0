"""A sliding window (Kong's rate-limiting-advanced, its default ``window_type``): the last
window's count, weighed by how much of it still overlaps, plus this one's. After a full window
it gives its room back at the limit's pace from the turn, where a fixed one gives it all back
at once; its 429s' ``Retry-After`` is the fixed turn grown by the overshoot, about a minute.
aiq follows it as a bucket of the window's count (aiq.window_shape), and takes
that ``Retry-After`` for an upper bound. Driven against the fake server's own mode
(tests/fakeserver/modes/gateways.py ``KongGateway``, which cites Kong's source), its headers
read by aiq's parser, on a fake clock."""

from __future__ import annotations

import asyncio
import heapq
import math
from datetime import UTC, datetime

import pytest
from fakes import FakeClock
from fakeserver import modes as fl
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.booking_log import Booking
from aiq.budget import Budget
from aiq.limiter import RateLimiter
from aiq.ratelimit_headers import RateLimitInfo, Window, parse_rate_limit_headers

NONE = Window(None, None, None)

ZERO = 6000.0  # a multiple of every window length used here: the server's windows start here


class Kong:
    """The fake server's Kong mode at ``rpm`` over ``window_s``, as a client sees it: a
    request arriving at ``t`` is admitted or refused, and its reply carries the headers
    written as it arrived (Kong's ``access`` phase)."""

    def __init__(self, rpm: int, window_s: int, window_type: str) -> None:
        self.mode = fl.KongGateway(rpm=rpm, window_s=window_s, window_type=window_type)
        self.refused: list[float] = []

    def arrive(self, t: float) -> tuple[fl.Refused | None, Window]:
        """A request arriving at ``t``: its 429 (None: admitted), the requests window its
        headers show (a 429's are its own)."""
        refused = self.mode.admit(t, fl.Cost())
        if refused is not None:
            self.refused.append(t)
        headers = refused.headers if refused is not None else self.mode.headers(t)
        lower = {k.lower(): v for k, v in headers.items()}
        return refused, parse_rate_limit_headers(lower, datetime.now(UTC)).requests


def run(
    jobs: int, start_in: float, *, window_type: str = "sliding", latency: float = 0.2
) -> tuple[Kong, Budget, list[float]]:
    """A Budget told nothing sends ``jobs`` to Kong's 600 a minute from ``start_in`` seconds
    into a window (replies ``latency`` after each send, counted half way), asking when each
    may go and saying how many wait behind it; the server, the budget, the send times."""
    server = Kong(600, 60, window_type)
    budget = Budget(600, configured=False, outside=True)  # (as a learned request limit)
    now, sends = ZERO + start_in, list[float]()
    replies: list[tuple[float, int, Booking, bool, Window]] = []
    while len(sends) < jobs or replies:
        at = math.inf
        if len(sends) < jobs:
            at = budget.ready_at(now, 1, backlog=jobs - len(sends) - 1)
        if at < math.inf and (not replies or at <= replies[0][0]):
            now, entry = at, budget.book(at, 1)
            sends.append(at)
            refused, window = server.arrive(at + latency / 2)
            reply = (at + latency, len(sends), entry, refused is not None, window)
            heapq.heappush(replies, reply)
            continue
        now, _, entry, no, window = heapq.heappop(replies)
        if no:
            budget.forget(entry)
        budget.close(entry, now, through=not no)
        budget.sync(now, window, entry, minute_left_s=60 - now % 60, refused=no)
    return server, budget, sends


@settings(max_examples=40, deadline=None)
@given(start_in=st.floats(0.0, 58.5), latency=st.sampled_from([0.05, 0.2, 0.6]))
def test_after_a_full_window_the_rest_go_at_the_limits_pace(
    start_in: float, latency: float
) -> None:
    """700 jobs from anywhere in a minute but its last 1.5 s: 600 fill the first window, and
    the other 100 go at the sliding window's pace from its turn (10 a second), not a minute
    later, as a fixed window's cap, or the 429's minute, held them. 429s: the looks for the
    turn (aiq.reset_turn), which a sliding window refuses past it, at most 3. (Started in a
    window's last second, the opening burst, sent a reply after the first request, lands in
    the next window, and the rest wait a window more: the ideal client, all at once at the
    start, takes a minute less.)"""
    server, budget, sends = run(700, start_in, latency=latency)
    turn = ZERO + 60
    least = 100 / 10  # (the window gives back 10 a second from its turn)
    assert budget.slides
    assert max(sends) - turn <= least / 0.98 + 2 * latency + 0.5, max(sends) - turn
    assert len(server.refused) <= 3, server.refused


@pytest.mark.parametrize(("start_in", "latency"), [(40.0, 0.2), (30.0, 0.6), (57.0, 0.6)])
def test_a_fixed_window_is_not_taken_for_a_sliding_one_or_a_bucket(
    start_in: float, latency: float
) -> None:
    """Kong's fixed minute: its turn shows the whole count again, and the 100 left go at
    once there. Its opening burst passes through samples where what is left and the reset's
    refill add up to the limit (a bucket's shape), and is not taken for one: a bucket's
    refill let 2 to 10 more go than the window had."""
    server, budget, sends = run(700, start_in, window_type="fixed", latency=latency)
    assert not budget.slides
    assert not server.refused, server.refused
    assert max(sends) - (ZERO + 60) < 1.0 + 2 * latency, max(sends) - ZERO


async def _send(
    lim: RateLimiter, clock: FakeClock, server: Kong, jobs: int
) -> tuple[float, float | None] | None:
    """Send up to ``jobs`` through ``lim`` (each arriving as it goes, its reply at once); at
    the first 429, stop: its ``Retry-After``, and the wait the limiter takes from it (None:
    none refused)."""
    for _ in range(jobs):
        ticket = await lim.acquire()
        refused, window = server.arrive(clock.now)
        lim.observe(RateLimitInfo(window, NONE), ticket, refused=refused is not None)
        if refused is None:
            lim.answered(ticket)
            continue
        lim.refund(ticket)
        retry_after = float(refused.headers["Retry-After"])
        return retry_after, lim.rate_limited(retry_after, ticket=ticket)
    return None


def test_a_sliding_windows_minute_long_retry_after_is_an_upper_bound() -> None:
    """Past the turn of a full sliding minute, a 429's Retry-After (61 s: the fixed turn
    grown by the overshoot) is waited only as long as the window's refill needs for a slot."""
    clock = FakeClock(ZERO + 30.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep, wall=clock)
    server = Kong(600, 60, "sliding")
    # 600 by 30 s in, then on to the turn, where the window has given back next to nothing.
    assert asyncio.run(_send(lim, clock, server, 600)) is None
    refused = asyncio.run(_send(lim, clock, server, 20))
    assert refused is not None
    retry_after, wait = refused
    assert retry_after >= 60  # (the fixed turn, grown by the overshoot)
    assert wait is not None and wait <= 60 / 600 / 0.98 + 1e-9, wait
    assert clock.now < ZERO + 62


def test_a_fixed_windows_retry_after_is_its_turn() -> None:
    """A 429 from a fixed window (another client took what was left) asks for its turn,
    and it is waited out."""
    clock = FakeClock(ZERO + 30.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep, wall=clock)
    server = Kong(600, 60, "fixed")
    assert asyncio.run(_send(lim, clock, server, 300)) is None
    for _ in range(300):  # (another client's)
        server.arrive(clock.now)
    refused = asyncio.run(_send(lim, clock, server, 10))
    assert refused is not None and refused[0] >= 29.0
    assert refused[1] == refused[0]
    assert not lim._requests.slides  # type: ignore[union-attr]
