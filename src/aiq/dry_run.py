"""``aiq run FILE --dry-run``: the file read and counted against the store, nothing sent.

The counting is ``forecast``'s (a record the views render, so it imports no store); what
the store already holds, and the prompt ratios it learned, come from here.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from . import calibration
from .config import Config
from .errors import InputError, StoreError
from .forecast import Forecast, Forecaster
from .inputs import count_defaults
from .records import DEAD
from .requestfile import read_requests
from .store import JobStore, open_store
from .text import plural


async def forecast_file(config: Config, path: Path) -> Forecast:
    """``aiq run FILE --dry-run``: validate and count FILE, send nothing, change nothing.

    Requests the store has already done, or dead-lettered, are not counted (a run sends
    neither: dead jobs wait for ``replay-dead``); the store is opened read-only, and only if
    it exists.
    """
    forecast = Forecast(str(path), config.rpm, config.tpm, config.model_limits)
    default_output = 0
    if config.spec.default_max_tokens is not None:  # it requires max_tokens; aiq sends one
        default_output = config.max_tokens or config.spec.default_max_tokens
    async with contextlib.AsyncExitStack() as stack:
        store: JobStore | None = None
        if config.db.exists():
            try:
                store = await stack.enter_async_context(open_store(config.db, readonly=True))
            except StoreError as exc:
                forecast.store_note = f"the store was not consulted: {exc}"
        learned = await calibration.current(store) if store is not None else {}
        counter = Forecaster(
            forecast, config.price_table, default_output=default_output, learned=learned
        )
        reader = read_requests(path, config.defaults)
        for batch in reader.batches(10_000):
            fresh = counter.add(batch)
            if store is not None and fresh:
                finished = await store.finished_among([k for k, _ in fresh])
                dead = sum(state == DEAD for state in finished.values())
                forecast.done_before += len(finished) - dead
                forecast.dead_before += dead
                fresh = [(k, r) for k, r in fresh if k not in finished]
            counter.count(r for _, r in fresh)
    if config.defaults:
        forecast.defaults = count_defaults(reader.applied)
    _refuse_as_run_would(forecast, config, path)
    return forecast


def _refuse_as_run_would(forecast: Forecast, config: Config, path: Path) -> None:
    if forecast.invalid and (config.strict or not forecast.valid):  # run would refuse it
        first = "\n".join(f"  {b}" for b in forecast.bad_lines[:5])
        why = (
            f"{plural(forecast.invalid, 'invalid line')}, and --strict refuses the file"
            if forecast.valid
            else f"no valid line in {forecast.invalid:,}"
        )
        raise InputError(f"{path}: {why} (first ones below); fix it and run again:\n{first}")
