"""One run per store: an exclusive OS-level lock beside the database.

``flock`` is released by the kernel when the holder dies, however it dies, so a crashed run
never leaves a stale lock behind. The file also says who holds it, for the error message.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path

from .errors import StoreError, StoreLocked

STORE_DIR = ".aiq"  # the default store's directory, the only one aiq makes itself


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
    """``with StoreLock(db_path):`` — held for the whole of a run or resume."""

    def __init__(self, db_path: str | os.PathLike[str], *, wait_s: float = 0.0) -> None:
        self.path = Path(f"{db_path}.lock")
        self.wait_s = wait_s
        self._fd: int | None = None

    def __enter__(self) -> StoreLock:
        fd = self._open()
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _holder(fd)
                    os.close(fd)
                    raise StoreLocked(
                        f"another aiq run holds {self.path.with_suffix('')} ({holder}); "
                        "wait for it to finish, or pass --wait SECONDS"
                    ) from None
                time.sleep(0.2)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
        # Only for the message another run shows: a full disk must not stop this one here.
        with suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

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
            with suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        started = datetime.fromtimestamp(info["started_at"], UTC).isoformat(timespec="seconds")
        return f"pid {info['pid']} on {info['host']}, started {started}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
