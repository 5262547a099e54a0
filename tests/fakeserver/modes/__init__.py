"""How real providers and gateways count rate limits, as modes of the tests' fake server.

``FakeServer(limit_mode=OpenAIBucket(rpm=600))`` hands every request to the mode: it admits it
or refuses it (the 429 in that provider's words), and writes the rate-limit headers of every
reply as that provider does. Without a mode the server keeps its own sliding-window limiter
(``rpm``, ``tpm``, ``limit_window_s``), which its older tests rely on.

Each mode is one small class whose docstring names its source (the facts are gathered in
``/work/shared/PROVIDERS.md``). They are modelled on the providers, never on aiq's limiter, so
that aiq is measured against how the world counts rather than against its own idea of it.

Time is an argument (``now``, in seconds since the epoch, since gateways count calendar
minutes): the server passes ``time.time()``, a test passes a fake clock. Like the rest of the
fake server this imports nothing from ``aiq``.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import (
    ORGANIZATION,
    Bucket,
    CalendarWindow,
    Cost,
    Mode,
    Refused,
    groq_duration,
    openai_duration,
)
from .gateways import ExpressDraftHeaders, KongGateway
from .providers import (
    AnthropicBuckets,
    AzureWindows,
    GroqDaily,
    LiteLLMRouter,
    OpenAIBucket,
    PerSecond,
    TogetherPerSecond,
)
from .situations import FlexCapacity, Headerless, OtherClient, ParallelLimit, SpendLimit

__all__ = [
    "MODES",
    "ORGANIZATION",
    "AnthropicBuckets",
    "AzureWindows",
    "Bucket",
    "CalendarWindow",
    "Cost",
    "ExpressDraftHeaders",
    "FlexCapacity",
    "GroqDaily",
    "Headerless",
    "KongGateway",
    "LiteLLMRouter",
    "Mode",
    "OpenAIBucket",
    "OtherClient",
    "ParallelLimit",
    "PerSecond",
    "Refused",
    "SpendLimit",
    "TogetherPerSecond",
    "build",
    "groq_duration",
    "openai_duration",
]


MODES: dict[str, Callable[..., Mode]] = {
    "openai": OpenAIBucket,
    "per-second": PerSecond,
    "together": TogetherPerSecond,
    "litellm": LiteLLMRouter,
    "azure": AzureWindows,
    "groq": GroqDaily,
    "anthropic": AnthropicBuckets,
    "headerless": Headerless,
}


def build(
    name: str,
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    rpd: int | None = None,
    slots: int | None = None,
) -> Mode:
    """The mode ``name`` (a key of ``MODES``) from command-line style limits: for
    ``anthropic``, ``tpm`` is both its input and its output limit; for ``groq``, ``rpd`` is the
    reported day limit and ``rpm`` the unreported minute one."""
    if name == "anthropic":
        if rpm is None or tpm is None:
            raise ValueError("anthropic needs rpm and tpm")
        return AnthropicBuckets(rpm=rpm, itpm=tpm, otpm=tpm)
    if name == "groq":
        if rpd is None:
            raise ValueError("groq needs rpd")
        return GroqDaily(rpd=rpd, tpm=tpm, rpm=rpm)
    if name == "headerless":
        return Headerless(rpm=rpm, slots=slots)
    return MODES[name](rpm=rpm, tpm=tpm)
