"""Read a JSONL prompt file into Requests (or BadLines), block by block, resumably.

The file is read in blocks of whole lines: memory stays flat however large it is, apart from
~10 bytes per custom_id (``IdSet``) to catch one given twice. Each line goes through
``inputs.parse_line``, the one definition of a valid line.

A reader also describes what it read as a ``Prefix`` (bytes, their sha256, what the lines
held). The store keeps it per source; when the file still starts with those bytes and is
read under the same rules, reading resumes after them, so re-adding a grown file costs only
its new lines.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .defaults import MASKS, Defaults
from .errors import InputError
from .idset import IdSet
from .inputs import KEEP_BAD_LINES, BadLine, LineError, Request, parse_line, rules_fingerprint

_BOM = b"\xef\xbb\xbf"
_BLOCK = 1 << 20  # read size; a line longer than this is joined across reads
# Reading a line takes about seven times its size in memory (the line, its parsed text, the
# canonical body, the rows): 20 MB prompts are fine, but a one-line 1 GB file must not
# take gigabytes. A request this large would be refused anyway.
_MAX_LINE = 64 << 20
_TOO_LONG = b"\0(too long)\0"  # what _blocks yields, by identity, for a line over _MAX_LINE
_READ_BATCH = 1_000  # lines per list when iterating line by line


@dataclass(slots=True)
class Prefix:
    """The whole lines at the start of a file that one read went through, and what they held.

    ``ids`` holds the custom_id hashes of its valid lines (``IdSet.to_bytes``), so a line
    appended later that repeats one is still caught.
    """

    size: int  # bytes, ending just after a newline
    sha256: bytes
    lines: int  # lines in those bytes, blank ones too: numbering resumes after them
    valid: int  # how many were valid requests
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line_no, reason), the first
    ids: bytes = b""
    rules: str = ""  # fingerprint of the rules and defaults it was read under
    invalid: int = 0  # invalid lines, all of them (``bad`` keeps KEEP_BAD_LINES at most)
    # applied[bits]: valid lines that took those defaults (defaults.APPLIED_*), for the counts
    applied: list[int] = field(default_factory=lambda: [0] * MASKS)

    def same(self, other: Prefix | None) -> bool:
        """Whether ``other`` covers the same bytes read under the same rules (so holds the same)."""
        if other is None:
            return False
        return (self.size, self.sha256, self.rules) == (other.size, other.sha256, other.rules)


def _blocks(f: IO[bytes]) -> Iterator[tuple[bytes, bool]]:
    """Blocks of whole lines from ``f``, then any unterminated last line (flag False).

    A line longer than _MAX_LINE comes as ``_TOO_LONG`` instead, and the rest of it is
    skipped unread.
    """
    parts: list[bytes] = []  # the line that runs past the last block, so far
    size = 0
    skipping = False
    while chunk := f.read(_BLOCK):
        if skipping:
            end = chunk.find(b"\n") + 1
            if not end:
                continue
            chunk, skipping = chunk[end:], False
        cut = chunk.rfind(b"\n") + 1
        if cut:
            yield b"".join([*parts, chunk[:cut]]), True
            parts, size, chunk = [], 0, chunk[cut:]
        if chunk:
            parts.append(chunk)
            size += len(chunk)
            if size > _MAX_LINE:
                yield _TOO_LONG, True
                parts, size, skipping = [], 0, True
    if parts:
        yield b"".join(parts), False


class RequestFile:
    """A JSONL prompt file: iterate it for a Request or a BadLine per non-blank line, in order.

    A custom_id given twice in the file makes the later line a BadLine. ``read(after=...)``
    can skip a prefix an earlier read described, and leaves ``prefix`` describing this read.
    """

    def __init__(self, path: str | os.PathLike[str], defaults: Defaults) -> None:
        self.path = Path(path)
        self.name = str(path)
        self.defaults = defaults
        self.rules = rules_fingerprint(defaults)
        self.skipped: Prefix | None = None  # the prefix the last read() skipped, if any
        self.prefix: Prefix | None = None  # what the last complete read() went through
        # applied[bits]: the valid lines of the whole file that took those defaults, once a
        # read is exhausted (defaults.count_defaults names them)
        self.applied: list[int] = [0] * MASKS

    def __iter__(self) -> Iterator[Request | BadLine]:
        return self.read()

    def check(self) -> None:
        """InputError now, as reading would raise it, if the file cannot be read at all."""
        self._open().close()

    def _open(self) -> IO[bytes]:
        if self.path.is_dir():
            raise InputError(f"{self.name}: is a directory; give a JSONL file")
        try:
            return self.path.open("rb")
        except FileNotFoundError:
            raise InputError(f"{self.name}: no such file") from None
        except OSError as exc:
            raise InputError(f"{self.name}: cannot read ({exc.strerror})") from None

    def _start(self, f: IO[bytes], after: Prefix | None) -> tuple[Any, Prefix, IdSet]:
        """(hasher, prefix so far, custom_id hashes seen): after ``after`` if the open file
        still starts with it and the rules match, else at the start with nothing seen."""
        if after is not None and after.rules == self.rules:
            hasher = hashlib.sha256()
            left = after.size
            while left > 0 and (chunk := f.read(min(left, _BLOCK))):
                hasher.update(chunk)
                left -= len(chunk)
            if not left and hasher.digest() == after.sha256:
                self.skipped = after
                p = Prefix(
                    after.size,
                    b"",
                    after.lines,
                    after.valid,
                    [*after.bad],
                    rules=self.rules,
                    invalid=after.invalid,
                    applied=[*after.applied],
                )
                return hasher, p, IdSet.from_bytes(after.ids)
            f.seek(0)
        return hashlib.sha256(), Prefix(0, b"", 0, 0, rules=self.rules), IdSet()

    def read(self, *, after: Prefix | None = None) -> Iterator[Request | BadLine]:
        """Yield a Request or a BadLine per non-blank line; raises InputError if unreadable.

        With ``after``, lines in a prefix the file still starts with (read under the same
        rules) are skipped and ``skipped`` is set; otherwise the whole file is read. Once
        exhausted, ``prefix`` describes every newline-terminated line of the file.
        """
        for batch in self.batches(_READ_BATCH, after=after):
            yield from batch

    def batches(
        self, size: int, *, after: Prefix | None = None
    ) -> Iterator[list[Request | BadLine]]:
        """What ``read`` yields, in lists of up to ``size`` (``enqueue``'s bulk path)."""
        self.skipped = self.prefix = None
        with self._open() as f:
            hasher, p, seen = self._start(f, after)
            growing: Request | None = None  # an unterminated last line: it may still grow
            name, defaults, valid, applied = self.name, self.defaults, p.valid, p.applied
            out: list[Request | BadLine] = []
            resumable = True  # False once _blocks skipped a line
            # The loop over lines is the hot path of `aiq add`: locals only, one call a line.
            for block, whole in _blocks(f):
                if block is _TOO_LONG:
                    p.lines += 1
                    out.append(BadLine(name, p.lines, _too_long()))
                    resumable = False
                    continue
                line_no = p.lines
                for raw in _lines(block, whole, p.size == 0):
                    line_no += 1
                    raw = raw.strip()
                    if not raw:
                        continue
                    try:
                        req = parse_line(raw, line_no, defaults, seen)
                    except LineError as exc:
                        out.append(_bad_line(p, name, line_no, exc, whole))
                    else:
                        out.append(req)
                        if whole:
                            valid += 1
                            applied[req.applied] += 1
                        else:
                            growing = req
                    if len(out) >= size:
                        yield out
                        out = []
                if whole:
                    hasher.update(block)
                    p.size += len(block)
                    p.lines = line_no
            if out:
                yield out
            p.valid = valid
            self._finish(p, hasher, seen, growing, resumable)

    def _finish(
        self, p: Prefix, hasher: Any, seen: IdSet, growing: Request | None, resumable: bool
    ) -> None:
        """Once a read is exhausted: the file's counts, and ``prefix`` describing its whole
        lines. An unterminated last line counts for the file but not for the prefix: a later
        read, of a file that has grown, reads it again."""
        self.applied = [*p.applied]
        if growing is not None:
            seen.discard(growing.id_hash.to_bytes(8, "big", signed=True))
            self.applied[growing.applied] += 1
        p.sha256 = hasher.digest()
        p.ids = seen.to_bytes()
        # A skipped line's bytes were neither hashed nor counted: the next read reads all.
        self.prefix = p if resumable else None


def _lines(block: bytes, whole: bool, at_start: bool) -> list[bytes]:
    """The lines of a block, unstripped (a BOM at the start of the file cut off), without
    the empty string after the last newline of a block of whole lines."""
    text = block[3:] if at_start and block.startswith(_BOM) else block
    lines = text.split(b"\n")
    if whole:
        lines.pop()
    return lines


def _bad_line(p: Prefix, name: str, line_no: int, exc: LineError, whole: bool) -> BadLine:
    """The BadLine of an invalid line, counted in ``p`` when whole (the unterminated last
    line may yet be finished, so it is not part of a prefix)."""
    if whole:
        p.invalid += 1
        if len(p.bad) < KEEP_BAD_LINES:
            p.bad.append((line_no, str(exc)))
    return BadLine(name, line_no, _reason(exc, whole))


def _reason(exc: LineError, whole: bool) -> str:
    if not whole and str(exc).startswith("not valid JSON"):
        return f"{exc} (the last line, with no newline: cut short?)"
    return str(exc)


def _too_long() -> str:
    return (
        f"longer than {_MAX_LINE >> 20} MiB: not read (too large for one request; is this a "
        "JSONL file, one request per line?)"
    )


def read_requests(path: str | os.PathLike[str], defaults: Defaults) -> RequestFile:
    """The requests of a JSONL file: iterate for a Request or a BadLine per non-blank line.

    A custom_id given twice in one file makes the later line a BadLine. Iterating raises
    InputError when the file itself cannot be read.
    """
    return RequestFile(path, defaults)
