"""``replay-dead``: dead jobs back to the queue, and a refusal for filters that match nothing
the store has (a typo must not pass for "nothing to replay")."""

from __future__ import annotations

import difflib
from typing import Any

from . import overrides
from .errors import UsageError
from .records import DEAD, STATE_NAMES, Replayed
from .store import JobStore
from .text import plural


async def replay(
    store: JobStore,
    *,
    error_type: str | None = None,
    custom_ids: tuple[str, ...] = (),
    sets: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> Replayed:
    """Queue again the dead jobs of ``error_type`` and of ``custom_ids`` (all, without them),
    attempts reset; with ``sets`` (``overrides.parse_sets``), as new requests with those
    fields of their bodies changed (``overrides``). ``dry_run``: count, change nothing.

    UsageError, and nothing replayed, for a custom_id no input line has, or an error type no
    dead job has (the message lists those they have). A store with no dead job has nothing to
    replay whatever the filters: not an error, so a cron line can replay every night.
    """
    result = Replayed(dead_types=await store.dead_error_types())
    found = await store.jobs_of(custom_ids) if custom_ids else {}
    unknown = [c for c in dict.fromkeys(custom_ids) if c not in found]
    if unknown:
        raise UsageError(
            f"{_listing('unknown custom_id', unknown)}: not in any input file of this store; "
            "nothing was replayed (check the ids, or pass --db for another store)"
        )
    result.not_replayed = {  # in the order asked
        c: why for c in dict.fromkeys(custom_ids) if (why := _why_not(found[c], error_type))
    }
    if not result.dead_types:
        return result
    if error_type is not None and error_type not in result.dead_types:
        raise UsageError(unknown_type(error_type, result.dead_types))
    job_ids = None
    if custom_ids:
        job_ids = [j for jobs in found.values() for j, state, _ in jobs if state == DEAD]
    if not sets and not dry_run:
        result.replayed = await store.replay_dead(error_type=error_type, job_ids=job_ids)
        return result
    dead = await store.dead_jobs(error_type=error_type, job_ids=job_ids)
    result.dry_run, result.sets = dry_run, dict(sets or {})
    rebuilt = [await _rebuilt(store, result.sets, job) for job in dead] if sets else []
    for r in rebuilt:
        for name in r.changed:
            result.changed[name] = result.changed.get(name, 0) + 1
    if dry_run:
        result.replayed = len(dead)
    elif rebuilt:
        named = [(c, j) for c, jobs in found.items() for j, _, _ in jobs] if custom_ids else None
        result.new_requests = await overrides.write(store, rebuilt, named)
        result.replayed = len(rebuilt)
    return result


async def _rebuilt(
    store: JobStore, sets: dict[str, Any], job: tuple[int, int, int, str, bytes]
) -> overrides.Rebuilt:
    try:
        return overrides.rebuild(sets, job, f"dead job {job[0]}")
    except UsageError:  # named by a custom_id of its, looked up only now: a pass over items
        custom_id = await store.custom_id_of(job[0])
        if custom_id is None:
            raise
        return overrides.rebuild(sets, job, f"custom_id {custom_id!r}")


def _why_not(jobs: list[tuple[int, int, str]], error_type: str | None) -> str:
    """Why none of a custom_id's jobs is replayed ("" when one is): its states, or the other
    error its dead ones have."""
    if any(s == DEAD and error_type in (None, t) for _, s, t in jobs):
        return ""
    return ", ".join(
        dict.fromkeys(f"dead with error {t}" if s == DEAD else STATE_NAMES[s] for _, s, t in jobs)
    )


def _listing(noun: str, names: list[str], most: int = 10) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    more = f" and {len(names) - most:,} more" if len(names) > most else ""
    return f"{plural(len(names), noun)} {shown}{more}"


def unknown_type(
    error_type: str, dead_types: dict[str, int], done: str = "replayed", flag: str = "--error"
) -> str:
    """Why ``error_type`` is refused: no dead job has it (the close one, and those they have)."""
    close = [t for t in dead_types if t.startswith(error_type)]
    close += difflib.get_close_matches(error_type, [t for t in dead_types if t not in close], 1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    have = ", ".join(f"{t} {n:,}" for t, n in dead_types.items())
    return (
        f"no dead job has the error type {error_type!r}{hint}; nothing was {done}. The dead "
        f"jobs' error types: {have}. Pass one of them to {flag}, or no {flag} for every one"
    )
