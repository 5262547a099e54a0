"""Senders waiting for their slots on the real event loop: each wait ends at its slot, or
when the slots are taken back; the loop holds one timer for them all."""

from __future__ import annotations

import asyncio
import random

from aiq.slot_waits import SlotWaits


def test_each_wait_ends_at_its_slot_in_slot_order() -> None:
    async def main() -> list[tuple[int, float]]:
        waits, loop = SlotWaits(), asyncio.get_running_loop()
        start, ended = loop.time(), []

        async def wait(i: int, seconds: float) -> None:
            await waits.wait(seconds, waits.generation)
            ended.append((i, loop.time() - start))

        await asyncio.gather(*(wait(i, s) for i, s in enumerate((0.06, 0.02, 0.04, 0.0))))
        return ended

    ended = asyncio.run(main())
    assert [i for i, _ in ended] == [3, 1, 2, 0]
    for i, took in ended:
        slot = (0.06, 0.02, 0.04, 0.0)[i]
        assert slot <= took < slot + 0.05, (i, took)


def test_the_loop_holds_one_timer_for_every_wait() -> None:
    # ~400 senders wait at a time in a second's bucket at 20,000/min, and each wakes, books
    # again and waits again whenever the slots are taken back: a timer each was two heap
    # operations of the loop's per sender, each time.
    async def main() -> tuple[int, int]:
        waits, loop = SlotWaits(), asyncio.get_running_loop()
        before = len(loop._scheduled)  # type: ignore[attr-defined]
        tasks = [asyncio.create_task(waits.wait(10 + i / 100, 0)) for i in range(200)]
        await asyncio.sleep(0)
        held = len(loop._scheduled) - before  # type: ignore[attr-defined]
        waits.wake_all()
        await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
        return held, sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]

    held, left = asyncio.run(main())
    assert held == 1
    assert left == 0  # (the one timer cancelled with the waits)


def test_taken_back_wakes_every_sender_at_once_in_the_order_of_their_slots() -> None:
    async def main() -> tuple[list[int], float, int]:
        waits, loop = SlotWaits(), asyncio.get_running_loop()
        slots = list(range(60))
        random.Random(3).shuffle(slots)
        order: list[int] = []

        async def wait(slot: int) -> None:
            await waits.wait(30 + slot, waits.generation)
            order.append(slot)

        tasks = [asyncio.create_task(wait(s)) for s in slots]
        await asyncio.sleep(0.01)
        start = loop.time()
        waits.wake_all()
        await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
        return order, loop.time() - start, waits.generation

    order, took, generation = asyncio.run(main())
    assert order == sorted(order) and len(order) == 60
    assert took < 0.5
    assert generation == 1


def test_a_cancelled_sender_leaves_the_others_waiting_to_their_slots() -> None:
    async def main() -> list[str]:
        waits, ended = SlotWaits(), []

        async def wait(name: str, seconds: float) -> None:
            await waits.wait(seconds, 0)
            ended.append(name)

        first = asyncio.create_task(wait("first", 0.02))
        later = asyncio.create_task(wait("later", 0.05))
        await asyncio.sleep(0)
        first.cancel()  # its slot was the timer's
        await asyncio.wait_for(later, 1.0)
        return ended

    assert asyncio.run(main()) == ["later"]
