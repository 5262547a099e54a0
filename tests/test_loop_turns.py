"""aiq.loop_turns: a burst's sends start a turn's share at a time, in order, and the loop
looks at its sockets between shares."""

from __future__ import annotations

import asyncio
import socket

import pytest
from fakes import TurnCounter

from aiq.loop_turns import LoopTurns


async def _through(turns: LoopTurns, passed: list[int], i: int) -> None:
    if not turns.go_now():
        await turns.wait()
    passed.append(i)


def test_a_herd_goes_a_share_per_turn_in_order() -> None:
    asyncio.run(_a_herd_goes_a_share_per_turn_in_order())


async def _a_herd_goes_a_share_per_turn_in_order() -> None:
    turns = LoopTurns(per_turn=16)
    counter = TurnCounter()
    passed: list[int] = []
    by_turn: dict[int, int] = {}

    async def one(i: int) -> None:
        await _through(turns, passed, i)
        by_turn[counter.turn] = by_turn.get(counter.turn, 0) + 1

    await asyncio.gather(*(one(i) for i in range(100)))
    counter.stop()
    assert passed == list(range(100))  # oldest first
    assert max(by_turn.values()) <= 16
    assert len(by_turn) >= 100 // 16  # spread over turns, not one


def test_the_loop_reads_its_sockets_between_shares() -> None:
    """A reply waiting on a socket is read after the first share, not after the herd: the
    point of it (a burst of thousands woken at once was one 0.56 s turn with no I/O)."""
    asyncio.run(_the_loop_reads_its_sockets_between_shares())


async def _the_loop_reads_its_sockets_between_shares() -> None:
    loop = asyncio.get_running_loop()
    turns = LoopTurns(per_turn=32)
    passed: list[int] = []
    read_after: list[int] = []
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    try:
        b.send(b"reply")

        def on_readable() -> None:
            read_after.append(len(passed))
            loop.remove_reader(a.fileno())

        loop.add_reader(a.fileno(), on_readable)
        await asyncio.gather(*(_through(turns, passed, i) for i in range(1_000)))
    finally:
        loop.remove_reader(a.fileno())
        a.close()
        b.close()
    assert len(passed) == 1_000
    assert read_after and read_after[0] <= 2 * 32


def test_sends_one_at_a_time_never_wait() -> None:
    """A steady run, a few sends a turn: each goes at once (no coroutine, no extra turn)."""
    asyncio.run(_sends_one_at_a_time_never_wait())


async def _sends_one_at_a_time_never_wait() -> None:
    turns = LoopTurns(per_turn=4)
    for _ in range(50):
        assert turns.go_now()
        await asyncio.sleep(0)  # a turn passes


def test_a_waiter_cancelled_does_not_hold_the_others() -> None:
    asyncio.run(_a_waiter_cancelled_does_not_hold_the_others())


async def _a_waiter_cancelled_does_not_hold_the_others() -> None:
    turns = LoopTurns(per_turn=1)
    passed: list[int] = []
    tasks = [asyncio.create_task(_through(turns, passed, i)) for i in range(3)]
    await asyncio.sleep(0)  # the first went; the others wait for the next turns
    assert passed == [0]
    tasks[1].cancel()
    await asyncio.wait_for(tasks[2], 1.0)
    assert passed == [0, 2]
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]


def test_per_turn_must_let_one_through() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LoopTurns(per_turn=0)
