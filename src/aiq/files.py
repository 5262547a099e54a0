"""Files aiq writes whole or appends to: outputs and metrics replaced atomically, log files.

A file is written to a temporary sibling, flushed to disk, then renamed over the old one, so
a crash mid-write leaves the previous complete file, never a torn one. Its own module, below
both the exports (``outputs``) and the metrics file, so that neither has to import the other
(nor, through ``outputs``, the store) to write a file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TextIO

from .errors import OutputError

__all__ = ["AtomicFile", "cannot_write", "open_log", "write_atomic"]

_BUFFER = 1 << 20


class AtomicFile:
    """Write to ``<path>.tmp-<pid>``, fsync, then rename over ``path`` (owner-only, 0600).

    An OSError (a full disk, a read-only directory) becomes an OutputError naming the file;
    the old file then stays as it was. A process killed mid-write (kill -9, a reboot) leaves
    its temporary file behind, as large as the results: the next write of ``path`` removes it.
    """

    def __init__(self, path: str, *, mode: int = 0o600) -> None:
        self.path = path
        self.tmp = f"{path}.tmp-{os.getpid()}"
        self.mode = mode

    def __enter__(self) -> IO[bytes]:
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            _remove_orphans(self.path)
            # The file and its handle as one step: SIGTERM (SystemExit) landing between them
            # would leave a file no __exit__ removes. A signal held here is handled as the
            # block ends, inside this try, which then removes what was made.
            with _signals_held():
                fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.mode)
                self._f = os.fdopen(fd, "wb", buffering=_BUFFER)
        except BaseException as exc:
            self._discard()
            if isinstance(exc, OSError):
                raise cannot_write(self.path, exc) from exc
            raise
        return self._f

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        failed = exc
        try:
            if failed is None:
                self._f.flush()
                os.fsync(self._f.fileno())
            self._f.close()
            if failed is None:
                os.replace(self.tmp, self.path)
        except OSError as err:
            failed = err
        except BaseException:  # a signal during the flush or fsync: leave no temporary file
            self._discard()
            raise
        if failed is None:
            return
        self._discard()
        if isinstance(failed, OSError):
            raise cannot_write(self.path, failed) from failed

    def _discard(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # AttributeError: never opened
            self._f.close()  # a no-op unless the close above failed before closing
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back for the block, then handled as they would have been.

    Their handlers are swapped for one that only notes them: a mask (pthread_sigmask) holds
    a signal back from this thread only, and the kernel hands it to another (aiosqlite's,
    xdist's), whose handler then runs here all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (handlers can only be set from the main thread, where they run)
        return
    caught: list[int] = []

    def note(signum: int, frame: object) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in caught:
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def _remove_orphans(path: str) -> None:
    """Remove ``<path>.tmp-<pid>`` files whose process is gone (another one's is in use)."""
    directory, name = os.path.split(path)
    prefix = name + ".tmp-"
    with os.scandir(directory or ".") as entries:
        orphans = [
            e.path
            for e in entries
            if e.name.startswith(prefix)
            and e.name[len(prefix) :].isdigit()
            and not _alive(int(e.name[len(prefix) :]))
        ]
    for orphan in orphans:
        with contextlib.suppress(OSError):
            os.unlink(orphan)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # another user's process, or no pid at all: not ours to remove
    return True


def cannot_write(path: str | os.PathLike[str], exc: OSError) -> OutputError:
    """The OutputError for ``exc``, met writing ``path``."""
    return OutputError(
        f"{path}: cannot write it ({exc.strerror}); free some space or make its directory "
        "writable (or choose another path), then run the command again: the store keeps "
        "everything, so nothing is lost"
    )


def open_log(path: Path) -> TextIO:
    """Open a log file for appending, creating its directory; OutputError if it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a", encoding="utf-8")
    except OSError as exc:
        raise cannot_write(path, exc) from exc


def write_atomic(path: str, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically."""
    with AtomicFile(path, mode=mode) as f:
        f.write(data)
