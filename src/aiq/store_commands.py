"""The library behind the commands that send nothing: status, export, errors, show,
replay-dead and prune. Each takes a Config and returns data for the CLI to render; the reads
open the store read-only, so they work while a run holds it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .blocking import run as run_here
from .config import Config
from .database import require_store
from .lock import StoreLock, run_state
from .records import Replayed
from .retention import Pruned, prune, store_size, vacuum
from .stats import Stats
from .store import open_store

if TYPE_CHECKING:
    from . import inspection
    from .run_records import Export

# What one command uses and `status` does not (the exporter, replay with its body checks,
# the inspection reads) is imported inside it: status starts that much sooner.


async def export_outputs(
    config: Config, *, out: str | None = None, dead: str | None = None
) -> list[Export]:
    """``aiq export``: rewrite every input file's results and dead letters from the store."""
    from .outputs import export_all

    async with open_store(config.db, readonly=True) as store:
        return await export_all(store, None, order=config.order, out=out, dead=dead)


async def store_status(config: Config) -> Stats:
    """``aiq status``: read-only, so it works while a run holds the store. Whether a run is
    active comes from the lock (never taken here); its rate, from the time it has sent for."""
    return await _status(config, blocking=False)


def store_status_now(config: Config) -> Stats:
    """``store_status`` in the calling thread, without an event loop (aiq.blocking): the
    CLI's, which then starts without asyncio and aiosqlite."""
    return run_here(_status(config, blocking=True))


async def _status(config: Config, *, blocking: bool) -> Stats:
    run = run_state(config.db)
    since = (run.sending_since or run.started_at) if run.active else None
    async with open_store(config.db, readonly=True, blocking=blocking) as store:
        stats = await store.stats(since=since)
    return dataclasses.replace(stats, run=run, size_bytes=store_size(config.db))


async def dead_errors(
    config: Config, *, error_type: str | None = None, limit: int = 5
) -> list[inspection.DeadType]:
    """``aiq errors``: read-only, so it works while a run holds the store."""
    from . import inspection

    require_store(config.db)
    async with open_store(config.db, readonly=True) as store:
        return await inspection.dead_errors(store, error_type=error_type, limit=limit)


async def show_job(config: Config, custom_id: str) -> list[inspection.Shown]:
    """``aiq show``: read-only, so it works while a run holds the store."""
    from . import inspection

    require_store(config.db)
    async with open_store(config.db, readonly=True) as store:
        return await inspection.show(store, custom_id)


async def replay_dead(
    config: Config,
    *,
    error_type: str | None = None,
    custom_ids: tuple[str, ...] = (),
    sets: tuple[str, ...] = (),
    dry_run: bool = False,
) -> Replayed:
    """``aiq replay-dead``: dead jobs (all, of one error type, of these custom_ids) back to
    queued, attempts reset, with ``sets`` (``FIELD=VALUE``) as new requests with those body
    fields changed; UsageError, and nothing replayed, for a filter that names what the store
    does not have or a change that makes a body invalid (see replay.replay). ``dry_run``:
    what it would do, the store unchanged."""
    from .overrides import parse_sets
    from .replay import replay

    changes = parse_sets(sets)
    require_store(config.db)
    async with open_store(config.db, readonly=dry_run) as store:
        return await replay(
            store, error_type=error_type, custom_ids=custom_ids, sets=changes, dry_run=dry_run
        )


async def prune_store(
    config: Config,
    *,
    done_older_than_s: float,
    dead_older_than_s: float | None = None,
    keep_results: bool = False,
    forget: bool = False,
    lock_wait_s: float = 0.0,
) -> Pruned:
    """``aiq prune``: exported jobs' requests and replies out of the store, then a VACUUM
    (aiq.retention). Holds the store's lock: a run must not finish or export jobs meanwhile."""
    require_store(config.db)
    async with StoreLock(config.db, wait_s=lock_wait_s), open_store(config.db) as store:
        before = store_size(config.db)
        pruned = await prune(
            store, done_older_than_s=done_older_than_s, dead_older_than_s=dead_older_than_s,
            keep_results=keep_results, forget=forget,
        )  # fmt: skip
        if pruned.done or pruned.dead:
            await vacuum(store, pruned)
    pruned.size_before, pruned.size_after = before, store_size(config.db)
    return pruned
