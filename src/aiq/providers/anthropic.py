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
    token_count,
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
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    request_id, limits = reply_headers(resp.headers, b"request-id")
    fresh = token_count(usage.get("input_tokens"))
    written = token_count(usage.get("cache_creation_input_tokens"))
    read = token_count(usage.get("cache_read_input_tokens"))
    return Reply(
        200,
        raw,
        request_id or data.get("id"),
        # input_tokens leaves out the prompt's cached part; every prompt token counts here.
        fresh + written + read,
        token_count(usage.get("output_tokens")),
        limits,
        billed_in=_billed_in(usage, fresh, written, read) if written or read else None,
    )


def _billed_in(usage: dict[str, Any], fresh: int, written: int, read: int) -> float:
    """The prompt in input-price tokens: cache writes cost 1.25x the input price (2x for the
    1-hour cache), cache reads 0.1x (Anthropic's prompt caching prices)."""
    split = usage.get("cache_creation")
    hour = token_count(split.get("ephemeral_1h_input_tokens")) if isinstance(split, dict) else 0
    hour = min(hour, written)
    return fresh + 1.25 * (written - hour) + 2.0 * hour + 0.1 * read
