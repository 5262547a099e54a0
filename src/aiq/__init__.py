"""aiq: run large batches of prompts against LLM APIs, durably and within rate limits.

The CLI is a thin layer over this library::

    from aiq import Config, run_batch
    summary = asyncio.run(run_batch(Config(provider="simulated"), input_path=Path("p.jsonl")))
"""

from .config import Config
from .costs import CostMeter
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
from .limiter import Limiters, RateLimiter
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
from .records import EnqueueCounts, ModelUsage, Replayed, Stats, Target
from .requestfile import read_requests
from .run_records import Export, Progress, RunSummary
from .runner import (
    add_file,
    export_outputs,
    forecast_file,
    replay_dead,
    run_batch,
    store_status,
)
from .store import JobStore
from .usage import Usage
from .worker import RetryPolicy, Worker

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CHECKS",
    "DEFAULT_PRICES",
    "PRICES_AS_OF",
    "PRICE_MAX_AGE_DAYS",
    "AiqError",
    "AnthropicProvider",
    "BadLine",
    "CheckReport",
    "Config",
    "CostMeter",
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
    "RateLimiter",
    "Replayed",
    "Reply",
    "Request",
    "RetryPolicy",
    "RunSummary",
    "Stats",
    "StoreError",
    "StoreLocked",
    "Target",
    "Usage",
    "UsageError",
    "Worker",
    "__version__",
    "add_file",
    "export_outputs",
    "export_source",
    "forecast_file",
    "prices_in_force",
    "read_requests",
    "replay_dead",
    "run_batch",
    "run_checks",
    "store_status",
]
