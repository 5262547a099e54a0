"""A configured limit whose window no header shows: taken for a bucket full at the start, its
burst opened as answers come (aiq.budget's ``presumed``), on a fake clock.

The servers are simulated as providers and gateways count (tests/test_limiter.py's SimBucket,
tests/test_refusal_limit.py's harness): a minute's bucket full at the start that reports its
requests per minute nowhere (Groq enforces an RPM beside the requests per day its headers
report; console.groq.com/docs/rate-limits), LiteLLM's calendar minute with no headers
(PROVIDERS.md), and the ways a presumed bucket is wrong: a sliding minute, per-second
enforcement (a small bucket, a sliding second).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_limiter import SimBucket, SimFixedWindow
from test_refusal_limit import (
    HINTS,
    LATENCY_S,
    Admits,
    SimSlidingMinute,
    after_turn,
    per_window,
    run,
)

from aiq.budget import HEADROOM, Budget
from aiq.ratelimit_headers import Window


class SimSlidingSecond:
    """At most ``limit / 60`` admitted in any 1 s, no headers, no hint (per-second enforcement
    behind a per-minute limit, reported nowhere)."""

    def __init__(self, limit: int) -> None:
        self.per_s, self.admitted = limit // 60, list[float]()

    def admit(self, now: float) -> bool:
        if sum(1 for t in self.admitted[-self.per_s :] if t > now - 1.0) >= self.per_s:
            return False
        self.admitted.append(now)
        return True


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(limit=st.integers(5, 400), extra=st.floats(0.1, 1.0), senders=st.integers(16, 128))
# A slot booked from full at the even pace, taken back when the opening doubled, was still
# where the model's drain began: a reply past it pushed the bottom one slot late.
@example(limit=32, extra=1.0, senders=16)
def test_a_full_bucket_is_used_at_once_and_never_refuses(
    limit: int, extra: float, senders: int
) -> None:
    """Told the limit a bucket full at the start enforces: its whole content goes within a
    few round trips (the opening doubles each), the rest at the refill's pace, no 429."""
    n = limit + math.ceil(extra * limit)
    server = SimBucket(limit, limit, 1000.0)
    sent, refused = run(server, None, n, wall_offset=0.0, senders=senders, rpm=limit, storm=1)
    assert not refused
    least = (n - limit) / (limit / 60)  # the bucket's content at once, the rest at its refill
    rounds = math.log2(limit) + limit / senders + 2  # the opening, and senders busy meanwhile
    assert sent[-1] - 1000.0 <= least / HEADROOM + rounds * LATENCY_S + 1e-6


@pytest.mark.parametrize("hint", HINTS)
def test_a_calendar_minute_is_learned_from_its_429s_when_told_the_limit(hint: str | None) -> None:
    """LiteLLM's count per calendar minute, told its limit: the presumed bucket empties the
    minute, one request looks past it, its 429 ends the presumption and teaches the window
    (aiq.refusal_limit), and every later minute is used whole from its turn, with no 429
    after the first turn."""
    phase, limit = 1020.0, 120
    server = SimFixedWindow(limit, 60, phase)
    sent, refused = run(server, hint, limit * 3, wall_offset=-phase, senders=64, rpm=limit)
    assert refused and not after_turn(refused, phase)
    # One request looked past the minute's worth, not a round trip's refill of senders (64
    # refused), and with no hint, the looks at a guessed turn (1, 2, 4... s after).
    assert len(refused) <= (1 if hint else 7), refused
    counts = per_window(sent, phase)
    assert counts[max(counts) - 1] == limit, counts  # a whole later minute
    turn = phase + 60 * (math.floor((refused[0] - phase) / 60) + 1)
    assert min(t for t in sent if t >= turn) - turn <= 1.0


NOT_A_BUCKET: dict[str, Callable[[], Admits]] = {
    "sliding-minute": lambda: SimSlidingMinute(120),
    "sliding-second": lambda: SimSlidingSecond(600),
    "small-bucket": lambda: SimBucket(600, 10, 1000.0),
}


@pytest.mark.parametrize("name", NOT_A_BUCKET)
def test_a_server_that_is_not_a_full_bucket_refuses_about_one_round(name: str) -> None:
    """Told the limit a sliding minute or per-second enforcement holds: the opening overshoots
    once, its 429s end the presumption, and the run finishes at the even pace with few more."""
    server = NOT_A_BUCKET[name]()
    limit = 120 if name == "sliding-minute" else 600
    n = 2 * limit if name == "sliding-minute" else limit
    sent, refused = run(server, None, n, wall_offset=0.0, senders=64, rpm=limit)
    assert len(sent) == n
    assert len(refused) <= 0.1 * n, len(refused)
    assert sent[-1] - sent[0] <= (n / limit) * 60 * 1.5 + 60


def test_the_opening_doubles_each_round_trip_from_the_even_pace() -> None:
    budget = Budget(600, headroom=1.0)  # 10 a second
    assert budget.presumed and budget.allowance == 1

    def book(k: int) -> list[float]:
        times = []
        for _ in range(k):
            times.append(budget.ready_at(0.0, 1))
            budget.book(times[-1], 1)
        return times

    assert book(2) == pytest.approx([0.0, 0.1])  # nothing answered: the even pace
    budget.drop_ahead(0.0)  # (the one at 0.1 not sent: taken back)
    assert budget.grow(1)  # the first answered: two go at once, where it went
    assert book(3) == pytest.approx([0.0, 0.0, 0.1])
    budget.drop_ahead(0.0)
    assert not budget.grow(1) and budget.grow(1)  # their answers: four at once
    assert book(5) == pytest.approx([0.0] * 4 + [0.1])
    for _ in range(600):
        budget.grow(1)
    assert budget.allowance == 600  # never over the limit's minute


def test_headers_showing_the_limits_own_window_end_the_presumption() -> None:
    budget = Budget(600)
    budget.sync(0.0, Window(14_400, 14_000, 200.0), minute_left_s=30.0)  # a day's count
    assert budget.presumed  # not this limit's window: still a presumed bucket
    budget.sync(0.0, Window(600, 590, 1.0), minute_left_s=30.0)
    assert not budget.presumed and budget.shown


def test_a_429_ends_the_presumption_for_the_run() -> None:
    budget = Budget(600, headroom=1.0)
    for _ in range(50):
        budget.grow(1)
    budget.stop_bursting(5.0)
    assert not budget.presumed
    times = []
    for _ in range(3):
        at = budget.ready_at(5.0, 1)
        budget.book(at, 1)
        times.append(at)
    assert times == pytest.approx([5.0, 5.1, 5.2])  # evenly, from the 429
