"""The capacity probe (aiq.capacity) against a simulated server: a number of slots, each serving
one request at a time for a drawn latency, and a queue in front of them. A client keeps as many
requests out as the probe allows; time is the simulation's, so nothing sleeps."""

from __future__ import annotations

import heapq
import random
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aiq.capacity import CapacityProbe


@dataclass
class Run:
    limits: list[int] = field(default_factory=list)  # the probe's limit after each reply
    latencies: list[float] = field(default_factory=list)
    replied: list[float] = field(default_factory=list)  # when each reply came
    most_in_flight: int = 0
    took_s: float = 0.0
    refused: list[float] = field(default_factory=list)  # when each 429 came

    def settled(self) -> list[int]:
        """The limits over the second half of the run, once startup is long over."""
        return self.limits[len(self.limits) // 2 :]


def simulate(
    slots: int,
    service_s: Callable[[random.Random], float],
    jobs: int,
    *,
    ceiling: int = 10_000,
    seed: int = 0,
    refuse_over: int | None = None,
    refuse_share: float = 0.0,
    more_slots: tuple[float, int] | None = None,
) -> tuple[Run, CapacityProbe]:
    """Send ``jobs`` requests to a server with ``slots`` (and, with ``refuse_over``, a 429 for
    any request beyond that many in flight, as a gateway's parallel limit gives; with
    ``refuse_share``, a 429 for that share of requests at random; with ``more_slots`` (at,
    slots), that many slots from then on), keeping the probe's limit in flight."""
    rng = random.Random(seed)
    refusals = random.Random(seed + 1)
    now = 0.0
    probe = CapacityProbe(ceiling=ceiling, clock=lambda: now)
    run = Run()
    finishing: list[tuple[float, int, float]] = []  # (done at, tie-break, sent at)
    waiting: deque[float] = deque()  # sent, queued at the server
    busy = in_flight = sent = seq = 0

    def serve(sent_at: float) -> None:
        nonlocal busy, seq
        busy += 1
        seq += 1
        heapq.heappush(finishing, (now + service_s(rng), seq, sent_at))

    def send() -> None:
        nonlocal in_flight, sent
        while in_flight < probe.limit and sent < jobs:
            if refuse_over is not None and in_flight >= refuse_over:
                probe.cut(in_flight + 1)  # answered 429 at once; the job is tried again later
                run.refused.append(now)
                break
            if refuse_share and refusals.random() < refuse_share:
                probe.cut(in_flight + 1)  # answered 429 at once; tried again at once
                run.refused.append(now)
                continue
            in_flight += 1
            sent += 1
            run.most_in_flight = max(run.most_in_flight, in_flight)
            if busy < slots:
                serve(now)
            else:
                waiting.append(now)

    send()
    while finishing:
        now, _, sent_at = heapq.heappop(finishing)
        busy -= 1
        if more_slots is not None and now >= more_slots[0]:
            slots, more_slots = more_slots[1], None
        while waiting and busy < slots:
            serve(waiting.popleft())
        probe.observe(now - sent_at, in_flight)
        in_flight -= 1
        run.limits.append(probe.limit)
        run.latencies.append(now - sent_at)
        run.replied.append(now)
        send()
    run.took_s = now
    return run, probe


def _fixed(seconds: float) -> Callable[[random.Random], float]:
    return lambda rng: seconds


@pytest.mark.parametrize(
    "service_s",
    [
        _fixed(0.8),
        lambda rng: rng.uniform(0.3, 1.3),  # output lengths vary
        lambda rng: rng.expovariate(1 / 0.8),  # a long tail
    ],
    ids=["fixed", "uniform", "exponential"],
)
def test_a_server_that_serves_one_at_a_time_gets_about_one(
    service_s: Callable[[random.Random], float],
) -> None:
    # Over many draws: a false "it grew" now and then costs a step or two of startup (3, 5,
    # 9), never 32 in flight, and the cycle's deeper drain takes the queue it built away
    # again. Startup opens with two at once, and at an exponential service time the second
    # comes back within a twentieth of a latency of the first one time in twenty, taken for
    # room: over 128 draws, 5 went over five (2 when startup began at one), at most 9 (7).
    runs = [simulate(1, service_s, 300, seed=seed)[0] for seed in range(64)]
    most = sorted(run.most_in_flight for run in runs)
    assert most[-1] <= 9
    assert most[-len(runs) // 16 - 1] <= 5  # all but one draw in sixteen
    assert statistics.median(most) <= 3
    assert statistics.median(statistics.mean(run.settled()) for run in runs) <= 1.5
    # No throughput lost to it: 300 jobs in about 300 mean service times (0.8 s each), as
    # one at a time would take.
    assert max(run.took_s for run in runs) <= 300 * 0.8 * 1.15


@pytest.mark.parametrize(("jobs", "median_s", "worst_s"), [(100, 8, 15), (1000, 12, 30)])
def test_a_server_with_room_to_spare_is_reached_in_a_few_round_trips(
    jobs: int, median_s: float, worst_s: float
) -> None:
    # The demo's simulated provider: no limit, 0.5 s jittered 0.5x-1.5x. A noisy reply among
    # the first few (one lucky short one as the bar) held startup at two or three for dozens
    # of replies: 100 jobs took 12 s (median of 16 draws, worst 22), 1,000 took 16 s (worst
    # 86, where startup ended at five). Now 6.8 s (worst 11.7) and 9.9 s (worst 15.9).
    runs = [
        simulate(100_000, lambda rng: rng.uniform(0.25, 0.75), jobs, seed=s)[0] for s in range(16)
    ]
    assert statistics.median(run.took_s for run in runs) <= median_s
    assert max(run.took_s for run in runs) <= worst_s


def test_its_latency_stays_near_the_servers_own() -> None:
    run, _ = simulate(1, _fixed(0.8), 300)
    # 32 in flight would make every request wait for 31 others: 25 s, not 0.8 s.
    assert statistics.median(run.latencies) <= 1.6


def test_a_server_with_200_slots_gets_about_200() -> None:
    run, probe = simulate(200, _fixed(1.0), 20_000)
    settled = run.settled()
    assert 170 <= statistics.median(settled) <= 260  # well above the 32 a fixed guess gave
    assert run.most_in_flight <= 2 * 257  # startup overshoots by one step at most (257 to 513)
    assert not probe.capped
    # Throughput near the 200/s the server gives: 20,000 jobs in ~100 s, plus the ramp.
    assert run.took_s <= 140


@pytest.mark.slow
def test_a_large_gateway_with_a_spread_of_latency_gets_hundreds() -> None:
    run, _ = simulate(1000, lambda rng: max(0.1, rng.gauss(3.0, 1.0)), 60_000)
    assert 850 <= statistics.median(run.settled()) <= 1300


def test_a_few_slots_with_noisy_latency_get_a_few() -> None:
    run, _ = simulate(4, lambda rng: rng.lognormvariate(0, 0.5), 600)
    assert 3 <= statistics.median(run.settled()) <= 8


def test_the_ceiling_bounds_it_and_says_so() -> None:
    run, probe = simulate(1000, _fixed(1.0), 20_000, ceiling=100)
    assert max(run.limits) == 100 == run.most_in_flight
    assert probe.capped  # the server took every one: it would take more


def test_a_parallel_limit_answered_with_429s_cuts_it_below_the_limit() -> None:
    run, _ = simulate(1000, _fixed(1.0), 5_000, refuse_over=50)
    assert run.most_in_flight <= 50
    assert 20 <= statistics.median(run.settled()) <= 50


def test_a_parallel_limit_found_is_held_not_probed_into_again_and_again() -> None:
    # LiteLLM's max_parallel_requests of 8 at 0.2 s: a cut back to 0.7 of what was out,
    # then probes over the limit every few rounds, drew 7% of the calls in 429s at 0.75 of the
    # throughput. Now the cut goes back to the most a round had with no 429, and nothing over
    # it is tried for 30 s: the cut goes to the most the 429 allows (refused with 8 out: no
    # more than 8), and the cycle does not drain below a limit held there, where the server
    # queued nothing (cut from startup's 9 to 6, then drains to 7: 1.03 of the least).
    run, _ = simulate(1000, _fixed(0.2), 5_000, refuse_over=8)
    least = 5_000 / 8 * 0.2
    assert run.took_s <= 1.02 * least
    assert 7 <= statistics.median(run.settled()) <= 8
    later = [t for t in run.refused if t >= 10.0]
    assert len(later) <= 0.005 * 5_000  # a probe over it now and then, every 30 s


def test_a_server_found_full_is_held_one_under_where_it_refused() -> None:
    """A 429's pause tested and the server found full (LiteLLM's parallel limit, refused at
    9 in startup): 8 from then on, startup over, nothing over it tried for a while."""
    now = 0.0
    probe = CapacityProbe(ceiling=1000, clock=lambda: now)
    probe.limit = 17  # (startup's step past the refused 9, before the pause ended)
    assert probe.full(9) and probe.limit == 8
    for _ in range(200):  # a steady 8 at 0.2 s for 5 s: the cycle probes none over it
        now += 0.025
        probe.observe(0.2, 8)
        assert probe.limit == 8


def test_each_startup_step_takes_one_round_when_replies_come_back_bunched() -> None:
    """Replies that come back together (within a tenth of a latency) count for the step
    their last one set off: the requests sent for the earlier ones went as it changed. From
    the bunch's second reply only, the step to 9 took a round trip more at five."""
    run, _ = simulate(8, lambda rng: 0.2 + rng.uniform(0, 0.003), 120, seed=3)
    steps = [i for i in range(1, len(run.limits)) if run.limits[i] != run.limits[i - 1]]
    # The opening's two back together: 3 at the second reply (3 replies at one, then a round
    # at two, before), one round at 3; at 5 one reply more (the bar holds five replies where
    # a start at one had eight, and 1.25x from 4 to 5 needs six to be sure), so 9 at the
    # reply a round trip after the bunch, and a round more at 9 for it.
    assert steps[:4] == [1, 4, 10, 23], steps
    assert run.replied[steps[2]] <= 0.81  # 9 in flight by four round trips (six before)


@pytest.mark.parametrize(
    ("slots", "service_s", "limits"),
    [
        (2, _fixed(0.2), [2, 3]),  # back together: room for two
        (1, _fixed(0.2), [2, 2, 1]),  # the second a service time later: one, for the bar
        (100, lambda rng: rng.uniform(0.1, 0.3), [2, 2, 1]),  # in doubt: the bar at one too
    ],
    ids=["two-slots", "one-slot", "noisy"],
)
def test_startup_opens_with_two_at_once(
    slots: int, service_s: Callable[[random.Random], float], limits: list[int]
) -> None:
    # The first of two sent at once queued behind nothing at any server: the bar's first
    # reply. The rest of the round says whether the server had room for both, or, in doubt,
    # the bar is taken at one and the round judged against it.
    run, _ = simulate(slots, service_s, 40, seed=1)
    assert run.limits[: len(limits)] == limits


def test_replies_to_requests_sent_before_a_change_do_not_count_for_it() -> None:
    now = 0.0
    probe = CapacityProbe(ceiling=100, clock=lambda: now)
    start = probe.limit
    # A reply that left before the probe began is no news of any limit the probe set.
    for _ in range(20):
        now += 1.0
        assert not probe.observe(latency_s=now + 1, in_flight=1)
    assert probe.limit == start


def test_too_few_jobs_to_fill_the_limit_say_nothing_of_the_server() -> None:
    now = 0.0
    probe = CapacityProbe(ceiling=100, clock=lambda: now)
    probe.limit = 16  # as if startup had got there
    for _ in range(200):  # one request at a time, 1 s each: the run has run out of jobs
        now += 1.0
        probe.observe(latency_s=1.0, in_flight=1)
    assert probe.limit == 16  # neither grown nor cut: the server was never asked for more


def test_a_429_now_and_then_does_not_keep_a_large_server_small() -> None:
    # The simulated provider (and a busy upstream) refuses a few requests at random: no sign
    # of a limit on how many may be in flight.
    # (Now and then three fall in one small round and cut it; it grows back by probing.)
    run, _ = simulate(200, _fixed(1.0), 20_000, refuse_share=0.05)
    assert statistics.median(run.settled()) >= 80


def test_a_noisy_round_never_ends_a_large_servers_ramp_early() -> None:
    # One round measured low (latency spread) used to end startup at a small limit, and the
    # probes then grew it by a quarter a six-round cycle: 162 s for what takes ~78 s (seed 3).
    # (88-106 s now; seed 5, 112 s: its first replies were short by chance, so two in flight
    # looked flat, and startup went back to one for nine more replies before trying again.)
    ideal = 5000 / 64 * 1.0
    for seed in range(8):
        run, _ = simulate(64, lambda rng: max(0.1, rng.gauss(1.0, 1 / 3)), 5000, seed=seed)
        assert run.took_s <= 1.5 * ideal, (seed, run.took_s)


def test_a_server_that_gains_room_is_climbed_to_in_a_few_round_trips() -> None:
    # Four slots for 10 s, then 200 (another client on the server stopped). Probes of a
    # quarter each took 13 s to get there; two that find room in a row start startup again.
    run, _ = simulate(4, _fixed(0.2), 30_000, more_slots=(10.0, 200))
    reached = next(at for at, limit in zip(run.replied, run.limits, strict=True) if limit >= 150)
    assert reached - 10.0 <= 5.0, reached


def test_a_steady_server_is_not_drained_below_its_slots() -> None:
    # Latency steady to the millisecond: startup's steps are read exactly, so no queue of a
    # step the server had no room for stays, and the bar needs no more replies before a
    # round is called flat. Before, the bar went back from 5 to 3 for more replies, and the
    # first drain went to 3: 0.937 of the least at four slots of 0.2 s (bench f-four-slots).
    run, _ = simulate(4, _fixed(0.2), 400)
    after = run.limits[run.limits.index(4) :]
    assert min(after) >= 4
    assert run.took_s <= 400 / 4 * 0.2 / 0.96


@settings(max_examples=30, deadline=None)
@given(slots=st.integers(1, 4), latency_s=st.floats(0.05, 5.0))
def test_a_server_of_a_few_slots_is_sent_one_more_at_most(slots: int, latency_s: float) -> None:
    # Startup's steps are 1, 2, 3, 5: a server of one, two or four slots sees one request more
    # than it serves (the least that shows nothing is gained), three slots two more; never
    # twice as many (a doubling startup sent eight to four). The probe settles on it.
    run, _ = simulate(slots, _fixed(latency_s), 60 * slots)
    assert run.most_in_flight <= slots + 1 + (slots == 3)
    assert slots <= statistics.median(run.settled()) <= slots + 1


@settings(max_examples=20, deadline=None)
@given(slots=st.integers(5, 300), latency_s=st.floats(0.05, 5.0))
@example(slots=221, latency_s=1.0)  # the edge: 257 read as grown, then 513
def test_a_larger_server_is_found_within_a_step(slots: int, latency_s: float) -> None:
    # Above four the step doubles, and a round grew if throughput rose by three quarters of
    # it. A limit L = 2p over a server of s slots (L <= 2s) queues L - s for a second
    # service time: Little's law reads L^2 / (2L - s), which clears p + 0.75 p while
    # p <= 7s/12. So the last limit that grew is at most 7/6 of the size, and the next at
    # most 7/3 of it (221 slots went to 513, 2.32x: a 2.3 bound failed a CI run). The probe
    # settles near the size.
    run, _ = simulate(slots, _fixed(latency_s), 40 * slots)
    assert run.most_in_flight <= 7 / 3 * slots + 2
    assert 0.8 * slots <= statistics.median(run.settled()) <= 1.3 * slots + 1
