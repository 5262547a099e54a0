"""The store's coroutines run in the calling thread, over the standard library's sqlite3: no
event loop, no aiosqlite thread.

``aiq status`` reads a few rows. Importing asyncio and aiosqlite for that took about a fifth
of its start-up (bench/README.md, "Start-up"), so it opens the store with ``connect`` and
runs the same ``JobStore`` code with ``run``: ``Connection`` is the part of aiosqlite's that
the store uses, with awaitables that never suspend. What a coroutine reads is then the code
every other command runs, not a second copy in SQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Coroutine, Generator, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def run(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end in this thread. Over a ``Connection`` nothing it awaits
    suspends; anything that would (a sleep, another thread) is a RuntimeError."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value
    work.close()
    raise RuntimeError("a blocking store awaited what needs an event loop (a sleep, a thread)")


def connect(database: str, **kwargs: Any) -> Connection:
    """``aiosqlite.connect``'s counterpart: ``sqlite3.connect(database, **kwargs)``."""
    return Connection(sqlite3.connect(database, **kwargs))


class _Ready:
    """An awaitable already done: what ``await`` gives back at once."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def __await__(self) -> Generator[Any, None, Any]:
        return self._value
        yield  # a generator that never yields: the await returns without suspending


class Cursor:
    """aiosqlite's Cursor over a sqlite3 one: the fetches, iteration and close (a read's)."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    async def fetchone(self) -> Any:
        return self._cursor.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._cursor.fetchmany(self._cursor.arraysize if size is None else size)

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    def __aiter__(self) -> Cursor:
        return self

    async def __anext__(self) -> Any:
        row = self._cursor.fetchone()
        if row is None:
            raise StopAsyncIteration
        return row

    async def close(self) -> None:
        self._cursor.close()


class _Executed(_Ready):
    """What ``Connection.execute`` returns: awaited, its cursor; ``async with``, the cursor
    closed on exit (as aiosqlite's)."""

    __slots__ = ()

    async def __aenter__(self) -> Cursor:
        cursor: Cursor = self._value
        return cursor

    async def __aexit__(self, *exc: object) -> None:
        await self._value.close()


class Connection:
    """aiosqlite's Connection, as far as opening the store and its reads use it, over one
    sqlite3 connection. A write would work too (transactions are BEGIN and COMMIT through
    ``execute``), but nothing writes through it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    @property
    def total_changes(self) -> int:
        return self._conn.total_changes

    def execute(self, sql: str, parameters: Iterable[Any] = ()) -> _Executed:
        return _Executed(Cursor(self._conn.execute(sql, tuple(parameters))))

    async def execute_fetchall(self, sql: str, parameters: Iterable[Any] = ()) -> list[Any]:
        return self._conn.execute(sql, tuple(parameters)).fetchall()

    async def create_function(
        self, name: str, num_params: int, func: Callable[..., Any], deterministic: bool = False
    ) -> None:
        self._conn.create_function(name, num_params, func, deterministic=deterministic)

    async def close(self) -> None:
        self._conn.close()
