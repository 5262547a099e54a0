"""aiq: run large batches of prompts against LLM APIs, durably and within rate limits.

The CLI is a thin layer over this library::

    from aiq import Config, run_batch
    summary = asyncio.run(run_batch(Config(provider="simulated"), input_path=Path("p.jsonl")))
"""

from .config import Config
from .errors import (
    AiqError,
    FatalProviderError,
    InputError,
    Interrupted,
    LimitReached,
    StoreError,
    StoreLocked,
    UsageError,
)
from .inputs import BadLine, Defaults, Request, read_requests
from .outputs import Export, export_source
from .providers import AnthropicProvider, OpenAIProvider, ProviderError, Reply
from .runner import (
    RunSummary,
    add_file,
    export_outputs,
    replay_dead,
    run_batch,
    store_status,
)
from .store import EnqueueCounts, JobStore, Stats
from .worker import Progress, RetryPolicy, Worker

__version__ = "0.1.0"

__all__ = [
    "AiqError",
    "AnthropicProvider",
    "BadLine",
    "Config",
    "Defaults",
    "EnqueueCounts",
    "Export",
    "FatalProviderError",
    "InputError",
    "Interrupted",
    "JobStore",
    "LimitReached",
    "OpenAIProvider",
    "Progress",
    "ProviderError",
    "Reply",
    "Request",
    "RetryPolicy",
    "RunSummary",
    "Stats",
    "StoreError",
    "StoreLocked",
    "UsageError",
    "Worker",
    "__version__",
    "add_file",
    "export_outputs",
    "export_source",
    "read_requests",
    "replay_dead",
    "run_batch",
    "store_status",
]
