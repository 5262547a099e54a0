"""--concurrency auto on its own: the size it picks, and the gate it keeps."""

from __future__ import annotations

import asyncio
import math

from aiq.concurrency import FALLBACK, AutoConcurrency
from aiq.limiter import HEADROOM, Limiters, RateLimiter
from aiq.ratelimit_headers import RateLimitInfo, Window


def test_with_no_limit_known_one_request_goes_first() -> None:
    assert AutoConcurrency(Limiters(), 256).size == 1


def test_a_configured_limit_sizes_for_it_at_an_assumed_second_of_latency() -> None:
    auto = AutoConcurrency(Limiters(rpm=6000), 256)
    # 6,000/min paced at 98%: 98 a second; x 1 s x 1.25, plus two for the ramp.
    assert auto.size == math.ceil(98 * 1.0 * 1.25) + 2 == 125
    assert AutoConcurrency(Limiters(rpm=6000), 40).size == 40  # never over the senders there are
    assert AutoConcurrency(Limiters(tpm=100_000), 256).size == FALLBACK  # no request rate yet


def test_a_model_without_a_limit_gets_senders_beside_those_the_limited_one_needs() -> None:
    limiters = Limiters(per_model={"slow": (600, None)})
    limiters.for_model("slow")
    assert AutoConcurrency(limiters, 256).size == math.ceil(9.8 * 1.25) + 2 == 15
    limiters.for_model("fast")  # no limit configured or learned: any number of senders
    assert AutoConcurrency(limiters, 256).size == 15 + FALLBACK


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


def test_a_sender_waiting_in_a_limiter_lets_the_next_one_through() -> None:
    auto = AutoConcurrency(Limiters.shared(RateLimiter()), 8)  # size 1: no limit known
    order: list[str] = []

    async def paced_sender(release: asyncio.Event) -> None:
        await auto.enter()
        async with auto.pacing():
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
        await asyncio.wait_for(second, 1)  # not held up by the first's wait
        release.set()
        await first

    asyncio.run(scenario())
    assert order == ["paced waits", "other sends", "paced sends"]


def test_opening_the_gate_lets_every_waiting_sender_through() -> None:
    auto = AutoConcurrency(Limiters(), 8)  # size 1

    async def scenario() -> int:
        await auto.enter()  # the one allowed, busy
        waiting = [asyncio.create_task(auto.enter()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in waiting)
        auto.open()
        await asyncio.wait_for(asyncio.gather(*waiting), 1)
        return len(waiting)

    assert asyncio.run(scenario()) == 3
