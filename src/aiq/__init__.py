"""aiq: run large batches of prompts against LLM APIs, durably and within rate limits.

The CLI is a thin layer over this library::

    from aiq import Config, run_batch
    summary = asyncio.run(run_batch(Config(provider="simulated"), input_path=Path("p.jsonl")))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name and the module it lives in. Imported on first use (PEP 562), not here:
# `aiq --help` and `aiq status` start in a fraction of the time when `import aiq` does not
# load the HTTP clients, the provider classes and the worker they do not use.
_EXPORTS = {
    "BatchEngine": "batch_engine",
    "Batch": "batch_records",
    "BatchRun": "run_records",
    "Config": "config",
    "CostMeter": "costs",
    "forecast_file": "dry_run",
    "AiqError": "errors",
    "FatalProviderError": "errors",
    "InputError": "errors",
    "Interrupted": "errors",
    "LimitReached": "errors",
    "OutputError": "errors",
    "StoreError": "errors",
    "StoreLocked": "errors",
    "UsageError": "errors",
    "Forecast": "forecast",
    "BadLine": "inputs",
    "Defaults": "inputs",
    "Request": "inputs",
    "DeadType": "inspection",
    "Shown": "inspection",
    "Limiters": "limiters",
    "RateLimiter": "limiter",
    "export_source": "outputs",
    "CheckReport": "preflight",
    "Finding": "preflight",
    "run_checks": "preflight",
    "PriceRow": "prices",
    "prices_in_force": "prices",
    "DEFAULT_CHECKS": "pricing",
    "DEFAULT_PRICES": "pricing",
    "PRICES_AS_OF": "pricing",
    "PRICE_MAX_AGE_DAYS": "pricing",
    "Price": "pricing",
    "PriceCheck": "pricing",
    "AnthropicProvider": "providers",
    "AnthropicBatchApi": "providers.anthropic_batches",
    "BatchApi": "providers.openai_batches",
    "BatchService": "providers.batches",
    "OpenAIProvider": "providers",
    "ProviderError": "providers",
    "Reply": "providers",
    "EnqueueCounts": "records",
    "ModelUsage": "stats",
    "Pruned": "records",
    "Replayed": "records",
    "Stats": "stats",
    "Target": "records",
    "TierUsage": "stats",
    "read_requests": "requestfile",
    "Export": "run_records",
    "Progress": "run_records",
    "RunSummary": "run_records",
    "add_file": "runner",
    "cancel_batches": "runner",
    "run_batch": "runner",
    "JobStore": "store",
    "dead_errors": "store_commands",
    "export_outputs": "store_commands",
    "prune_store": "store_commands",
    "replay_dead": "store_commands",
    "show_job": "store_commands",
    "store_status": "store_commands",
    "Usage": "usage",
    "RetryPolicy": "worker",
    "Worker": "worker",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'aiq' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once: later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    """The public surface (and the module's dunders), not the helpers this file imports."""
    return sorted({*(n for n in globals() if n.startswith("__")), *_EXPORTS})


if TYPE_CHECKING:  # the same names, for type checkers and editors (tests/test_layers.py)
    from .batch_engine import BatchEngine
    from .batch_records import Batch
    from .config import Config
    from .costs import CostMeter
    from .dry_run import forecast_file
    from .errors import (
        AiqError,
        FatalProviderError,
        InputError,
        Interrupted,
        LimitReached,
        OutputError,
        StoreError,
        StoreLocked,
        UsageError,
    )
    from .forecast import Forecast
    from .inputs import BadLine, Defaults, Request
    from .inspection import DeadType, Shown
    from .limiter import RateLimiter
    from .limiters import Limiters
    from .outputs import export_source
    from .preflight import CheckReport, Finding, run_checks
    from .prices import PriceRow, prices_in_force
    from .pricing import (
        DEFAULT_CHECKS,
        DEFAULT_PRICES,
        PRICE_MAX_AGE_DAYS,
        PRICES_AS_OF,
        Price,
        PriceCheck,
    )
    from .providers import AnthropicProvider, OpenAIProvider, ProviderError, Reply
    from .providers.anthropic_batches import AnthropicBatchApi
    from .providers.batches import BatchService
    from .providers.openai_batches import BatchApi
    from .records import EnqueueCounts, Pruned, Replayed, Target
    from .requestfile import read_requests
    from .run_records import BatchRun, Export, Progress, RunSummary
    from .runner import add_file, cancel_batches, run_batch
    from .stats import ModelUsage, Stats, TierUsage
    from .store import JobStore
    from .store_commands import (
        dead_errors,
        export_outputs,
        prune_store,
        replay_dead,
        show_job,
        store_status,
    )
    from .usage import Usage
    from .worker import RetryPolicy, Worker

__all__ = [
    "DEFAULT_CHECKS",
    "DEFAULT_PRICES",
    "PRICES_AS_OF",
    "PRICE_MAX_AGE_DAYS",
    "AiqError",
    "AnthropicBatchApi",
    "AnthropicProvider",
    "BadLine",
    "Batch",
    "BatchApi",
    "BatchEngine",
    "BatchRun",
    "BatchService",
    "CheckReport",
    "Config",
    "CostMeter",
    "DeadType",
    "Defaults",
    "EnqueueCounts",
    "Export",
    "FatalProviderError",
    "Finding",
    "Forecast",
    "InputError",
    "Interrupted",
    "JobStore",
    "LimitReached",
    "Limiters",
    "ModelUsage",
    "OpenAIProvider",
    "OutputError",
    "Price",
    "PriceCheck",
    "PriceRow",
    "Progress",
    "ProviderError",
    "Pruned",
    "RateLimiter",
    "Replayed",
    "Reply",
    "Request",
    "RetryPolicy",
    "RunSummary",
    "Shown",
    "Stats",
    "StoreError",
    "StoreLocked",
    "Target",
    "TierUsage",
    "Usage",
    "UsageError",
    "Worker",
    "__version__",
    "add_file",
    "cancel_batches",
    "dead_errors",
    "export_outputs",
    "export_source",
    "forecast_file",
    "prices_in_force",
    "prune_store",
    "read_requests",
    "replay_dead",
    "run_batch",
    "run_checks",
    "show_job",
    "store_status",
]
