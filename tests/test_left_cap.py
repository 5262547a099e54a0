"""What a window that shows only what is left allows before any limit is known (aiq.left_cap):
the rule on its own, then against a fixed window that names nothing but what is left (Azure's
documented headers) on a fake clock."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.left_cap import LOOK_S, LeftCap


def test_nothing_caps_before_a_window_showed_what_is_left() -> None:
    cap = LeftCap()
    assert not cap.active and cap.open
    assert cap.ready_at(5.0, object()) == 5.0


def test_ours_sent_after_the_answered_request_count_against_what_it_saw() -> None:
    cap = LeftCap()
    cap.sample(10, sent_at=0.0, now=0.2)
    for at in (0.05, 0.1, 0.25):  # the first two went after the answered one did, too
        cap.sent(at, object())
    cap.sample(5, sent_at=0.1, now=0.3)  # counted the two sent by 0.1, not the third
    for _ in range(4):
        assert cap.open
        cap.sent(0.3, object())
    assert not cap.open


def test_a_late_reply_to_an_older_request_does_not_undo_a_newer_one() -> None:
    cap = LeftCap()
    cap.sample(0, sent_at=1.0, now=1.2)
    assert not cap.sample(50, sent_at=0.5, now=1.3)  # (sent before: an older count)
    assert not cap.open


def test_a_spent_window_is_looked_at_by_one_request_a_second_on() -> None:
    cap = LeftCap()
    cap.sample(0, sent_at=1.0, now=1.2)
    first, second = object(), object()
    assert cap.ready_at(1.2, first) == 1.2 + LOOK_S  # the look, booked by the first
    assert cap.ready_at(1.2, second) == math.inf  # the rest wait for its answer
    cap.release(first)  # (not sent after all: the look is free again)
    assert cap.ready_at(1.3, second) == 1.2 + LOOK_S
    cap.sent(2.2, second)
    assert cap.ready_at(2.2, first) == math.inf  # out: nothing more before its answer
    assert cap.sample(0, sent_at=2.2, now=2.4)  # answered, still spent: book again
    assert cap.ready_at(2.4, first) == 2.4 + LOOK_S
    assert cap.sample(200, sent_at=3.4, now=3.6)  # the window turned: open
    assert cap.open


class _FixedWindow:
    """``count`` a window of ``span_s``, counted at arrival; answers with what is left only."""

    def __init__(self, count: int, span_s: float, phase_s: float) -> None:
        self.count, self.span_s, self.phase_s = count, span_s, phase_s
        self.used: dict[int, int] = {}
        self.refused = 0

    def arrive(self, at: float) -> int:
        window = math.floor((at + self.phase_s) / self.span_s)
        used = self.used.get(window, 0)
        if used >= self.count:
            self.refused += 1
        else:
            self.used[window] = used = used + 1
        return self.count - used


@given(
    count=st.integers(5, 300),
    span_s=st.sampled_from([1.0, 10.0, 60.0]),
    phase=st.floats(0.0, 1.0),
    latency_s=st.floats(0.01, 2.0),
    rate=st.integers(50, 500),
)
@settings(deadline=None)  # (a few thousand steps an example; a loaded suite took over 200 ms)
def test_after_the_first_reply_a_window_is_never_sent_more_than_looks(
    count: int, span_s: float, phase: float, latency_s: float, rate: int
) -> None:
    # A client that sends as fast as the cap lets it (``rate`` a second, no limit known),
    # the server answering ``latency_s`` later with what is left: once the first answer is
    # in, the window's 429s are the looks alone, at most one a LOOK_S.
    cap = LeftCap()
    server = _FixedWindow(count, span_s, phase * span_s)
    replies: list[tuple[float, float, int]] = []  # (answered at, sent at, left)
    now, step, end = 0.0, 1.0 / rate, 3 * span_s
    first_answer = latency_s
    refused_by_then = 0
    while now < end:
        while replies and replies[0][0] <= now:
            answered, sent, left = replies.pop(0)
            cap.sample(left, sent, answered)
        if now >= first_answer and not refused_by_then:
            refused_by_then = server.refused + 1  # (+1: never 0 once set)
        owner = object()
        at = cap.ready_at(now, owner)
        if at <= now:
            cap.sent(now, owner)
            replies.append((now + latency_s, now, server.arrive(now)))
        else:
            cap.release(owner)
        now += step
    after = server.refused - (refused_by_then - 1)
    assert after <= math.ceil((end - first_answer) / LOOK_S) + 1
    # ...and, where a window outlasts a look and its answer, its count was used: every
    # window after the first answer got it all.
    if span_s < 5 * (latency_s + LOOK_S):
        return
    first = math.floor((first_answer + latency_s + phase * span_s) / span_s) + 1
    last = math.floor((end - latency_s - LOOK_S + phase * span_s) / span_s)
    for window in range(first, last):
        assert server.used.get(window, 0) == count, (window, server.used)
