"""One run per store: an exclusive OS-level lock beside the database.

``flock`` is released by the kernel when the holder dies, however it dies, so a crashed run
never leaves a stale lock behind. The file also says who holds it, for the error message.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import suppress
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from .errors import StoreError, StoreLocked
from .stats import RunState

STORE_DIR = ".aiq"  # the default store's directory, the only one aiq makes itself
_POLL_S = 0.2  # how often --wait tries the lock again


def make_store_dir(db: Path) -> None:
    """Make the directory of a store at ``db`` if it is aiq's own (``.aiq``); any other missing
    directory is a typo in --db (or $AIQ_DB), and a new store there would send everything again.
    """
    parent = db.parent
    if parent.is_dir():
        return
    if parent.name != STORE_DIR:
        raise StoreError(
            f"{db}: directory {parent} does not exist; create it first, or fix --db ($AIQ_DB)"
        )
    try:
        parent.mkdir(exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"{db}: cannot create {parent} ({exc.strerror}); make {parent.parent} writable "
            "or pass --db PATH"
        ) from exc


class StoreLock:
    """``async with StoreLock(db_path):`` — held for the whole of a run or resume. A plain
    ``with`` works too, where no event loop runs."""

    def __init__(self, db_path: str | os.PathLike[str], *, wait_s: float = 0.0) -> None:
        self.path = Path(f"{db_path}.lock")
        self.wait_s = wait_s
        self._fd: int | None = None
        self._info: dict[str, object] = {}

    def __enter__(self) -> StoreLock:
        """Take the lock, waiting up to ``wait_s`` with ``time.sleep``: outside a loop only."""
        fd = self._open()
        deadline = time.monotonic() + self.wait_s
        try:
            while not self._try(fd, deadline):
                time.sleep(_POLL_S)
        except BaseException:  # Ctrl-C while waiting
            _close(fd)
            raise
        return self

    async def __aenter__(self) -> StoreLock:
        """``async with StoreLock(db_path):`` — the same, waiting without blocking the event
        loop: a program that runs aiq beside other tasks keeps running them for the
        ``--wait`` seconds, and a run in the same process can release the lock meanwhile."""
        import asyncio  # here: `aiq status` reads the lock file (run_state) without a loop

        fd = self._open()
        deadline = time.monotonic() + self.wait_s
        try:
            while not self._try(fd, deadline):
                await asyncio.sleep(_POLL_S)
        except BaseException:  # cancelled (Ctrl-C) while waiting
            _close(fd)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)

    def _try(self, fd: int, deadline: float) -> bool:
        """Take the lock on ``fd`` if it is free, and say so; StoreLocked past ``deadline``.
        flock has no timeout of its own, so waiting is polling."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() < deadline:
                return False
            raise StoreLocked(
                f"another aiq run holds {self.path.with_suffix('')} ({_holder(fd)}); "
                "wait for it to finish, or pass --wait SECONDS"
            ) from None
        self._fd = fd
        self._info = {"pid": os.getpid(), "host": _host(), "started_at": time.time()}
        with suppress(OSError):  # first: what the last run wrote must not speak for this one
            os.ftruncate(fd, 0)
        self._write()
        return True

    def note(self, **info: float) -> None:
        """Add to what the lock file says of this run (``sending_since``, for status)."""
        self._info.update(info)
        self._write()

    def _write(self) -> None:
        # Only for the messages of another run and of status: a full disk must not stop
        # this run here.
        if self._fd is not None:
            data = json.dumps(self._info).encode()
            with suppress(OSError):
                os.pwrite(self._fd, data, 0)
                os.ftruncate(self._fd, len(data))

    def _open(self) -> int:
        make_store_dir(self.path)
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(
                f"{self.path}: cannot create the store's lock file ({exc.strerror}); "
                f"make {self.path.parent} writable or pass --db PATH"
            ) from exc

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            self.note(ended_at=time.time())  # so status tells a run that ended from one that died
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def run_state(db_path: str | os.PathLike[str]) -> RunState:
    """Whether a run holds the store at ``db_path`` now, and what its lock file says.

    Never takes the lock from a run, and never creates the lock file. The file says whether
    the last run ended; if it did not, the lock itself says whether it is still running: a
    run that died (kill -9) released it with its last breath, and left its word behind.
    """
    try:
        fd = os.open(Path(f"{db_path}.lock"), os.O_RDONLY)
    except OSError:  # no run yet (or a lock file aiq may not read): nothing holds it
        return RunState(active=False)
    try:
        info = _read(fd)
        state = RunState(
            active=False,
            pid=pid if isinstance(pid := info.get("pid"), int) else None,
            host=host if isinstance(host := info.get("host"), str) else None,
            started_at=_number(info.get("started_at")),
            sending_since=_number(info.get("sending_since")),
            ended_at=_number(info.get("ended_at")),
        )
        if state.ended_at is not None:
            return state
        if state.host == _host() and state.pid is not None and _gone(state.pid):
            return state  # died, and no need to touch the lock at all
        try:
            # A shared lock, given back at once: it fails while a run holds the exclusive
            # one. (A run starting in that microsecond would find the store held, and say so.)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return replace(state, active=True)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return state
    finally:
        os.close(fd)


def _host() -> str:
    # socket.gethostname() is uname's nodename (POSIX, as flock is); the socket module would
    # cost `aiq status` ~3 ms of start-up, for this string.
    return os.uname().nodename


def _read(fd: int) -> dict[str, object]:
    """The lock file's JSON ({} when empty, or caught mid-write)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _gone(pid: int) -> bool:
    """Whether no process has this id on this host (another user's still counts as one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _close(fd: int) -> None:
    with suppress(OSError):
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        started = datetime.fromtimestamp(info["started_at"], UTC).isoformat(timespec="seconds")
        return f"pid {info['pid']} on {info['host']}, started {started}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
