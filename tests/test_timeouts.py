"""The learned per-model timeout (aiq.timeouts): the rule's numbers, on samples fed by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq.timeouts import FLOOR_S, TimeoutRule, Timeouts

latencies = st.lists(st.floats(min_value=0.0, max_value=1e4), min_size=0, max_size=400)


def test_the_ceiling_alone_until_enough_replies() -> None:
    t = Timeouts(ceiling_s=600)
    for _ in range(19):
        t.observe("m", 0.05)
    assert t.timeout_s("m") is None and t.learned_s("m") is None
    t.observe("m", 0.05)
    assert t.timeout_s("m") == FLOOR_S  # 4 x 50 ms is under the floor


def test_four_times_the_p99_per_model() -> None:
    t = Timeouts(ceiling_s=600)
    for i in range(100):
        t.observe("fast", 0.05)
        t.observe("slow", 2.0 if i else 30.0)  # one outlier in 100 is the 1% the p99 drops...
    assert t.timeout_s("fast") == FLOOR_S
    assert t.timeout_s("slow") == 8.0
    assert t.timeout_s(None) is None  # a model not seen yet
    t.observe("slow", 30.0)  # ... two are not
    assert t.timeout_s("slow") == 120.0


def test_a_cut_job_waits_longer_each_time_and_its_last_attempt_the_ceiling() -> None:
    t = Timeouts(ceiling_s=600)
    for _ in range(20):
        t.observe("m", 1.0)
    assert [t.timeout_s("m", cuts=c) for c in range(4)] == [4.0, 16.0, 64.0, 256.0]
    assert t.timeout_s("m", cuts=4) is None  # 1,024 s is past the ceiling: the ceiling
    assert t.timeout_s("m", last=True) is None


def test_never_above_the_ceiling() -> None:
    t = Timeouts(ceiling_s=5)
    for _ in range(20):
        t.observe("m", 3.0)  # 12 s learned: over --timeout 5, which wins
    assert t.timeout_s("m") is None and t.learned_s("m") == 5


def test_follows_a_model_that_slows_down() -> None:
    t = Timeouts(ceiling_s=600)
    for _ in range(256):
        t.observe("m", 0.05)
    for _ in range(16):  # the retries that got through at their longer timeout
        t.observe("m", 3.0)
    assert t.timeout_s("m") == 12.0


def test_a_ceiling_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Timeouts(ceiling_s=0)


@pytest.mark.slow
@given(latencies, st.floats(min_value=0.1, max_value=1e4), st.integers(0, 10))
def test_always_within_floor_and_ceiling(samples: list[float], ceiling: float, cuts: int) -> None:
    t = Timeouts(ceiling_s=ceiling)
    for s in samples:
        t.observe("m", s)
        got = t.timeout_s("m", cuts=cuts)
        assert got is None or min(ceiling, t.rule.floor_s) <= got < ceiling
        learned = t.learned_s("m")
        assert learned is None or min(ceiling, t.rule.floor_s) <= learned <= ceiling


@given(latencies, st.floats(min_value=0.0, max_value=1e3), st.floats(min_value=1.0, max_value=10))
def test_grows_with_latency(samples: list[float], base: float, factor: float) -> None:
    """The same samples made slower never give a shorter timeout."""
    rule = TimeoutRule(min_samples=1)
    a, b = Timeouts(ceiling_s=1e9, rule=rule), Timeouts(ceiling_s=1e9, rule=rule)
    for s in samples:
        a.observe("m", base + s)
        b.observe("m", (base + s) * factor)
        assert (a.learned_s("m") or 0) <= (b.learned_s("m") or 0)


@pytest.mark.slow
@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=20, max_size=255))
def test_no_reply_slower_than_the_p99_is_cut(samples: list[float]) -> None:
    """At least 99% of the window's replies came back within the timeout it gives."""
    t = Timeouts(ceiling_s=1e9, rule=TimeoutRule(multiple=1.0, floor_s=0.0))
    for s in samples:
        t.observe("m", s)
    learned = t.learned_s("m")
    assert learned is not None
    assert sum(s <= learned for s in samples) >= 0.99 * len(samples)


def _burst(latencies: list[float], t: Timeouts) -> list[float]:
    """Every call sent at 0 (as a full bucket lets a batch go at once), answered in order of
    latency; the learned timeout each time a reply comes (inf: none, the ceiling)."""
    order = sorted(latencies)
    learned = []
    for i, latency in enumerate(order):
        out = [0.0] * (len(order) - i - 1)  # the slower ones, still out
        t.observe("m", latency, now=latency, out=out)
        learned.append(t.learned_s("m") or float("inf"))
    return learned


@pytest.mark.slow
@given(
    low=st.floats(min_value=0.05, max_value=10.0),
    spread=st.floats(min_value=1.0, max_value=20.0),
    n=st.integers(min_value=21, max_value=1_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_bursts_first_replies_cut_none_of_the_rest(
    low: float, spread: float, n: int, seed: int
) -> None:
    """The first replies of a burst are its fastest: the timeout they would give (4 x 0.6 s
    of 0.2-4 s) cut half of the burst, billed twice. With the calls still out counted, a
    timeout is learned only once nearly all are back, and none of the burst is cut by it:
    any call still out when a timeout is learned is under it."""
    import random

    rng = random.Random(seed)
    latencies = [rng.uniform(low, low * spread) for _ in range(n)]
    learned = _burst(latencies, Timeouts(ceiling_s=1e9))
    order = sorted(latencies)
    for i, timeout in enumerate(learned):
        assert all(later < timeout for later in order[i + 1 :])


def test_a_hang_among_many_calls_does_not_hold_the_timeout_back() -> None:
    # One call in a hundred out far longer than the replies: a hang, not a slow tail.
    t = Timeouts(ceiling_s=600)
    for i in range(99):
        t.observe("m", 0.05, now=1.0 + 0.05 * i, out=[0.0])  # the hang went at 0
    assert t.learned_s("m") == FLOOR_S
    t = Timeouts(ceiling_s=600)
    for i in range(99):  # ten out as long: a slow tenth, not hangs
        t.observe("m", 0.05, now=1.0 + 0.05 * i, out=[0.0] * 10)
    assert t.learned_s("m") is None
