"""--concurrency auto on its own: the size it picks, and the gate it keeps."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.concurrency import AT_ONCE, FALLBACK, AutoConcurrency
from aiq.limiter import HEADROOM, RateLimiter
from aiq.limiters import Limiters
from aiq.ratelimit_headers import RateLimitInfo, Window


def test_with_no_limit_known_two_requests_go_first() -> None:
    # aiq.capacity opens with two at once: the first back is the latency without a queue at
    # any server, the second says whether there was room for both.
    assert AutoConcurrency(Limiters(), 256).size == 2
    assert AutoConcurrency(Limiters(), 1).size == 1  # max_concurrency 1


def test_a_configured_limit_sizes_for_it_at_an_assumed_second_of_latency() -> None:
    auto = AutoConcurrency(Limiters(rpm=6000), 256)
    # 6,000/min paced at 98%: 98 a second; x 1 s x 1.25, plus two for the ramp, plus two for
    # the presumed bucket's next opening (aiq.budget: one more per answer).
    assert auto.size == math.ceil(98 * 1.0 * 1.25) + 2 + 2 == 127
    assert AutoConcurrency(Limiters(rpm=6000), 40).size == 40  # never over the senders there are
    assert AutoConcurrency(Limiters(tpm=100_000), 256).size == FALLBACK  # no request rate yet


def test_a_model_without_a_limit_gets_senders_beside_those_the_limited_one_needs() -> None:
    limiters = Limiters(per_model={"slow": (600, None)})
    limiters.for_model("slow")
    assert AutoConcurrency(limiters, 256).size == math.ceil(9.8 * 1.25) + 2 + 2 == 17
    # No limit configured or learned: as many beside as the server is found to take, two at
    # first (aiq.capacity).
    limiters.for_model("fast")
    assert AutoConcurrency(limiters, 256).size == 17 + 2


def test_replies_resize_it_to_the_latency_seen() -> None:
    limiters = Limiters()
    auto = AutoConcurrency(limiters, 256)

    async def scenario() -> list[int]:
        sizes = []
        # The first reply says 600 requests a minute (over a sliding minute: no bucket to
        # send at once); it took 2 s.
        limiters.for_model("m").observe(
            RateLimitInfo(Window(600, 599, 59.9), Window(None, None, None))
        )
        assert auto.observe(2.0)
        sizes.append(auto.size)
        assert not auto.observe(2.0)  # within a second of the last sizing: unchanged
        return sizes

    (size,) = asyncio.run(scenario())
    rate = 600 * HEADROOM / 60
    assert size == math.ceil(rate * 2.0 * 1.25) + 2 == 27


def test_a_limit_learned_after_startups_first_reply_sizes_it_at_once() -> None:
    """No limit known, startup's two go; the first reply is probed (size two, sized now);
    the second's headers teach 3,000/min. Held to two for the rest of the second, 50 ms
    replies went at 40 a second where the limit's pace is 49."""
    now = 0.0
    limiters = Limiters()
    auto = AutoConcurrency(limiters, 256, clock=lambda: now)

    async def scenario() -> int:
        nonlocal now
        now = 0.05
        auto.observe(0.05, in_flight=2)
        assert auto.size == 2
        limiters.for_model("m").observe(
            RateLimitInfo(Window(3000, 2998, 59.9), Window(None, None, None))
        )
        now = 0.06
        assert auto.observe(0.06, in_flight=1)
        return auto.size

    assert asyncio.run(scenario()) > 2


def test_a_minutes_bucket_to_send_at_once_lets_every_sender_send() -> None:
    """OpenAI's bucket, full: its content may go at once (the limiter holds it to that)."""
    limiters = Limiters()
    auto = AutoConcurrency(limiters, 256)

    async def scenario() -> int:
        limiters.for_model("m").observe(
            RateLimitInfo(Window(600, 599, 0.1), Window(None, None, None))
        )
        assert auto.observe(2.0)
        return auto.size

    assert asyncio.run(scenario()) == 256


@pytest.mark.parametrize("paced", [True, False], ids=["paced", "a-pause-alone"])
def test_a_sender_waiting_in_a_limiter_lets_the_next_one_through(paced: bool) -> None:
    # Waiting for a paced slot, a sender is not in flight: the next goes. With no pace, a
    # limiter holds a sender only for a 429's pause, which holds every sender: the next
    # waits its turn, or all of them would go at once as the pause ends.
    limiter = RateLimiter(rpm=60) if paced else RateLimiter()
    auto = AutoConcurrency(Limiters.shared(limiter), 1)
    assert auto.size == 1
    order: list[str] = []

    async def paced_sender(release: asyncio.Event) -> None:
        await auto.enter()
        async with auto.pacing(paced=limiter.paces):
            order.append("paced waits")
            await release.wait()
        order.append("paced sends")
        await auto.leave()

    async def other_sender() -> None:
        await auto.enter()
        order.append("other sends")
        await auto.leave()

    async def scenario() -> None:
        release = asyncio.Event()
        first = asyncio.create_task(paced_sender(release))
        await asyncio.sleep(0)
        second = asyncio.create_task(other_sender())
        if paced:
            await asyncio.wait_for(second, 1)  # not held up by the first's wait
        else:
            await asyncio.sleep(0.05)
            assert not second.done()
        release.set()
        await asyncio.gather(first, second)

    asyncio.run(scenario())
    if paced:
        assert order == ["paced waits", "other sends", "paced sends"]
    else:
        assert order == ["paced waits", "paced sends", "other sends"]


