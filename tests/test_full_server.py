"""A 429 from a server that is only full, not out of its window (aiq.feedback's
``server_full``), on a fake clock.

LiteLLM's parallel limiter (litellm/proxy/hooks/parallel_request_limiter.py, a key's
``max_parallel_requests``) refuses while its count of requests in flight is met, with no
rate-limit header and ``retry-after`` the seconds to the next minute, though a slot frees as
soon as any request ends. A rate window refuses everything until its turn. With no limit
known, the pause a 429 brings is tested: one request goes as soon as one sent before the 429
got through; if it gets through, the server was full, the pause ends, and its 429s pause no
one again.
"""

from __future__ import annotations

import asyncio

from fakes import FakeClock

from aiq.limiter import RateLimiter, Ticket


def _out(lim: RateLimiter, clock: FakeClock, n: int) -> list[Ticket]:
    tickets = []
    for _ in range(n):
        ticket = lim.ticket_now()
        assert ticket is not None
        tickets.append(ticket)
        clock.now += 0.001
    return tickets


def _refused(lim: RateLimiter, ticket: Ticket, retry_after_s: float) -> float | None:
    lim.refund(ticket)
    wait_s = lim.rate_limited(retry_after_s, ticket=ticket)
    if wait_s is not None:
        lim.pause(wait_s)
    return wait_s


def test_a_request_let_through_the_pause_that_gets_through_ends_it() -> None:
    clock = FakeClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep, wall=lambda: clock.now)
    *admitted, ninth = _out(lim, clock, 9)  # a parallel limit of 8
    lim.settle(admitted.pop(0), 0)  # (one answer before, so something has got through)
    assert _refused(lim, ninth, 52.9) == 52.9  # not known yet: the pause, tested
    assert lim.pause_tested and not lim.server_full
    assert lim.ticket_now() is None  # paused
    lim.settle(admitted.pop(0), 0)  # a slot frees: one may go through the pause

    async def probe() -> Ticket:
        return await asyncio.wait_for(lim.acquire(), 1)

    through = asyncio.run(probe())
    assert through.full_probe and clock.now < 1001.0  # at once, not at the minute's turn
    lim.settle(through, 0)  # and the server took it: it was only full
    assert lim.server_full and lim.paused_s() == 0 and not lim.pause_tested
    # From now on its 429s are the refused job's alone: no pause, no limit learned.
    for ticket in _out(lim, clock, 20):
        assert _refused(lim, ticket, 52.0) is None
        assert lim.server_full
    assert lim.paused_s() == 0 and lim.limits.rpm is None


def test_a_window_that_refuses_the_request_let_through_keeps_its_pause() -> None:
    clock = FakeClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep, wall=lambda: clock.now)
    *admitted, first = _out(lim, clock, 9)
    lim.settle(admitted.pop(0), 0)
    _refused(lim, first, 50.0)
    lim.settle(admitted.pop(0), 0)  # counted before the window was met: it got through

    async def probe() -> Ticket:
        return await asyncio.wait_for(lim.acquire(), 1)

    through = asyncio.run(probe())
    assert through.full_probe
    _refused(lim, through, 49.9)  # the window is met: refused too
    assert not lim.server_full and not lim.pause_tested
    assert lim.paused_s() > 49  # the pause holds, to the turn the server named
    assert lim.ticket_now() is None


def test_a_server_that_has_let_nothing_through_is_not_tested() -> None:
    # Refusing from the first request (a model that always fails behind LiteLLM): nothing
    # says a slot will free, so the pause is the streak's, as before.
    clock = FakeClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep, wall=lambda: clock.now)
    (first,) = _out(lim, clock, 1)
    assert _refused(lim, first, 5.0) == 5.0
    assert not lim.pause_tested and not lim.server_full


def _tested(lim: RateLimiter, clock: FakeClock) -> Ticket:
    """Nine out at a parallel limit of 8, the ninth refused, a slot freed: the pause's test."""
    *admitted, ninth = _out(lim, clock, 9)
    lim.settle(admitted.pop(0), 0)
    _refused(lim, ninth, 52.9)
    lim.settle(admitted.pop(0), 0)

    async def probe() -> Ticket:
        return await asyncio.wait_for(lim.acquire(), 1)

    test = asyncio.run(probe())
    assert test.full_probe
    return test


def test_a_test_let_in_before_its_reply_ends_the_pause_at_once() -> None:
    # aiq.pause_test: out past the time a 429 takes, it was let in; its reply adds nothing.
    clock = FakeClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep, wall=lambda: clock.now)
    test = _tested(lim, clock)
    lim.let_in(test)
    assert lim.server_full and lim.paused_s() == 0 and not lim.pause_tested
    assert lim.ticket_now() is not None  # the others go now, not at the test's reply
    lim.settle(test, 0)
    assert lim.server_full


def test_a_test_let_in_and_then_refused_is_a_window_after_all() -> None:
    # A 429 slower than any before: the early pass is undone, and this 429 pauses.
    clock = FakeClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep, wall=lambda: clock.now)
    test = _tested(lim, clock)
    lim.let_in(test)
    assert _refused(lim, test, 49.9) is not None
    assert not lim.server_full
    assert lim.paused_s() > 49 and lim.ticket_now() is None
