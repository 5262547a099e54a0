"""The circuit breaker, driven by a fake clock: no test here sleeps.

Its promises: scattered failures never open it; most recent calls failing as a down provider
fails do (and not before ``min_calls``); while open, one probe at a time at growing intervals;
the first answer from the provider closes it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from fakes import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.breaker import Breakers, CircuitBreaker


def breaker(clock: FakeClock, **kw: float) -> CircuitBreaker:
    return CircuitBreaker(clock=clock, **kw)  # type: ignore[arg-type]


def opened(clock: FakeClock, **kw: float) -> CircuitBreaker:
    """A breaker (window 20, min_calls 10) opened by ten outage-like failures."""
    b = breaker(clock, **kw)
    for _ in range(10):
        b.record(outage_like=True)
    assert b.is_open
    return b


def next_probe(b: CircuitBreaker, clock: FakeClock) -> float:
    """Move the clock to the moment ``admit()`` lets the next probe out; return the wait."""
    waited = 0.0
    while (wait := b.admit()) > 0:
        clock.now += wait
        waited += wait
    return waited


# -- closed ----------------------------------------------------------------------------------


def test_scattered_failures_never_open_it() -> None:
    clock = FakeClock()
    b = breaker(clock)
    rng = random.Random(3)
    failures = 0
    for _ in range(5000):
        assert b.admit() == 0.0
        failed = rng.random() < 0.08
        failures += failed
        b.record(outage_like=failed)
        clock.now += 0.01
    assert 300 < failures < 500  # the 8% really happened
    assert not b.is_open
    assert b.outage_s() == 0.0


def test_failures_that_are_not_outage_like_never_open_it() -> None:
    # A 400 or a 429 is the provider answering: the worker records those as not outage-like.
    b = breaker(FakeClock())
    for _ in range(100):
        b.record(outage_like=False)
    assert not b.is_open


def test_opens_when_most_recent_calls_fail_but_not_before_min_calls() -> None:
    b = breaker(FakeClock())
    for _ in range(9):
        b.record(outage_like=True)
    assert not b.is_open  # 9 of 9 failed, but 10 calls are needed to judge
    b.record(outage_like=True)
    assert b.is_open


def test_opens_at_the_threshold_share_of_the_window() -> None:
    b = breaker(FakeClock())  # window 20, threshold 0.8: 16 of the last 20
    for _ in range(5):
        b.record(outage_like=False)
    for _ in range(15):
        b.record(outage_like=True)
    assert not b.is_open  # 15 of 20
    b.record(outage_like=True)  # the oldest success leaves the window: 16 of 20
    assert b.is_open


def test_most_but_not_enough_fail_keeps_it_closed() -> None:
    b = breaker(FakeClock())
    for i in range(1000):  # 3 of every 4 fail: most, but under the 0.8 threshold
        b.record(outage_like=i % 4 != 0)
    assert not b.is_open


# -- open ------------------------------------------------------------------------------------


def test_open_admits_the_first_probe_after_the_base_interval() -> None:
    clock = FakeClock()
    b = opened(clock)
    assert b.admit() == pytest.approx(1.0)
    clock.now += 0.4
    assert b.admit() == pytest.approx(0.6)
    clock.now += 0.6
    assert b.admit() == 0.0  # the probe
    assert b.admit() > 0  # and nothing else while it is out


def test_exactly_one_probe_at_a_time_however_long_it_takes() -> None:
    clock = FakeClock()
    b = opened(clock)
    next_probe(b, clock)
    for _ in range(100):  # a probe hanging for 100 s: nobody else goes
        clock.now += 1.0
        assert b.admit() > 0
    assert b.admit() <= 1.0  # callers look again soon, to catch the probe's answer


def test_probes_go_at_growing_intervals_up_to_the_cap() -> None:
    clock = FakeClock()
    b = opened(clock, probe_base_s=1.0, probe_cap_s=30.0)
    waits = []
    for _ in range(8):
        waits.append(next_probe(b, clock))
        assert b.admit() > 0  # one at a time
        clock.now += 0.25  # the probe's latency, before it fails
        b.record(outage_like=True, probe=True)
        assert b.is_open
    # Each wait from the last probe's answer (the first from the opening).
    assert waits == pytest.approx([1, 2, 4, 8, 16, 30, 30, 30])


def test_a_long_outage_keeps_probing_at_the_cap() -> None:
    # Regression: the interval was 2.0 ** failed_probes, which overflows after 1,024 of them
    # (8.5 h at a 30 s cap, within reach of a large --max-outage).
    clock = FakeClock()
    b = opened(clock, probe_cap_s=30.0)
    for _ in range(1100):
        next_probe(b, clock)
        b.record(outage_like=True, probe=True)
    assert next_probe(b, clock) == pytest.approx(30.0)


def test_an_answered_probe_closes_it() -> None:
    clock = FakeClock()
    b = opened(clock)
    next_probe(b, clock)
    b.record(outage_like=False)
    assert not b.is_open
    assert b.admit() == 0.0 and b.admit() == 0.0  # everyone goes again
    assert b.outage_s() == 0.0


def test_closing_forgets_the_failures_before_it() -> None:
    b = opened(FakeClock())
    b.record(outage_like=False)
    for _ in range(9):
        b.record(outage_like=True)
    assert not b.is_open  # min_calls counts from the close again


def test_a_success_from_a_call_sent_before_it_opened_closes_it() -> None:
    clock = FakeClock()
    b = opened(clock)
    clock.now += 0.3
    assert b.admit() > 0  # no probe yet
    b.record(outage_like=False)  # a call that was in flight when it opened came back 200
    assert not b.is_open
    assert b.admit() == 0.0


def test_failures_of_calls_sent_before_it_opened_change_nothing() -> None:
    clock = FakeClock()
    b = opened(clock)
    for _ in range(30):
        b.record(outage_like=True)
    assert b.admit() == pytest.approx(1.0)  # the first probe is still due a second after opening


def test_outage_s_grows_while_open() -> None:
    clock = FakeClock()
    b = breaker(clock)
    assert b.outage_s() == 0.0
    for _ in range(10):
        b.record(outage_like=True)
    clock.now += 2.5
    assert b.outage_s() == pytest.approx(2.5)
    clock.now += 40.0
    assert b.outage_s() == pytest.approx(42.5)
    next_probe(b, clock)
    b.record(outage_like=False)
    assert b.outage_s() == 0.0


def test_a_stale_failure_during_a_probe_does_not_let_a_second_probe_out() -> None:
    clock = FakeClock()
    b = opened(clock)  # calls sent before it opened are still in flight (a hanging provider)
    next_probe(b, clock)  # the probe hangs too
    clock.now += 5.0
    b.record(outage_like=True)  # one of the earlier calls times out
    clock.now += 5.0
    assert b.admit() > 0  # the probe is still out


# -- properties --------------------------------------------------------------------------------


@dataclass
class Call:
    probe: bool  # let out by admit() while open: that opening's probe


Action = tuple[str, float, int, bool]  # (kind, clock step, which call, outage-like)


_KINDS = ("call", "call", "finish", "finish", "tick")


@st.composite
def actions(draw: st.DrawFn) -> list[Action]:
    # A per-example failure rate, so some sequences open the breaker and some stay near the line.
    fail_per_20 = draw(st.integers(0, 20))
    # One integer per action, decoded below: a tuple of four draws made this test ~4x slower.
    codes = draw(st.lists(st.integers(0, 2**24 - 1), min_size=40, max_size=150))
    return [
        (
            _KINDS[code % 5],
            (code >> 3) % 101 / 10,  # 0 to 10 s in steps of 0.1
            (code >> 10) % 64,
            (code >> 16) % 20 < fail_per_20,
        )
        for code in codes
    ]


def simulate(
    steps: list[Action],
    *,
    window: int,
    min_calls: int,
    threshold: float,
    stale_failures_during_probes: bool,
) -> None:
    """Drive a breaker as the worker does (admit before each call, record every call's outcome)
    and check its promises after every step against a model of the last ``window`` outcomes."""
    clock = FakeClock()
    b = CircuitBreaker(
        window=window,
        min_calls=min_calls,
        threshold=threshold,
        probe_base_s=1.0,
        probe_cap_s=8.0,
        clock=clock,
    )
    recent: list[bool] = []  # the outcomes recorded while closed, since it last closed
    in_flight: list[Call] = []
    for kind, step, which, outage_like in steps:
        if kind == "tick":
            clock.now += step
        elif kind == "call":
            if b.admit() > 0:
                assert b.is_open  # closed, every call goes
                continue
            probe = b.is_open
            if probe:
                assert not any(c.probe for c in in_flight), "two probes out at once"
            in_flight.append(Call(probe))
        elif in_flight:
            call = in_flight[which % len(in_flight)]
            probe_out = any(c.probe for c in in_flight)
            if not stale_failures_during_probes and outage_like and probe_out and not call.probe:
                continue  # this model lets only the probe fail while it is out
            in_flight.remove(call)
            was_open = b.is_open
            b.record(outage_like, probe=call.probe)
            if not was_open:
                recent = [*recent, outage_like][-window:]
                should_open = len(recent) >= min_calls and sum(recent) >= threshold * len(recent)
                assert b.is_open == should_open
            elif not outage_like:
                assert not b.is_open  # the provider answered
            else:
                assert b.is_open
            if not b.is_open:
                if was_open:
                    recent = []
                for c in in_flight:  # probes of an opening that is over are ordinary calls
                    c.probe = False
        assert b.outage_s() >= 0.0
        assert b.is_open or b.outage_s() == 0.0


breaker_settings = {
    "window": st.integers(1, 12),
    "min_calls": st.integers(1, 12),
    "threshold": st.sampled_from([0.5, 0.8, 0.9, 1.0]),
}


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(steps=actions(), **breaker_settings)
def test_opens_exactly_when_the_window_holds_the_threshold_and_probes_one_at_a_time(
    steps: list[Action], window: int, min_calls: int, threshold: float
) -> None:
    simulate(
        steps,
        window=window,
        min_calls=min(min_calls, window),
        threshold=threshold,
        stale_failures_during_probes=False,
    )


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(steps=actions(), **breaker_settings)
def test_one_probe_at_a_time_even_when_earlier_calls_fail_meanwhile(
    steps: list[Action], window: int, min_calls: int, threshold: float
) -> None:
    simulate(
        steps,
        window=window,
        min_calls=min(min_calls, window),
        threshold=threshold,
        stale_failures_during_probes=True,
    )


def test_a_probe_that_was_never_sent_lets_the_next_one_go() -> None:
    # The worker let a job out as the probe, then did not send it (too large for the limits,
    # or the run stopping): without cancel_probe() no probe would ever go again.
    clock = FakeClock()
    b = opened(clock)
    next_probe(b, clock)
    assert b.admit() > 0
    b.cancel_probe()
    assert b.admit() == 0.0 and b.is_open  # the next probe, at once: the last one never went


# -- an endpoint that never answered -----------------------------------------------------------


def test_an_endpoint_that_never_answered_is_given_up_after_three_calls_over_two_seconds() -> None:
    clock = FakeClock()
    b = breaker(clock)
    b.record(outage_like=True, unreachable=True)
    clock.now += 1.0
    b.record(outage_like=True, unreachable=True)
    b.record(outage_like=True, unreachable=True)
    assert not b.never_reached()  # three calls, but within a second: a server still starting
    clock.now += 0.99
    assert not b.never_reached()
    clock.now += 0.01
    assert b.never_reached()  # 2 s since the first failed to connect, and none got through


def test_calls_over_two_seconds_are_not_enough_without_the_third() -> None:
    clock = FakeClock()
    b = breaker(clock)
    b.record(outage_like=True, unreachable=True)
    clock.now += 30.0
    b.record(outage_like=True, unreachable=True)
    assert not b.never_reached()
    b.record(outage_like=True, unreachable=True)
    assert b.never_reached()


def test_calls_that_timed_out_connecting_count_from_when_they_were_sent() -> None:
    # Three calls to a host that drops packets, each giving up after a 10 s connect timeout:
    # they tried for long enough already.
    clock = FakeClock()
    b = breaker(clock)
    for _ in range(3):
        b.record(outage_like=True, unreachable=True, took_s=10.0)
    assert b.never_reached()


@pytest.mark.parametrize("answer", ["success", "http_error", "read_timeout"])
def test_an_endpoint_that_answered_once_is_never_given_up_that_way(answer: str) -> None:
    # Whatever came back (a reply, an HTTP error, a connection that was made and then timed
    # out), something is there: from then on an outage is the breaker's and --max-outage's.
    clock = FakeClock()
    b = breaker(clock)
    b.record(outage_like=True, unreachable=True)
    b.record(outage_like=answer != "success")
    for _ in range(50):
        clock.now += 1.0
        b.record(outage_like=True, unreachable=True, probe=b.is_open)
    assert b.reached and not b.never_reached()


# -- one breaker per endpoint and model --------------------------------------------------------

CHAT = "/v1/chat/completions"
GOOD, BAD = (CHAT, "good-model"), (CHAT, "bad-model")


def breakers(clock: FakeClock) -> Breakers:
    return Breakers(clock=clock)


def test_a_broken_model_opens_its_own_breaker_and_the_provider_is_not_down() -> None:
    clock = FakeClock()
    b = breakers(clock)
    for _ in range(20):
        b.record(GOOD, False)
        b.record(BAD, True)
    assert b.get(BAD).is_open and not b.get(GOOD).is_open
    assert b.any_open and not b.all_down  # the good model answers: the provider is up
    assert b.outage_s() == 0.0
    assert b.broken(BAD) and not b.broken(GOOD) and not b.broken((CHAT, "unseen"))


def test_the_provider_is_down_once_every_model_that_answered_fails() -> None:
    clock = FakeClock()
    b = breakers(clock)
    b.record(GOOD, False)
    for _ in range(10):
        b.record(BAD, True)
    clock.now += 7.0
    for _ in range(10):
        b.record(GOOD, True)
    assert b.all_down
    clock.now += 3.0
    # Down since the last of them opened (3 s), not since the first (10 s): until then a
    # model answered.
    assert b.outage_s() == pytest.approx(3.0)
    b.record(GOOD, False)  # one model answers again: up, though the other is still open
    assert not b.all_down and b.get(BAD).is_open
    assert b.outage_s() == 0.0


def test_a_model_never_reached_is_no_sign_of_the_provider_being_up() -> None:
    # Its breaker is closed only because it has not been tried: no model answered yet.
    b = breakers(FakeClock())
    b.get(GOOD)
    for _ in range(10):
        b.record(BAD, True)
    assert b.all_down


def test_a_refused_connection_counts_against_every_models_breaker() -> None:
    # Refused, no host: the endpoint, not a model. Ten such calls, whichever model's, open
    # every breaker, as the one breaker of the whole endpoint did.
    clock = FakeClock()
    b = breakers(clock)
    b.record(GOOD, False)
    b.record(BAD, False)
    for _ in range(10):
        b.record(BAD, True, unreachable=True)
    assert b.get(GOOD).is_open and b.get(BAD).is_open and b.all_down


def test_an_endpoint_never_reached_is_given_up_on_across_models() -> None:
    clock = FakeClock()
    b = breakers(clock)
    b.record(GOOD, True, unreachable=True)
    b.record(BAD, True, unreachable=True)
    clock.now += 2.0
    assert not b.never_reached()  # two calls: the third may find the server started
    b.record((CHAT, "third"), True, unreachable=True)
    assert b.never_reached()
    b.record(GOOD, True)  # an answer, whatever it said, from any model: reached
    assert not b.never_reached()


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 30)),
        max_size=120,
    )
)
def test_any_open_and_all_down_follow_the_breakers(
    calls: list[tuple[int, bool, bool, int]],
) -> None:
    clock = FakeClock()
    b = breakers(clock)
    keys = [(CHAT, f"m{i}") for i in range(3)]
    for which, failed, unreachable, step in calls:
        clock.now += step / 10
        key = keys[which]
        probe = b.get(key).is_open and b.get(key).admit() == 0.0
        b.record(key, failed or unreachable, probe=probe, unreachable=unreachable)
        made = [b.get(k) for k in keys]
        assert b.any_open == any(m.is_open for m in made)
        answering = [m for m in made if m.reached and not m.is_open]
        assert b.all_down == (b.any_open and not answering)
        assert b.outage_s() >= 0.0 and (b.all_down or b.outage_s() == 0.0)