def test_opening_the_gate_lets_every_waiting_sender_through() -> None:
    auto = AutoConcurrency(Limiters(), 8)  # size 2

    async def scenario() -> int:
        for _ in range(auto.size):
            await auto.enter()  # the ones allowed, busy
        waiting = [asyncio.create_task(auto.enter()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in waiting)
        auto.open()
        await asyncio.wait_for(asyncio.gather(*waiting), 1)
        return len(waiting)

    assert asyncio.run(scenario()) == 3


# -- sizing to the limits and the latency's spread -------------------------------------------


def _sized(rpm: int, latencies: list[float], cap: int = 100_000) -> AutoConcurrency:
    """An AutoConcurrency for ``rpm`` once replies took ``latencies``, a second apart (so each
    one may resize it)."""
    now = 0.0
    auto = AutoConcurrency(Limiters(rpm=rpm), cap, clock=lambda: now)

    async def replies() -> None:
        nonlocal now
        for latency_s in latencies:
            now += 1.0
            auto.observe(latency_s)

    asyncio.run(replies())
    return auto


def _draws(n: int, draw: Callable[[random.Random], float]) -> list[float]:
    rng = random.Random(0)
    return [max(0.05, draw(rng)) for _ in range(n)]


def test_a_high_tier_at_seconds_of_latency_gets_the_thousands_it_needs() -> None:
    # 30,000/min at 3 s ± 1 s: Little's law needs 490 x 3 = 1,470 in flight on average, and
    # more while the slow replies are out.
    auto = _sized(30_000, _draws(2000, lambda rng: rng.gauss(3.0, 1.0)))
    assert 490 * 3 * 1.3 < auto.size < 490 * 6
    assert auto.held_by is None
    # Under the old cap of 256 it is held there, and says so.
    capped = _sized(30_000, _draws(2000, lambda rng: rng.gauss(3.0, 1.0)), cap=256)
    assert capped.size == 256
    assert capped.held_by == "max_concurrency 256"


def test_the_room_made_grows_with_the_spread_not_only_the_mean() -> None:
    steady = _sized(6000, [3.0] * 500)
    spread = _sized(6000, _draws(500, lambda rng: rng.uniform(1.0, 5.0)))  # the same mean
    # A quarter over a fixed latency (and two for the presumed bucket's next opening).
    assert steady.size == math.ceil(98 * 3.0 * 1.25) + 2 + 2
    assert spread.size > steady.size


def test_until_the_first_reply_the_latency_is_at_least_the_time_waited() -> None:
    now = 0.0
    auto = AutoConcurrency(Limiters(rpm=6000), 100_000, clock=lambda: now)

    async def scenario() -> list[int]:
        nonlocal now
        await auto.enter()  # the first request goes at t=0
        sizes = [auto.size]
        for _ in range(20):  # no reply for 20 s: the provider is slow, not the limit low
            now += 1.0
            auto.tick()
            sizes.append(auto.size)
        await auto.leave()
        return sizes

    sizes = asyncio.run(scenario())
    assert sizes[0] == math.ceil(98 * 1.25) + 2 + 2  # (+2: the presumed bucket's opening)
    assert sizes[-1] == math.ceil(98 * 20 * 1.25) + 2 + 2  # enough to keep 98/s going
    assert sizes == sorted(sizes)


def test_with_no_limit_known_the_capacity_found_sizes_it() -> None:
    now = 0.0
    auto = AutoConcurrency(Limiters(), 256, clock=lambda: now)

    async def scenario() -> tuple[int, int]:
        nonlocal now
        # A server that takes any number in 1 s: each round of replies doubles the limit.
        for _ in range(400):
            now += 1.0 / max(1, auto.size)
            auto.observe(1.0, in_flight=auto.size)
        grown = auto.size
        assert not auto.refused(in_flight=grown)  # a lone 429 is no sign of a limit
        for _ in range(2 * grown):  # but a burst of them is: fewer at once
            auto.refused(in_flight=grown)
        return grown, auto.size

    grown, cut = asyncio.run(scenario())
    assert grown > 32
    assert cut < grown


def test_a_sender_one_too_many_for_a_full_server_holds_its_place_until_the_cut() -> None:
    # Refused by a full server, a sender waits out its job's backoff (else the next job
    # would go into the same full server at once), but no longer than until 429s cut the
    # size, which counts it: held past that, the refused held places in the new size.
    now = 0.0
    auto = AutoConcurrency(Limiters(), 256, clock=lambda: now)

    async def scenario() -> tuple[float, float, float]:
        nonlocal now
        loop = asyncio.get_running_loop()
        for _ in range(200):  # a server that takes any number in 1 s: it grows
            now += 1.0 / max(1, auto.size)
            auto.observe(1.0, in_flight=auto.size)
        assert auto.size > 8
        started = loop.time()
        await auto.one_too_many(auto.cuts, 0.05)  # no cut: the whole backoff
        held = loop.time() - started
        before = auto.cuts
        waiting = asyncio.create_task(auto.one_too_many(before, 30.0))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        for _ in range(100):  # a burst of 429s: cut
            if auto.refused(in_flight=auto.size):
                break
        assert auto.cuts == before + 1
        started = loop.time()
        await asyncio.wait_for(waiting, 1)
        woken = loop.time() - started
        started = loop.time()
        await auto.one_too_many(before, 30.0)  # sent before a cut that has come: no wait
        return held, woken, loop.time() - started

    held, woken, after = asyncio.run(scenario())
    assert held >= 0.045
    assert woken < 0.5
    assert after < 0.01


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    rpm=st.integers(1, 100_000),
    more_rpm=st.integers(0, 100_000),
    latencies=st.lists(st.floats(0.01, 120.0), min_size=1, max_size=30),
    slower_by=st.floats(1.0, 10.0),
    later_by=st.floats(0.0, 30.0),
    cap=st.integers(1, 50_000),
)
def test_the_size_grows_with_rate_and_latency_and_never_passes_the_cap(
    rpm: int, more_rpm: int, latencies: list[float], slower_by: float, later_by: float, cap: int
) -> None:
    base = _sized(rpm, latencies, cap).size
    faster_rate = _sized(rpm + more_rpm, latencies, cap).size
    slower = _sized(rpm, [x * slower_by + later_by for x in latencies], cap).size
    assert 1 <= base <= faster_rate <= cap
    assert base <= slower <= cap


