"""Anthropic's Messages API: /v1/messages bodies as they are, chat and prompt jobs translated.

The queue stores what the input line asked for (DESIGN.md, "Dedup key"), so a file of chat or
prompt lines keeps its keys whichever provider runs it; the translation to Anthropic's shape
happens here, at send time (:mod:`aiq.providers.anthropic_messages`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from ..stops import anthropic_stop
from ..usage import anthropic_usage
from .anthropic_messages import DEFAULT_MAX_TOKENS, to_messages_body
from .base import (
    Post,
    ProviderError,
    Reply,
    body_start,
    error_from,
    exchange,
    reply_headers,
    secret_of,
)

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_MAX_TOKENS", "AnthropicProvider"]

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicProvider:
    """Sends jobs to ``POST {base_url}/v1/messages`` over an ``httpx.AsyncBaseTransport``.

    Built like :class:`aiq.providers.openai.OpenAIProvider` (see its docstring for why there is
    no ``httpx.AsyncClient``): the same constructor, ``send(endpoint, body) -> Reply``, and every
    failure a classified :class:`ProviderError`. A job that cannot be expressed in Anthropic's
    API (embeddings, ``n`` > 1, tool messages…) is a permanent ``invalid_request`` error: it
    dead-letters with a message saying why, and nothing is sent.

    ``default_max_tokens`` is used for requests that name no ``max_tokens`` (Anthropic requires
    one). The caller owns the transport and closes it.
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        *,
        base_url: str,
        api_key: str | None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        extra_headers: Mapping[str, str] | None = None,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
    ) -> None:
        self._transport = transport
        base = base_url.rstrip("/")
        # Anthropic's SDK takes the host ("https://api.anthropic.com"); accept ".../v1" too.
        self._base = base[:-3] if base.endswith("/v1") else base
        self._key_env = api_key_env
        self._default_max_tokens = default_max_tokens
        headers = {
            "accept-encoding": "gzip, deflate",
            "content-type": "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
            **(extra_headers or {}),
        }
        if api_key:
            headers["x-api-key"] = api_key
        self._secret = secret_of(api_key)  # cut out of error messages, never out of replies
        self._headers = httpx.Headers(headers)
        self._extensions: dict[str, Any] = {
            "timeout": {
                "connect": connect_timeout_s,
                "read": read_timeout_s,
                "write": read_timeout_s,
                "pool": None,  # the worker pool bounds waiting already: queueing, not failure
            }
        }
        self._messages: Post | None = None

    def url(self) -> httpx.URL:
        """The Messages endpoint, parsed once."""
        return self._post().url

    def _post(self) -> Post:
        """How Messages requests are built, made once."""
        if self._messages is None:
            url = httpx.URL(self._base + "/v1/messages")
            self._messages = Post(url, self._headers, self._extensions)
        return self._messages

    async def send(self, endpoint: str, body: bytes) -> Reply:
        """POST one job as a Messages request; returns the Reply or raises a ProviderError."""
        content = to_messages_body(endpoint, body, default_max_tokens=self._default_max_tokens)
        try:
            post = self._post()
        except httpx.InvalidURL as exc:
            message = f"invalid URL {self._base + '/v1/messages'!r}: {exc}"
            raise ProviderError("not_found", message, fatal=True) from None
        request = post.request(content)
        resp, raw = await exchange(self._transport, request, base=self._base)
        if resp.status_code != 200:
            raise error_from(
                resp, raw, key_env=self._key_env, secret=self._secret, code_keys=("type",)
            )
        return _reply(resp, raw, self._secret)


def _reply(resp: httpx.Response, raw: bytes, secret: str | None) -> Reply:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise ProviderError(
            "bad_response",
            "HTTP 200 without a well-formed Message (no 'content' list): "
            f"{body_start(raw, secret, 200)!r}",
            status_code=200,
            retryable=True,
        )
    request_id, limits = reply_headers(resp.headers, b"request-id")
    usage = anthropic_usage(data.get("usage"))
    limited_in = None
    if usage is not None:
        reads = 0 if _reads_count(data.get("model")) else usage.cache_read
        limited_in = usage.tokens_in - reads
    return Reply.of(
        raw, request_id or data.get("id"), usage, limits, anthropic_stop(data), limited_in
    )


def _reads_count(model: object) -> bool:
    """Whether ``model``'s input-token limit counts cache reads: only Claude Haiku 3.5's does
    (Anthropic's rate-limits page: "cache_read_input_tokens do not count towards ITPM",
    except for the models it marks, Haiku 3.5)."""
    return isinstance(model, str) and model.startswith(("claude-3-5-haiku", "claude-haiku-3-5"))
