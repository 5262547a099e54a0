"""A window whose headers say what is left and when it refills, but no limit (Azure's docs name
only ``x-ratelimit-remaining-*``): the per-minute limit its samples imply (aiq.implied_limit),
and a window with neither reset nor limit (aiq.window_sync), on fake clocks."""

from __future__ import annotations

import asyncio
import math

import pytest
from fakes import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st
from test_limiter import drain, unlimited_info

from aiq.implied_limit import ImpliedLimit
from aiq.limiter import HEADROOM, RateLimiter
from aiq.ratelimit_headers import Window


@settings(max_examples=200, deadline=None)
@given(
    per_window=st.integers(1, 2_000),
    span_s=st.sampled_from([1.0, 2.0, 5.0, 10.0, 30.0, 60.0]),
    start=st.floats(0.0, 1.0),
    sent=st.integers(1, 400),
)
def test_a_fixed_windows_samples_imply_its_limit_once_one_begins_a_window(
    per_window: int, span_s: float, start: float, sent: int
) -> None:
    """Samples of a fixed window (``per_window`` each ``span_s``, its reset the time to its
    boundary) imply at most its per-minute limit while the first window is under way, and
    the limit itself (to a hundredth) once a window's first request is sampled."""
    implied = ImpliedLimit()
    limit = per_window * 60 / span_s
    used = 0
    at = start * span_s  # where in the first window the run began
    step = span_s / max(1, sent)
    for _ in range(sent):
        if at >= span_s:
            break
        used = min(per_window, used + 1)
        got = implied.sample(per_window - used, span_s - at)
        assert got is not None and got >= 1
        assert got <= math.ceil(limit * span_s / max(1.0, span_s - at)) + 1
        at += step
    got = implied.sample(per_window - 1, span_s)  # the next window's first request
    assert got is not None and abs(got - limit) <= max(1.0, 0.01 * limit)


@given(
    span_s=st.sampled_from([1.0, 2.0, 5.0, 10.0, 30.0]),
    seen=st.floats(0.3, 1.0),
    apart=st.integers(1, 5),
)
def test_two_turns_a_429_named_say_how_long_the_window_is(
    span_s: float, seen: float, apart: int
) -> None:
    """Resets seen up to ``seen`` of the window, then two turns named ``apart`` windows apart:
    the window is taken as no shorter than the resets and a whole number of it between the
    turns: exact where the resets rule out a shorter whole part of the gap, never longer."""
    implied = ImpliedLimit()
    implied.sample(99, seen * span_s)
    implied.turned(1000.0)
    implied.turned(1000.0 + apart * span_s)
    got = implied.sample(0, None)
    assert got is not None
    window_s = 100 * 60 / got
    assert window_s <= span_s * 1.01
    longest = max(1.0, seen * span_s)  # (a window is taken as a second at least)
    if math.floor(apart * span_s / longest + 1e-6) == apart:  # no shorter whole part fits
        assert window_s >= span_s * 0.99


def test_a_window_too_long_implies_no_minutes_limit() -> None:
    assert ImpliedLimit().sample(14_000, 3_600.0) is None  # a day's count, an hour to go


def test_azures_window_with_no_limit_is_followed_told_nothing() -> None:
    """200 a 10 s window, shown as what is left and the reset: its 200 go at once, the next
    at its reset (not at the pace of a minute's count, nor never)."""
    clock = FakeClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep)
    lim.observe(unlimited_info(requests=Window(None, 199, 10.0)))
    assert lim.limits.rpm == 1200
    times = drain(lim, clock, 201)
    assert times[198] == 1000.0  # what it said is left, at once
    assert 1010.0 <= times[199] <= 1010.0 + 60 / 1200 / HEADROOM + 1e-3


def test_a_window_with_no_reset_nor_limit_under_the_one_given_is_shorter_than_a_minute() -> None:
    """Told 1,200/min, a window that names neither reset nor limit and holds 200 at most is
    a 10 s one: what is left goes at once, and it is looked at again a second later (not
    at the clock's next minute: a sixth of the quota); once a 429 names its turn, every
    10 s from that."""
    clock = FakeClock(1000.0)
    wall = FakeClock(1_800_000_003.0)  # 3 s into a minute
    lim = RateLimiter(rpm=1200, clock=clock, sleep=clock.sleep, wall=wall)
    lim.observe(unlimited_info(requests=Window(None, 199, None)))
    times = drain(lim, clock, 200)
    assert times[198] - 1000.0 <= 60 / 1200 * 200  # no later than the pace would have
    assert times[199] == pytest.approx(1001.0, abs=1e-3)  # a look, a second on
    # The look refused: its exact retry-after names the turn, 8.5 s on.
    assert lim.rate_limited(8.5) == 8.5
    lim.observe(unlimited_info(requests=Window(None, 0, None)))  # (a reply of the window)
    later = drain(lim, clock, 1)
    assert later[0] == pytest.approx(1009.5, abs=1e-3)
    # The window spent again, as a reply to a request sent in it says: the next turn.
    ticket = asyncio.run(lim.acquire())
    lim.observe(unlimited_info(requests=Window(None, 0, None)), ticket)
    assert drain(lim, clock, 1)[0] == pytest.approx(1019.5, abs=1e-3)  # the next, 10 s on


def test_azures_window_with_neither_limit_nor_reset_is_read_from_its_first_429() -> None:
    """Told nothing, what is left alone implies no limit; a 429's exact retry-after is the
    window's reset: then it is followed, its turns every span after that one."""
    clock = FakeClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep)
    lim.observe(unlimited_info(requests=Window(None, 199, None)))
    assert lim.limits.rpm is None  # nothing to go by yet
    assert lim.rate_limited(10.0) == 10.0  # spent until its turn, 10 s on
    assert lim.limits.rpm == 1200  # 200 (the most left, and the one that saw it) per 10 s
    lim.pause(0.0)
    assert drain(lim, clock, 1)[0] == pytest.approx(1010.0, abs=1e-3)


def test_a_count_the_headers_give_is_the_windows_per_its_reset() -> None:
    # Together's x-ratelimit-limit: 10 a second, a reset under a second: 600 a minute.
    implied = ImpliedLimit()
    assert implied.sample(3, 0.7, count=10) == 600
    assert implied.sample(9, 0.1, count=10) == 600  # (the count, not the most seen left)


def test_togethers_tokens_per_second_take_the_span_of_its_requests() -> None:
    # x-tokenlimit-* names no reset; its requests' window (resets under a second) is the same
    # second: 5,000 tokens a second are 300,000 a minute, not unread.
    clock = FakeClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep)
    lim.observe(
        unlimited_info(
            requests=Window(None, 7, 0.3, count=10), tokens=Window(None, 4200, None, count=5000)
        )
    )
    assert lim.limits.rpm == 600
    assert lim.limits.tpm == 300_000
