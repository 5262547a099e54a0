"""Providers turn a request into a reply or a classified error; they never touch the store."""

from .anthropic import AnthropicProvider
from .base import Provider, ProviderError, Reply, classify_status
from .openai import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "Reply",
    "classify_status",
]
