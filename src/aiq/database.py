"""The SQLite file under the store: opening it, pragmas, migrations, transactions and what
to tell the user about an SQLite error. It knows no table but ``migrations`` and ``meta``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Self, cast
from urllib.parse import quote

from .errors import StoreError
from .lock import make_store_dir
from .migrations import MIGRATIONS

if TYPE_CHECKING:
    import aiosqlite  # imported where a connection is made: `aiq status` reads without it

_PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    # NORMAL in WAL mode survives a process crash (kill -9); only a power cut can lose the
    # last commits, and those jobs are simply sent again.
    "PRAGMA synchronous = NORMAL",
    # 64 MiB holds the unique indexes (~40 MB per million lines) and a transaction of new
    # rows during `add`: at 48 MiB a million-line add took 40% longer, at 96 no less time.
    "PRAGMA cache_size = -65536",
    # Sorts that outgrow the cache (an export orders every result, reply and all) spill to a
    # temporary file, not to memory: with MEMORY an export's peak RSS grew with the results
    # (~0.5 KB each: 222 MB for 200,000), and would not fit for millions.
    "PRAGMA temp_store = FILE",
    "PRAGMA busy_timeout = 10000",
)


class StoreOutdated(StoreError):
    """A read-only open found migrations to apply: any writing command applies them."""


class Database:
    """One SQLite file in WAL mode over one aiosqlite connection, migrated on open.

    Open with ``await Database.open(path)`` (or a subclass's ``open``).
    """

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, readonly: bool = False, blocking: bool = False
    ) -> Self:
        """Open (creating and migrating unless ``readonly``) the store at ``path``.

        ``blocking``: over aiq.blocking's connection, in the calling thread, for coroutines
        that ``blocking.run`` drives without an event loop (and without importing asyncio).
        Raises StoreError, naming the path and what to do, when it cannot be used.
        """
        p = Path(path)
        if p.is_dir():
            raise StoreError(f"{p}: is a directory; pass --db a file path, like {p / 'aiq.db'}")
        if not readonly:
            _create(p)
            return await cls._connect(p, str(p), readonly=False, blocking=blocking)
        require_store(p)
        if os.access(p, os.W_OK) and os.access(p.parent, os.W_OK):
            # Read-write, but query_only: SQLite removes the -wal and -shm files when the last
            # connection closes, which a mode=ro connection cannot do (`aiq check` or `status`
            # would leave them behind). Nothing is written: query_only refuses it.
            try:
                return await cls._connect(
                    p, f"file:{quote(str(p))}?mode=rw", readonly=True, blocking=blocking
                )
            except StoreOutdated:
                raise
            except StoreError:
                pass  # then as a reader that may not write
        uri = f"file:{quote(str(p))}?mode=ro"
        try:
            return await cls._connect(p, uri, readonly=True, blocking=blocking)
        except StoreError as exc:
            wal = Path(f"{p}-wal")
            if not isinstance(exc.__cause__, sqlite3.OperationalError) or (
                wal.exists() and wal.stat().st_size
            ):
                raise
        # A store in a directory aiq may not write (a read-only mount, another user's store):
        # WAL mode cannot make its -shm file there. With no -wal to read, the database file
        # is the whole store and nobody can be writing it, so it is read as immutable.
        return await cls._connect(p, uri + "&immutable=1", readonly=True, blocking=blocking)

    @classmethod
    async def _connect(cls, p: Path, uri: str, *, readonly: bool, blocking: bool) -> Self:
        try:
            db = await _connection(uri, uri=readonly, blocking=blocking)
        except sqlite3.Error as exc:
            raise store_error(p, exc) from exc
        store = cls(db, p)
        try:
            for pragma in _PRAGMAS[1:] if readonly else _PRAGMAS:
                await db.execute(pragma)
            if readonly:
                await db.execute("PRAGMA query_only = 1")
            else:  # for migrations that rename items (0005_line_ids); a reader applies none
                from .inputs import custom_id_hash  # here: `aiq status` reads without it

                await db.create_function(
                    "aiq_custom_id_hash", 1, custom_id_hash, deterministic=True
                )
            await store._migrate(readonly=readonly)
        except BaseException as exc:
            with suppress(sqlite3.Error):
                await db.close()
            if isinstance(exc, sqlite3.Error):
                raise store_error(p, exc) from exc
            raise
        return store

    async def _migrate(self, *, readonly: bool) -> None:
        await self._db.execute(
            "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL)"
            if not readonly
            else "SELECT 1"
        )
        rows = await self._db.execute_fetchall("SELECT name FROM migrations")
        applied = {r[0] for r in rows}
        known = {name for name, _ in MIGRATIONS}
        if applied - known:
            raise StoreError(
                f"{self.path}: written by a newer aiq (it knows migration "
                f"{sorted(applied - known)[-1]!r}, this one does not); upgrade aiq "
                "(pip install -U aiq) to use this store, nothing in it was changed"
            )
        pending = [(n, sql) for n, sql in MIGRATIONS if n not in applied]
        if pending and readonly:
            raise StoreOutdated(f"{self.path}: store needs upgrading; run any writing aiq command")
        for name, sql in pending:
            async with self.transaction():
                for statement in _statements(sql):
                    await self._db.execute(statement)
                await self._db.execute(
                    "INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (name, time.time())
                )

    @property
    def connection(self) -> aiosqlite.Connection:
        """The one connection: for the modules that write through this store (enqueue)."""
        return self._db

    @contextmanager
    def errors(self) -> Iterator[None]:
        """``with store.errors():`` an SQLite error in the body becomes a StoreError that
        names this store and says what to do (a full disk, a read-only directory …)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise store_error(self.path, exc) from exc

    async def close(self) -> None:
        with self.errors():
            await self._db.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def transaction(self, *, count: bool = True) -> Transaction:
        """``async with store.transaction():`` — BEGIN IMMEDIATE … COMMIT, or ROLLBACK. One
        that changed any row also counts a change of the store (``changes``), unless
        ``count`` is false (a write that describes the files or the run, not the jobs)."""
        return Transaction(self._db, count=count)

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[None]:
        """``async with store.snapshot():`` the reads in the body see one state of the store,
        whatever a run commits meanwhile (a deferred BEGIN: it takes no lock)."""
        if self._db.in_transaction:  # already one
            yield
            return
        await self._db.execute("BEGIN")
        try:
            yield
        finally:
            await rollback(self._db)  # nothing to keep: it only read

    async def meta(self, name: str) -> str | None:
        """The ``meta`` row ``name``'s value, if any."""
        rows = list(
            await self._db.execute_fetchall("SELECT value FROM meta WHERE name = ?", (name,))
        )
        return rows[0][0] if rows else None


async def _connection(database: str, *, uri: bool, blocking: bool) -> aiosqlite.Connection:
    if blocking:
        from .blocking import connect as connect_here

        # The part of aiosqlite's Connection the store uses (blocking.Connection's docstring).
        return cast("aiosqlite.Connection", connect_here(database, uri=uri, isolation_level=None))
    import aiosqlite

    return await aiosqlite.connect(database, uri=uri, isolation_level=None)


def require_store(path: str | os.PathLike[str]) -> None:
    """StoreError unless a store exists at ``path``. Commands that only carry on with one
    (resume, replay-dead, status) call it first: a mistyped --db must not start a new one."""
    if not os.path.exists(path):
        raise StoreError(f"{path}: no store here yet; run `aiq add FILE` or `aiq run FILE`")


def _create(p: Path) -> None:
    """Create the store's file (and missing directories) owner-only, if it is not there."""
    make_store_dir(p)
    try:
        if not p.exists():
            # Prompts and replies are private: owner-only from the first byte.
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError as exc:
        raise StoreError(
            f"{p}: cannot create the store ({exc.strerror}); make {p.parent} writable "
            "or pass --db PATH"
        ) from exc


# What to do about an SQLite error, by its primary result code.
_ADVICE = {
    sqlite3.SQLITE_FULL: "free some space, then run `aiq resume` (what was recorded is kept)",
    sqlite3.SQLITE_IOERR: "the disk failed a read or write: check it (space, quota, errors), "
    "then run `aiq resume` (what was recorded is kept)",
    sqlite3.SQLITE_READONLY: "aiq needs to write the store, its directory and its -wal and "
    "-shm files: make them writable, or pass --db PATH",
    sqlite3.SQLITE_PERM: "aiq needs to write the store, its directory and its -wal and "
    "-shm files: make them writable, or pass --db PATH",
    sqlite3.SQLITE_CANTOPEN: "check that its directory exists and is writable, or pass --db PATH",
    sqlite3.SQLITE_NOTADB: "this file is not an aiq store: pass --db PATH, or move it aside",
    sqlite3.SQLITE_CORRUPT: "the store is damaged: restore a backup, or move it (and its -wal "
    "and -shm files) aside and start again",
    sqlite3.SQLITE_BUSY: "another program keeps the store locked: stop it and try again",
    sqlite3.SQLITE_LOCKED: "another program keeps the store locked: stop it and try again",
}


def store_error(path: Path, exc: sqlite3.Error) -> StoreError:
    """The StoreError a user sees for ``exc``, an SQLite error on the store at ``path``."""
    code = getattr(exc, "sqlite_errorcode", -1) & 0xFF
    if str(exc).startswith("Could not decode to UTF-8"):  # Python's, on a garbled text cell
        code = sqlite3.SQLITE_CORRUPT
    advice = _ADVICE.get(code, "run the command again with --traceback and report it")
    return StoreError(f"{path}: {exc}; {advice}")


def _statements(script: str) -> list[str]:
    """Split a migration into statements (sqlite3.complete_statement keeps triggers whole)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


async def count_change(db: aiosqlite.Connection, before: int) -> None:
    """Inside a transaction: add one to the store's ``changes`` if it changed any row since
    ``db.total_changes`` was ``before``. An export stamped with the count is current while the
    count stays (outputs.export_source); nothing else needs to know what changed."""
    if db.total_changes != before:
        await db.execute(
            "INSERT INTO meta (name, value) VALUES ('changes', 1) "
            "ON CONFLICT (name) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
        )


class Transaction:
    """BEGIN IMMEDIATE … COMMIT (counting a change, see ``count_change``), or ROLLBACK."""

    def __init__(self, db: aiosqlite.Connection, *, count: bool = True) -> None:
        self._db = db
        self._count = count
        self._before = 0

    async def __aenter__(self) -> None:
        await self._db.execute("BEGIN IMMEDIATE")
        self._before = self._db.total_changes

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            try:
                if self._count:
                    await count_change(self._db, self._before)
                await self._db.execute("COMMIT")
            except BaseException:
                await rollback(self._db)  # else the next BEGIN fails and hides this error
                raise
        else:
            await rollback(self._db)


async def rollback(db: aiosqlite.Connection) -> None:
    """ROLLBACK if a transaction is open. After SQLITE_FULL or an I/O error SQLite may have
    rolled back already, and a COMMIT cancelled while it ran may still have finished: a
    second ROLLBACK would fail and replace the error that says what happened."""
    if db.in_transaction:
        with suppress(sqlite3.Error):
            await db.execute("ROLLBACK")
