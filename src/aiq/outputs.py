"""Results and dead-letter files: views of the store, replaced atomically.

A file is written to a temporary sibling, flushed to disk, then renamed over the old one, so
a crash mid-export leaves the previous complete file, never a torn or duplicated line.

A run that changed nothing (a nightly re-run of a file with no new lines) leaves the files as
they are: each export is stamped with the store's change count and the files' size, mtime and
inode, and a run writes again only when one of them moved.

After ``aiq prune`` (aiq.retention) the files are the only copy of the pruned jobs' lines:
an export copies those from the old file first, then writes what the store holds.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from .errors import UsageError
from .files import AtomicFile
from .inputs import custom_id_hash
from .records import DEAD, DONE, Source
from .run_records import Export
from .stops import TRUNCATED
from .store import JobStore


def default_outputs(input_path: Path) -> tuple[str, str]:
    """``<stem>.results.jsonl`` and ``<stem>.dead.jsonl`` beside the input file."""
    base = input_path.with_suffix("") if input_path.suffix else input_path
    return f"{base}.results.jsonl", f"{base}.dead.jsonl"


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _request_id(k64: int) -> bytes:
    return b"batch_req_%016x" % (k64 & 0xFFFF_FFFF_FFFF_FFFF)


# A results line (DESIGN.md), and what it is made of.
_RESULT = (
    b'{"id":"%b","custom_id":%b,"response":{"status_code":%b,"request_id":%b,"body":%b},'
    b'"error":null}\n'
)
_DONE = ("custom_id", "k64", "status_code", "request_id", "response")
_DEAD = (
    "custom_id", "line", "status_code", "attempts", "error_type", "error_message",
    "first_attempt_at", "finished_at", "request_id", "response",
)  # fmt: skip


async def export_source(
    store: JobStore,
    source: Source,
    *,
    order: str = "done",
    results_path: str | None = None,
    dead_path: str | None = None,
    skip_unchanged: bool = False,
) -> Export:
    """(Re)write one input file's results and dead-letter files from the store.

    ``skip_unchanged`` (a run's export; the store must be writable): leave both files alone if
    neither they nor the store changed since the last such export wrote them, and stamp the
    files written otherwise.
    """
    results_path = results_path or source.out_path
    dead_path = dead_path or source.dead_path
    if skip_unchanged:
        changes = await store.changes()  # read first: any change from here on moves it
        # Every job finished by now is in what follows (the caller holds the lock: no run
        # is recording outcomes), so a prune may take it out of the store (exported_at).
        at = time.time()
        wanted = _stamp(changes, order, results_path, dead_path)
        stamp = await store.export_stamp(source)
        if stamp is not None and wanted is not None and _same_files(stamp, wanted):
            n_results, n_dead = stamp["results"][-1], stamp["dead"][-1]
            return Export(source.path, results_path, dead_path, n_results, n_dead, written=False)
    carried = await store.carried_ids(source)
    done_ids = dead_ids = None
    if carried is not None:  # lines to copy from the old files (taken off as they are)
        done_ids, dead_ids = carried.done | carried.forgotten, carried.dead | carried.forgotten
    n_results = await _write_results(store, source, order, results_path, done_ids)
    n_dead = await _write_dead(store, source, dead_path, dead_ids)
    lost = 0
    if carried is not None and done_ids is not None and dead_ids is not None:
        lost = len(done_ids & carried.done) + len(dead_ids & carried.dead)
        lost += len(done_ids & dead_ids & carried.forgotten)
    if skip_unchanged:
        stamp = _stamp(changes, order, results_path, dead_path, n_results, n_dead)
        if stamp is not None:
            await store.save_export_stamp(source, {**stamp, "at": at})
    return Export(source.path, results_path, dead_path, n_results, n_dead, pruned_lost=lost)


async def exported_at(store: JobStore, source: Source) -> float | None:
    """When the last run's export of ``source`` began, if its files are still as it left
    them: every job finished before then is in them. None: no such export (none yet, one by
    an aiq from before the time was stamped, or files moved, edited or removed since)."""
    stamp = await store.export_stamp(source)
    if stamp is None or "at" not in stamp:
        return None
    now = _stamp(stamp["changes"], stamp["order"], stamp["results"][0], stamp["dead"][0])
    return float(stamp["at"]) if now is not None and _same_files(stamp, now) else None


def _carried(path: str, ids: set[int] | None) -> Iterator[bytes]:
    """The lines of the old file at ``path`` whose custom_id hash is in ``ids`` (once each):
    those of pruned jobs, which only the file holds. None: nothing to carry."""
    if not ids:
        return
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, a generator's file
    except OSError:  # removed since: those lines are gone with it
        return
    with f:
        for line in f:
            if (custom_id := _custom_id_of(line)) is None:
                continue  # a line someone added or cut: not one aiq wrote
            if (ck := custom_id_hash(custom_id)) in ids:
                ids.discard(ck)
                yield line if line.endswith(b"\n") else line + b"\n"


# A results or dead-letter line as aiq writes it names its custom_id near its start: read from
# there, not the whole line parsed (its reply and all): 300,000 carried lines took 8 s so.
_CUSTOM_ID = re.compile(rb'"custom_id":("(?:[^"\\]|\\.)*")')


def _custom_id_of(line: bytes) -> str | None:
    """The custom_id of a line of a results or dead-letter file (None: none found)."""
    found = _CUSTOM_ID.search(line, 0, 200)  # after the "id" of a results line at most
    try:
        value = orjson.loads(found[1] if found else line)
        if not isinstance(value, str):
            value = value.get("custom_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


async def _write_results(
    store: JobStore, source: Source, order: str, path: str, carried: set[int] | None
) -> int:
    """Write ``source``'s results file; returns its lines. A pruned job's (no reply in the
    store; its hash in ``carried``) comes from the old file, first: the oldest, in the order
    that file had."""
    n, dumps = 0, orjson.dumps
    with AtomicFile(path) as f:
        for line in _carried(source.out_path, carried):
            f.write(line)
            n += 1
        async for rows in store.result_rows(source, state=DONE, order=order, columns=_DONE):
            if carried is not None:
                rows = [r for r in rows if r[4] is not None]  # a pruned job's: carried
            # Formatted, not dumped from a dict: the line is the same bytes in a third of
            # the time, and the stored body goes in as it came (it is JSON already), but on
            # one line.
            f.write(
                b"".join(
                    [
                        _RESULT
                        % (_request_id(k64), dumps(cid), dumps(status), dumps(rid), _one_line(body))
                        for cid, k64, status, rid, body in rows
                    ]
                )
            )
            n += len(rows)
    return n


def _one_line(body: bytes) -> bytes:
    """A body a server pretty-printed, on one line (the same object when it is already on
    one). JSON allows a line break only between tokens (one in a string is escaped), where a
    space means the same."""
    return body.replace(b"\r", b" ").replace(b"\n", b" ")


async def _write_dead(store: JobStore, source: Source, path: str, carried: set[int] | None) -> int:
    """Write ``source``'s dead-letter file, in input order (a pruned job's first, from the
    old file: its hash in ``carried``); returns its lines."""
    n, dumps = 0, orjson.dumps
    with AtomicFile(path) as f:
        for line in _carried(source.dead_path, carried):
            f.write(line)
            n += 1
        async for rows in store.result_rows(source, state=DEAD, order="input", columns=_DEAD):
            if carried is not None:
                rows = [r for r in rows if r[1]]  # a pruned job's (no input line): carried
            for row in rows:
                (
                    custom_id,
                    line,
                    status,
                    attempts,
                    error_type,
                    message,
                    first_at,
                    failed_at,
                    rid,
                    body,
                ) = row
                dead: dict[str, Any] = {
                    "custom_id": custom_id,
                    "request": orjson.Fragment(line),
                    "attempts": attempts,
                    "error": {
                        "type": error_type,
                        "status_code": status,
                        "message": message,
                        "request_id": rid,  # the provider's id of the last call, if it named one
                    },
                    "first_attempt_at": _iso(first_at),
                    "failed_at": _iso(failed_at),
                }
                if body is not None and error_type == TRUNCATED:
                    # A reply that came back and was dead-lettered for how it stopped (cut off
                    # at max_tokens): billed, so it is kept, as the results line would hold it.
                    dead["response"] = {
                        "status_code": status,
                        "request_id": rid,
                        "body": orjson.Fragment(_one_line(body)),
                    }
                f.write(dumps(dead))
                f.write(b"\n")
            n += len(rows)
    return n


def _stamp(
    changes: int, order: str, results_path: str, dead_path: str, *counts: int
) -> dict[str, Any] | None:
    """What identifies an export: the store's change count, the order, and for each file its
    absolute path, size, mtime and inode (then ``counts``, its lines); None if one is gone."""
    files = []
    for path in (results_path, dead_path):
        try:
            st = os.stat(path)
        except OSError:
            return None
        files.append([os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino])
    for file, n in zip(files, counts, strict=False):
        file.append(n)
    return {"changes": changes, "order": order, "results": files[0], "dead": files[1]}


def _same_files(stamp: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether ``stamp`` (with line counts) describes the export ``wanted`` would be."""
    return (
        stamp["changes"] == wanted["changes"]
        and stamp["order"] == wanted["order"]
        and stamp["results"][:-1] == wanted["results"]
        and stamp["dead"][:-1] == wanted["dead"]
    )


async def export_all(
    store: JobStore,
    input_path: Path | None,
    *,
    order: str = "done",
    out: str | None = None,
    dead: str | None = None,
    skip_unchanged: bool = False,
) -> list[Export]:
    """Export ``input_path``'s files (None: every input file's); ``out``/``dead`` name them
    instead of the paths recorded, for a store of one input file only."""
    sources = await store.sources()
    if input_path is not None:
        wanted = str(input_path.resolve())
        sources = [s for s in sources if s.path == wanted]
    elif (out or dead) and len(sources) > 1:
        raise UsageError("--out/--dead need a single input file; this store has several")
    return [
        await export_source(
            store, s, order=order, results_path=out, dead_path=dead, skip_unchanged=skip_unchanged
        )
        for s in sources
    ]
