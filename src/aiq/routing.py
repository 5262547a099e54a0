"""Where a store's jobs go: the target its first run recorded, and when a run may change it.

A store answers each request once, so the answers it keeps must all come from where its jobs
were meant to go. ``aiq resume`` with no flags goes on with the recorded provider, base URL,
key variable and defaults; a run that would send unfinished jobs elsewhere is refused unless
``--reroute`` says so, and the simulated provider never shares a store with a real one.
"""

from __future__ import annotations

from .config import Config
from .errors import UsageError
from .registry import spec_for
from .store import JobStore


async def aim(store: JobStore, config: Config) -> Config:
    """``config`` resolved over the store's recorded target; UsageError if it would send the
    store's jobs somewhere else and that is not allowed."""
    stored = await store.target()
    if stored is None:  # a new store, or one from before targets were recorded
        return config
    aimed = config.aimed_at(stored)
    wanted = aimed.target
    if wanted.same_place(stored):
        return aimed
    total, unfinished = await store.job_counts()
    if total and (was := spec_for(stored.provider)).offline:
        raise UsageError(
            f"{store.path} holds {was.title}'s jobs and answers: a run to "
            f"{wanted.where} would skip every request the simulation answered. Use a new "
            f"store for it (--db PATH), or remove {store.path}"
        )
    if total and aimed.spec.offline:
        raise UsageError(
            f"{store.path} holds jobs for {stored.where}: {aimed.spec.title} never answers "
            f"them (its answers would be kept as done). Give it a store of its own: "
            f"--db .aiq/{aimed.provider}.db"
        )
    if unfinished and not aimed.reroute:
        were = "job was" if unfinished == 1 else "jobs were"
        raise UsageError(
            f"{store.path}: {unfinished:,} unfinished {were} enqueued for {stored.where}; "
            f"this run would send them to {wanted.where}. "
            "Pass --reroute to move them there on purpose, or use another store (--db PATH)"
        )
    return aimed


async def record(store: JobStore, config: Config) -> None:
    """Remember where this run sends the store's jobs, for the next resume."""
    target = config.target
    if await store.target() != target:
        await store.save_target(target)