def test_a_server_that_takes_more_than_the_bound_is_held_there_and_it_says_so() -> None:
    now = 0.0
    auto = AutoConcurrency(Limiters(), 64, held_by="the open-files limit (100)", clock=lambda: now)

    async def scenario() -> None:
        nonlocal now
        for _ in range(2000):  # any number served in 1 s each
            now += 1.0 / auto.size
            auto.observe(1.0, in_flight=auto.size)

    asyncio.run(scenario())
    assert auto.size == 64
    assert auto.held_by == "the open-files limit (100)"
    assert auto.senders == 64  # no tasks beyond the bound either


@settings(deadline=None)
@given(
    latency_s=st.floats(0.01, 30.0),
    gaps=st.lists(st.one_of(st.just(0.0), st.floats(0.0, 2.0)), min_size=1, max_size=300),
)
def test_with_no_limit_known_sends_past_a_few_at_once_are_spaced(
    latency_s: float, gaps: list[float]
) -> None:
    """Sends asked for at any times go when asked or later, in order; in any stretch of time
    no more than ``AT_ONCE`` and one per spacing go; and one asked for no sooner than a
    spacing after the last one's turn never waits (the pace costs a steady run nothing)."""
    now = 0.0
    auto = AutoConcurrency(Limiters(), 256, clock=lambda: now)
    assert auto.send_delay_s() == 0.0  # no reply yet: nothing to space by
    auto.observe(latency_s)
    spacing = auto.send_spacing_s
    assert spacing == pytest.approx(latency_s / (2 * auto.size))
    went: list[float] = []
    for gap in gaps:
        now += gap
        delay = auto.send_delay_s()
        assert delay >= 0.0
        if went and now >= went[-1] + spacing * 1.000001 and delay:
            assert delay <= spacing * 1e-6 + 1e-9  # (float steps)
        went.append(now + delay)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(went))
    for i in range(len(went)):
        for j in range(i + AT_ONCE, len(went)):
            # j - i + 1 sends in [went[i], went[j]]: at most AT_ONCE plus one per spacing.
            assert went[j] - went[i] >= (j - i + 1 - AT_ONCE) * spacing * (1 - 1e-9) - 1e-9


def test_a_bunch_of_sends_with_no_limit_known_goes_a_few_at_once_then_spaced() -> None:
    """Sixty-four asked for at once, replies taking 0.2 s at a size of two: eight go now, the
    rest a twentieth of a second apart (twice the size's rate), none later than needed."""
    now = 0.0
    auto = AutoConcurrency(Limiters(), 256, clock=lambda: now)
    auto.observe(0.2)
    assert auto.size == 2
    delays = [auto.send_delay_s() for _ in range(64)]
    assert delays[:AT_ONCE] == [0.0] * AT_ONCE
    assert delays[AT_ONCE:] == pytest.approx([0.05 * k for k in range(1, 64 - AT_ONCE + 1)])
