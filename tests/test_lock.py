"""The store's lock: ``--wait`` waits without blocking the event loop, and gives up with the
holder named; a wait that ends either way leaves no file descriptor behind."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from aiq.errors import StoreLocked
from aiq.lock import StoreLock


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_wait_lets_the_loop_run_and_takes_the_lock_when_freed(tmp_path: Path) -> None:
    db = tmp_path / "aiq.db"
    held = StoreLock(db).__enter__()  # another run, in this process
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)

    async def main() -> float:
        ticker = asyncio.create_task(tick())
        # Only a loop that runs while the lock is waited for can free it (a time.sleep in
        # the wait would block this callback, and the wait would end in StoreLocked).
        asyncio.get_running_loop().call_later(0.3, held.__exit__)
        started = time.monotonic()
        async with StoreLock(db, wait_s=5.0):
            took = time.monotonic() - started
        ticker.cancel()
        return took

    took = asyncio.run(main())
    assert 0.25 < took < 2.0
    assert len(ticks) >= 5  # the loop ran other tasks during the wait


def test_a_wait_gives_up_with_the_holder_named(tmp_path: Path) -> None:
    db = tmp_path / "aiq.db"
    with StoreLock(db):
        before = _open_fds()

        async def main() -> None:
            async with StoreLock(db, wait_s=0.3):
                pass

        started = time.monotonic()
        with pytest.raises(StoreLocked, match=rf"holds {db} \(pid {os.getpid()} on .*--wait"):
            asyncio.run(main())
        assert 0.3 <= time.monotonic() - started < 2.0
        assert _open_fds() == before


def test_a_cancelled_wait_closes_its_file(tmp_path: Path) -> None:
    db = tmp_path / "aiq.db"
    with StoreLock(db):
        before = _open_fds()

        async def main() -> None:
            waiting = asyncio.create_task(StoreLock(db, wait_s=30.0).__aenter__())
            await asyncio.sleep(0.1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting

        asyncio.run(main())
        assert _open_fds() == before
