"""A one-handler aiohttp server on 127.0.0.1 in a thread, for tests whose server does one
special thing (quote the key back, keep the exact bytes it sent). Subclasses write ``_handle``."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web


class LocalServer:
    """``with Subclass() as s:`` serves ``POST /v1/…`` with ``s._handle`` at ``s.base_url``."""

    def __init__(self) -> None:
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10), f"{type(self).__name__} did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/{endpoint:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        raise NotImplementedError
