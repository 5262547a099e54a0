"""``replay-dead --set FIELD=VALUE``: dead jobs sent again with fields of their bodies changed.

A changed body is a new request, under a new dedup key: the old dead job's custom_ids are
re-pointed to it, so each still has one result line, the new reply, and the old job, wanted
by nobody, is dropped (its recorded failures go with the custom_ids to the new job, so `aiq
show` keeps their history). A body the change makes invalid, by the rules a line is read
under at intake (``inputs.parse_line``), refuses the whole replay.

Writes through the store's connection, as ``enqueue`` does: the store knows nothing of bodies.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from . import tallies
from .defaults import Defaults
from .errors import UsageError
from .inputs import MESSAGES, LineError, canonical, custom_id_hash, parse_line
from .records import DEAD, QUEUED
from .store import JobStore

# Not body fields: aiq's own, read from the input line.
_NOT_BODY = frozenset({"custom_id", "priority"})
_K64 = struct.Struct(">q")


def parse_sets(values: Sequence[str]) -> dict[str, Any]:
    """``--set`` values (``FIELD=VALUE``) as {field: value}: the value as JSON, else as the
    text it is (``model=gpt-4o``; ``max_tokens=2048`` is a number, ``stop='"2048"'`` text),
    ``null`` to take the field out. UsageError naming the bad one."""
    sets: dict[str, Any] = {}
    for given in values:
        name, eq, raw = given.partition("=")
        name = name.strip()
        if not eq or not name:
            raise UsageError(
                f"--set {given!r}: expected FIELD=VALUE, such as --set max_tokens=2048 or "
                "--set model=gpt-4o"
            )
        if name in _NOT_BODY:
            raise UsageError(f"--set {given!r}: {name} is aiq's, not a field of the request body")
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw
        if name in sets and sets[name] != value:
            raise UsageError(f"--set {name}: given twice, as {sets[name]!r} and {value!r}")
        sets[name] = value
    return sets


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """A dead job and the new request its changed body makes."""

    job_id: int
    k64: int
    priority: int
    endpoint: str
    body: bytes  # canonical, as intake writes it
    key: bytes
    changed: tuple[str, ...]  # the fields whose value the change altered

    @property
    def new_k64(self) -> int:
        return int(_K64.unpack_from(self.key)[0])


def rebuild(sets: dict[str, Any], job: tuple[int, int, int, str, bytes], whose: str) -> Rebuilt:
    """The request ``job`` (id, k64, priority, endpoint, body) makes with ``sets`` applied,
    validated as a line is at intake; UsageError saying why it would be invalid (``whose``:
    the job, as the message names it)."""
    job_id, k64, priority, endpoint, raw = job
    body = orjson.loads(raw)
    changed = []
    for name, value in sets.items():
        if body.get(name, _ABSENT) != (_ABSENT if value is None else value):
            changed.append(name)
        if value is None:
            body.pop(name, None)
        else:
            body[name] = value
    # The shape that carries a whole body to this endpoint: what intake checks it against.
    line = {"params": body} if endpoint == MESSAGES else {"url": endpoint, "body": body}
    try:
        req = parse_line(canonical(line), 0, Defaults())
    except LineError as exc:
        shown = " ".join(f"{k}={orjson.dumps(v).decode()}" for k, v in sets.items())
        raise UsageError(
            f"--set {shown} would make the request of {whose} invalid: {exc}; nothing was replayed"
        ) from None
    return Rebuilt(job_id, k64, priority, endpoint, req.body, req.key, tuple(changed))


_ABSENT: Any = object()


async def write(
    store: JobStore, rebuilt: Sequence[Rebuilt], named: Sequence[tuple[str, int]] | None
) -> int:
    """Queue the new requests and re-point the old jobs' items to them (only those of
    ``named``, (custom_id, job id) pairs, when given), in one transaction; returns how many
    requests are queued.

    A new request the store already has is not added again: queued or done it stays so (a
    done one's reply is the custom_id's at once), dead it is queued again.
    """
    db = store.connection
    now = time.time()
    async with store.transaction():
        cur = await db.executemany(
            "INSERT INTO jobs (created_at, k64, key, endpoint, body, priority) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (k64) DO NOTHING",
            [(now, r.new_k64, r.key, r.endpoint, r.body, r.priority) for r in rebuilt],
        )
        if cur.rowcount:
            await tallies.add_queued(db, cur.rowcount)
        await db.executemany(
            "UPDATE jobs SET state = ?, attempts = 0, next_at = 0, finished_at = NULL "
            "WHERE k64 = ? AND state = ?",
            [(QUEUED, r.new_k64, DEAD) for r in rebuilt],
        )
        moved = [r for r in rebuilt if r.new_k64 != r.k64]  # else a plain replay
        await db.executemany(
            "INSERT INTO errors (job_id, attempts, at, error_type, status_code, message, "
            "request_id, state) SELECT (SELECT id FROM jobs WHERE k64 = ?), attempts, at, "
            "error_type, status_code, message, request_id, state FROM errors WHERE job_id = ?",
            [(r.new_k64, r.job_id) for r in moved],
        )
        if moved:
            await _repoint(store, moved, named)
            await _drop_unwanted(store, [r.k64 for r in moved])
    return len({r.new_k64 for r in rebuilt})


async def _repoint(
    store: JobStore, rebuilt: Sequence[Rebuilt], named: Sequence[tuple[str, int]] | None
) -> None:
    db = store.connection
    moves = {r.k64: r.new_k64 for r in rebuilt}
    if named is None:
        # Items have no index on their job: one pass over them, each looked up in the moves.
        await db.execute(
            "CREATE TEMP TABLE IF NOT EXISTS replay_moves "
            "(old INTEGER PRIMARY KEY, new INTEGER NOT NULL)"
        )
        await db.executemany("INSERT INTO replay_moves VALUES (?, ?)", list(moves.items()))
        await db.execute(
            "UPDATE items SET job_k64 = (SELECT new FROM replay_moves WHERE old = items.job_k64) "
            "WHERE job_k64 IN (SELECT old FROM replay_moves)"
        )
        await db.execute("DROP TABLE replay_moves")
        return
    by_id = {r.job_id: r for r in rebuilt}
    for source in await store.sources():  # through the (source_id, ck) index
        # A job other custom_ids share stays theirs: only those named move.
        await db.executemany(
            "UPDATE items SET job_k64 = ? WHERE source_id = ? AND ck = ? AND custom_id = ? "
            "AND job_k64 = ?",
            [
                (by_id[j].new_k64, source.id, custom_id_hash(c), c, by_id[j].k64)
                for c, j in named
                if j in by_id
            ],
        )


async def _drop_unwanted(store: JobStore, k64s: list[int]) -> None:
    """Delete the old dead jobs no item points to any more (their failures with them, by
    trigger); forget the re-points the items' trigger noted, which were these."""
    db = store.connection
    for i in range(0, len(k64s), 900):
        chunk = k64s[i : i + 900]
        marks = ", ".join("?" * len(chunk))
        await db.execute(
            f"DELETE FROM jobs WHERE k64 IN ({marks}) AND state = ? AND k64 NOT IN "
            f"(SELECT job_k64 FROM items WHERE job_k64 IN ({marks}))",
            [*chunk, DEAD, *chunk],
        )
        await db.execute(f"DELETE FROM repointed WHERE k64 IN ({marks})", chunk)
