"""A server that refuses a few calls at random is no limit to learn (aiq.refusal_limit), on a
fake clock: the simulated provider's 5% of transient 429s, each with a short ``retry-after-ms``,
and a busy upstream's now and then.

Five 429s in a row, none of the requests sent after the first getting through, is what shows
a limit. With hundreds in flight a 429 comes back before the requests sent just after its
own have had time to (a refusal is quick, a generation is not), so five random ones could
stand in a row for a latency: the limit learned from them was what got through, and every
later random 429 lowered it, down to 20 a minute in a run of 20,000 on the simulated provider.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from fakes import SharedClock

from aiq.limiter import RateLimiter

pytestmark = pytest.mark.slow  # a few seconds of fake-clock events


def run(
    senders: int, n: int, *, error_rate: float, latency_s: float, quick_429: bool, seed: int
) -> tuple[RateLimiter, float]:
    """``senders`` at once against a server with no limit that refuses ``error_rate`` of the
    calls at random, asking for 20-200 ms; a success takes ``latency_s`` (0.5x-1.5x), a 429
    as long or (``quick_429``) at once. Returns the limiter and when the last call went."""
    clock = SharedClock(1000.0)
    lim = RateLimiter(clock=clock, sleep=clock.sleep, wall=lambda: clock.now)
    rng = random.Random(seed)
    done = 0

    async def sender() -> None:
        nonlocal done
        while done < n:
            ticket = await lim.acquire()
            refused = rng.random() < error_rate
            took = latency_s * (0.5 + rng.random())
            await clock.sleep(0.001 if refused and quick_429 else took)
            if not refused:
                lim.settle(ticket, 0)
                done += 1
                continue
            lim.refund(ticket)
            wait_s = lim.rate_limited(rng.uniform(0.02, 0.2), ticket=ticket)
            if lim.server_full:  # as aiq.sender does: this sender backs off, the rest go on
                await clock.sleep(rng.uniform(0.0, 1.0))
                continue
            lim.pause(wait_s if wait_s is not None else 1.0)

    async def go() -> None:
        await clock.run([asyncio.ensure_future(sender()) for _ in range(senders)])

    asyncio.run(go())
    return lim, clock.now - 1000.0


@pytest.mark.timeout(60)  # (a collapsed limit crawls: it fails, not hangs)
@pytest.mark.parametrize("quick_429", [True, False], ids=["429s-at-once", "429s-as-slow"])
@pytest.mark.parametrize("seed", range(3))
def test_random_429s_teach_no_limit(quick_429: bool, seed: int) -> None:
    lim, took_s = run(400, 8_000, error_rate=0.05, latency_s=0.5, quick_429=quick_429, seed=seed)
    assert lim.limits.rpm is None, lim.limits
    # 400 in flight at 0.5 s: ~800 a second, so 8,000 in ~10 s with the pauses the 429s ask.
    assert took_s < 20, took_s
