"""The in-process fakes the unit tests share: a clock that moves only when told, and a
``httpx.MockTransport`` handler that keeps every request it got. (The fake HTTP server for
end-to-end tests is the ``fakeserver`` package.)"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson


class FakeClock:
    """A clock that only moves when a test sets ``now`` or a caller sleeps: pass it where a
    component takes ``clock`` and its ``sleep`` where it takes one."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


class SharedClock(FakeClock):
    """A fake clock for several tasks sleeping at once: each sleeper wakes when the clock
    reaches its time, and ``run`` moves the clock to the next wake-up while any task waits."""

    def __init__(self, now: float = 1000.0) -> None:
        super().__init__(now)
        self._wakes: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._wakes, (self.now + seconds, next(self._seq), future))
        await future

    async def run(self, tasks: Sequence[asyncio.Future[None]]) -> None:
        while not all(t.done() for t in tasks):
            for _ in range(3):
                await asyncio.sleep(0)
            if self._wakes:
                at, _, future = heapq.heappop(self._wakes)
                self.now = max(self.now, at)
                future.set_result(None)
        await asyncio.gather(*tasks)


class TurnCounter:
    """Counts the running loop's turns: a callback that schedules itself again each turn."""

    def __init__(self) -> None:
        self.turn = 0
        self._handle = asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.turn += 1
        self._handle = asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


Answer = httpx.Response | Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A ``httpx.MockTransport`` handler that keeps every request it got (``requests``) and
    answers it with ``answer``: a fixed reply, or a function of the request."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answer
        return answer if isinstance(answer, httpx.Response) else answer(request)

    @property
    def body(self) -> dict[str, Any]:
        """The JSON body of the one request it got."""
        assert len(self.requests) == 1
        return orjson.loads(self.requests[0].content)
