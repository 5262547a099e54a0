"""``make_provider(config)``: the provider and transport a run sends through, from its spec.

Not imported by ``aiq.providers`` itself: it loads aiohttp, which only a run needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import httpx

from ..contract import Api
from ..errors import UsageError
from ..registry import spec_for
from ..transport import AiohttpTransport
from .anthropic import AnthropicProvider
from .anthropic_batches import AnthropicBatchApi
from .base import Provider
from .batch_http import BatchHttp
from .batches import Answers, BatchService
from .http import HttpProvider
from .openai import OpenAIProvider
from .openai_batches import BatchApi
from .simulated import SimulatedTransport

if TYPE_CHECKING:
    from ..config import Config

# The class that speaks each wire format (ProviderSpec.api): a new format's one entry here.
CLASSES: dict[Api, type[HttpProvider]] = {
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
}

# The batch API of each wire format that has one (``--via batch``).
BATCH_CLASSES: dict[Api, type[BatchHttp]] = {
    "openai": BatchApi,
    "anthropic": AnthropicBatchApi,
}


def make_batch_service(
    config: Config, transport: httpx.AsyncBaseTransport
) -> tuple[BatchService, Answers]:
    """The batch API of ``config``'s provider over ``transport``, and its online class, which
    reads each result line's reply exactly as an online call's. UsageError for no key where
    the provider's own service needs one."""
    spec = spec_for(config.provider)
    if not config.api_key and spec.needs_key(config.base_url):
        raise UsageError(f"no API key: set {config.api_key_env}")
    args: dict[str, Any] = {
        "base_url": config.base_url, "api_key": config.api_key,
        "api_key_env": config.api_key_env, "extra_headers": config.extra_headers,
        "connect_timeout_s": config.connect_timeout_s, "spec": spec,
    }  # fmt: skip
    tokens = config.max_tokens
    service = BATCH_CLASSES[spec.api](
        transport, read_timeout_s=config.timeout_s, default_max_tokens=tokens, **args
    )
    answers = CLASSES[spec.api](transport, default_max_tokens=tokens, **args)
    # Each class of a format with a batch API implements both interfaces (mypy cannot see
    # it through the tables).
    return cast(BatchService, service), cast(Answers, answers)


def make_provider(config: Config, *, pool_size: int) -> tuple[Provider, httpx.AsyncBaseTransport]:
    """The provider of ``config`` and the transport under it, with ``pool_size`` connections
    at most (the caller closes the transport). UsageError for an unknown provider, or for no
    key where the provider's own service needs one."""
    spec = spec_for(config.provider)
    if not config.api_key and spec.needs_key(config.base_url):
        raise UsageError(f"no API key: set {config.api_key_env} (or try --provider simulated)")
    transport: httpx.AsyncBaseTransport
    if spec.offline:
        transport = SimulatedTransport(
            latency_s=config.simulated_latency_s,
            transient_error_rate=config.simulated_error_rate,
        )
    else:
        transport = AiohttpTransport(max_connections=pool_size)
    provider = CLASSES[spec.api](
        transport,
        base_url=config.base_url,
        api_key=config.api_key,
        api_key_env=config.api_key_env,
        extra_headers=config.extra_headers,
        connect_timeout_s=config.connect_timeout_s,
        read_timeout_s=config.call_timeout_s,
        default_max_tokens=config.max_tokens,
        spec=spec,
    )
    if config.via == "flex" and isinstance(provider, OpenAIProvider):
        provider.service_tier = "flex"
    return provider, transport
