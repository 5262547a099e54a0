"""The closed sets of values that cross aiq's boundaries: job states, error types, how a reply
or a run stopped, providers, export orders. One place to read them, and mypy to hold every
layer to them.

They are ``Literal`` types, not enums: each value is stored in SQLite, written to JSON and
typed in flags as the plain string (or, for job states, the int) it already is, so nothing
converts at a boundary or costs anything per job; ``typing.get_args`` gives the runtime
tuple where a value must be checked (settings.py, the CLI's choices).
"""

from __future__ import annotations

from typing import Final, Literal, get_args

# A job's state, as the store's ``jobs.state`` column holds it.
JobState = Literal[0, 1, 2, 3]
QUEUED: Final = 0
RUNNING: Final = 1
DONE: Final = 2
DEAD: Final = 3
StateName = Literal["queued", "running", "done", "dead"]
STATE_NAMES: Final[tuple[StateName, ...]] = get_args(StateName)  # by JobState, in order

# How a provider call failed (ProviderError.error_type). providers/failures.py classifies HTTP
# replies into these; the worker adds "outage" when it gives up on a provider.
ErrorType = Literal[
    "invalid_request",
    "auth",
    "not_found",
    "quota",
    "spend_limit",
    "rate_limit",
    "capacity",
    "server",
    "timeout",
    "connection",
    "bad_response",
    "outage",
]
# How a 200 reply stopped short (aiq.stops): kept, but counted apart.
StopKind = Literal["truncated", "content_filter"]
# What a job's ``error_type`` column may say: its last failure, how its reply stopped short,
# or that aiq itself stopped under it too often ("crashed", store.recover_running).
JobError = ErrorType | StopKind | Literal["crashed"]

# Why a run stopped before the queue was empty (RunSummary.stopped; None: it ran to the end).
StopReason = Literal["interrupted", "limit", "budget", "fatal"]

ProviderName = Literal["openai", "anthropic", "simulated"]
# The wire format a provider speaks: which provider class sends its requests.
Api = Literal["openai", "anthropic"]
# The order of a results file: as jobs finished, or as their lines came in the input.
Order = Literal["done", "input"]
# What a run does with a reply cut off at max_tokens (aiq.stops).
OnTruncated = Literal["keep", "dead"]

# How a run sends its jobs (issue 15): one call each, the flex tier, the provider's batch
# engine, or the cheapest that meets a deadline. Only online and batch are built so far.
Via = Literal["online", "flex", "batch", "auto"]
# The tier a reply was billed at (``jobs.tier``, for cost per tier): the list price online (a
# standard, default or priority tier: priced alike, aiq.pricing), OpenAI's flex tier, a
# provider's batch engine. NULL in the store: no reply, or done before 0011_tiers.
Tier = Literal["online", "flex", "batch"]

PROVIDER_NAMES: Final[tuple[ProviderName, ...]] = get_args(ProviderName)
ORDERS: Final[tuple[Order, ...]] = get_args(Order)
ON_TRUNCATED: Final[tuple[OnTruncated, ...]] = get_args(OnTruncated)
VIAS: Final[tuple[Via, ...]] = get_args(Via)
TIERS: Final[tuple[Tier, ...]] = get_args(Tier)


def billed_tier(said: str | None) -> Tier:
    """The tier a reply is billed at, from the one it says served it (OpenAI's
    ``service_tier``; ``batch`` for a batch line): flex and batch by name, as aiq.pricing
    prices them; any other, or none, online."""
    return "flex" if said == "flex" else "batch" if said == "batch" else "online"
