"""``aiq prune``: finished jobs' requests and replies out of the store once they are exported.

A job is pruned only when every input file that names it has a results and dead-letter file
that a run's export wrote after the job finished, and those files are still as that export
left them (its stamp: size, mtime, inode; outputs.exported_at). A job not yet in its files,
or whose files were moved or edited since, is left alone: the store is then its only copy.

What a prune keeps: the job's row and its key, so a re-run of the same file sends nothing
(``forget`` deletes the rows: the next run sends those requests again), its state, tokens and
cost, which the tallies count (an update of the request and reply columns fires no tally
trigger; a delete takes the job off its tally, so ``status`` stays right). What it frees: the
request as sent (``body``, emptied: an empty body marks a pruned job, as no request is empty),
the reply (unless ``keep_results``) and the input line. The lines the files hold for pruned
jobs are then their only copy: the next export copies them from the old file into the new
(outputs.export_source), so a prune never takes a line out of a results file.

Then the file shrinks: the store is in auto_vacuum NONE (SQLite's default; database.py sets
no auto_vacuum), so freed pages are only reused, never given back, until a VACUUM rewrites
the file. An incremental vacuum would need auto_vacuum INCREMENTAL, which an existing store
only takes through a VACUUM anyway. A VACUUM writes a copy of the live data first: it needs
free disk of about the store's size after the prune, and is skipped (and said) without it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .records import DEAD, DONE, Pruned
from .store import PRUNED_META, JobStore
from .text import size_text

if TYPE_CHECKING:
    import aiosqlite  # `aiq status` imports this module (store_size), and reads without it

__all__ = ["Pruned", "prune", "store_size", "vacuum"]


def store_size(path: str | os.PathLike[str]) -> int:
    """Bytes on disk of the store: its file and its -wal (the -shm is an index of the wal)."""
    total = 0
    for p in (Path(path), Path(f"{path}-wal")):
        with contextlib.suppress(OSError):  # no -wal: none
            total += p.stat().st_size
    return total


async def prune(
    store: JobStore,
    *,
    done_older_than_s: float,
    dead_older_than_s: float | None = None,
    keep_results: bool = False,
    forget: bool = False,
    now: float | None = None,
) -> Pruned:
    """Prune done jobs finished over ``done_older_than_s`` ago (and dead ones over
    ``dead_older_than_s``, if given) that are exported; see the module's docstring. The
    caller holds the store's lock: no run may finish or export a job meanwhile. No VACUUM
    here (``vacuum``): it cannot run inside the transaction."""
    from .outputs import exported_at  # here: `aiq status` reads store_size, not the exporter

    now = time.time() if now is None else now
    result = Pruned(forgotten=forget)
    db = store.connection
    ok: list[tuple[int, float]] = []
    for source in await store.sources():
        at = await exported_at(store, source)
        if at is None:
            result.sources_unexported.append(source.path)
        else:
            ok.append((source.id, at))
    # Not counted as a change: the files still show what they showed (outputs._stamp).
    async with store.transaction(count=False):
        await _candidates(db, ok, done_cutoff=now - done_older_than_s, dead_cutoff=(
            None if dead_older_than_s is None else now - dead_older_than_s
        ))  # fmt: skip
        rows = await db.execute_fetchall(
            "SELECT state, count(*), sum(exported) FROM temp.prune_candidates GROUP BY state"
        )
        for state, n, exported in rows:
            result.not_exported += n - exported
            if state == DONE:
                result.done = exported
            else:
                result.dead = exported
        await db.execute("DELETE FROM temp.prune_candidates WHERE NOT exported")
        result.freed_bytes = await _free(db, keep_results=keep_results, forget=forget)
        if result.done or result.dead:
            await db.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (PRUNED_META, now)
            )
            if forget:  # the next add reads each file whole again, finding the forgotten lines
                await db.execute("DELETE FROM prefixes")
        await db.execute("DROP TABLE temp.prune_candidates")
    return result


async def _candidates(
    db: aiosqlite.Connection,
    ok: list[tuple[int, float]],
    *,
    done_cutoff: float,
    dead_cutoff: float | None,
) -> None:
    """Fill temp.prune_candidates: the jobs old enough and not pruned yet, each marked
    ``exported`` when every file naming it was exported after it finished (at least one)."""
    await db.execute("CREATE TEMP TABLE exported_at (source_id INTEGER PRIMARY KEY, at REAL)")
    await db.executemany("INSERT INTO temp.exported_at VALUES (?, ?)", ok)
    await db.execute(
        "CREATE TEMP TABLE prune_candidates (k64 INTEGER PRIMARY KEY, state INTEGER, "
        "finished_at REAL, exported INTEGER)"
    )
    await db.execute(
        "INSERT INTO temp.prune_candidates SELECT k64, state, finished_at, 0 FROM jobs "
        "WHERE length(body) > 0 AND ((state = ? AND finished_at < ?) "
        "OR (state = ? AND finished_at < ?))",
        (DONE, done_cutoff, DEAD, -1.0 if dead_cutoff is None else dead_cutoff),
    )
    # One pass over the items (there is no index on items.job_k64, see 0001_initial): the
    # candidates some file names, and those some file has not exported since they finished.
    await db.execute(
        "UPDATE temp.prune_candidates SET exported = 1 WHERE k64 IN (SELECT job_k64 FROM items)"
    )
    await db.execute(
        "UPDATE temp.prune_candidates SET exported = 0 WHERE k64 IN ("
        "SELECT i.job_k64 FROM items i JOIN temp.prune_candidates c ON c.k64 = i.job_k64 "
        "LEFT JOIN temp.exported_at e ON e.source_id = i.source_id "
        "WHERE e.at IS NULL OR c.finished_at > e.at)"
    )
    await db.execute("DROP TABLE temp.exported_at")


async def _free(db: aiosqlite.Connection, *, keep_results: bool, forget: bool) -> int:
    """Empty (or, ``forget``, delete) the candidates' requests, replies and input lines;
    returns the bytes removed. A dead job's input line is its dead letter's request: kept
    with ``keep_results``, as its reply is."""
    c = "k64 IN (SELECT k64 FROM temp.prune_candidates)"
    reply = "0" if keep_results and not forget else "coalesce(length(response), 0)"
    ((jobs_bytes,),) = await db.execute_fetchall(
        f"SELECT coalesce(sum(length(body) + {reply}), 0) FROM jobs WHERE {c}"
    )
    line_of = "job_k64 IN (SELECT k64 FROM temp.prune_candidates"
    line_of += ")" if forget or not keep_results else f" WHERE state = {DONE})"
    ((lines_bytes,),) = await db.execute_fetchall(
        f"SELECT coalesce(sum(length(line)), 0) FROM items WHERE {line_of}"
    )
    await db.execute(f"UPDATE items SET line = x'' WHERE {line_of}")
    if forget:
        await db.execute(f"DELETE FROM jobs WHERE {c}")  # the tallies' delete trigger
    elif keep_results:
        await db.execute(f"UPDATE jobs SET body = x'' WHERE {c}")
    else:
        await db.execute(f"UPDATE jobs SET body = x'', response = NULL WHERE {c}")
    return int(jobs_bytes) + int(lines_bytes)


async def vacuum(store: JobStore, result: Pruned) -> None:
    """Shrink the file (VACUUM, then a checkpoint that truncates the -wal) if the disk has
    room for the copy VACUUM writes; else say why not in ``result``."""
    path = store.path
    ((live,),) = await store.connection.execute_fetchall(
        "SELECT (page_count - freelist_count) * page_size FROM pragma_page_count, "
        "pragma_freelist_count, pragma_page_size"
    )
    free = shutil.disk_usage(path.parent).free
    if free < 2 * live:  # the copy, then the -wal the copy goes through
        result.vacuum_skipped = (
            f"VACUUM needs about {size_text(2 * live)} free beside the store, "
            f"{size_text(free)} is; "
            "the freed space is reused by later runs, run `aiq prune` again with room to shrink it"
        )
        return
    await store.connection.execute("VACUUM")
    await store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    result.vacuumed = True
