"""Anthropic's Messages API: /v1/messages bodies as they are, chat and prompt jobs translated.

The queue stores what the input line asked for (DESIGN.md, "Dedup key"), so a file of chat or
prompt lines keeps its keys whichever provider runs it; the translation to Anthropic's shape
happens here, at send time (:mod:`aiq.providers.anthropic_messages`).
"""

from __future__ import annotations

from typing import ClassVar

import httpx
import orjson

from ..ratelimit_headers import RateLimitInfo
from ..registry import ANTHROPIC, ANTHROPIC_MAX_TOKENS, ANTHROPIC_VERSION, ProviderSpec
from ..stops import anthropic_stop
from ..usage import anthropic_usage
from .anthropic_messages import to_messages_body
from .base import ProviderError, Reply, body_start, exchange, reply_headers
from .http import HttpProvider

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_MAX_TOKENS", "AnthropicProvider"]

DEFAULT_MAX_TOKENS = ANTHROPIC_MAX_TOKENS
_MESSAGES = "/v1/messages"


class AnthropicProvider(HttpProvider):
    """Sends jobs to ``POST {base_url}/v1/messages`` over an ``httpx.AsyncBaseTransport``.

    Built like :class:`aiq.providers.openai.OpenAIProvider` (:class:`~aiq.providers.http.
    HttpProvider`: the same constructor), ``send(endpoint, body) -> Reply``, and every failure
    a classified :class:`ProviderError`. The base URL is the host, as Anthropic's SDK takes
    it; a trailing ``/v1`` is accepted too. A job that cannot be expressed in Anthropic's API
    (embeddings, ``n`` > 1, tool messages…) is a permanent ``invalid_request`` error: it
    dead-letters with a message saying why, and nothing is sent.

    ``default_max_tokens`` is used for requests that name no ``max_tokens`` (Anthropic requires
    one). The caller owns the transport and closes it.
    """

    SPEC: ClassVar[ProviderSpec] = ANTHROPIC

    def url(self) -> httpx.URL:
        """The Messages endpoint, parsed once."""
        return self._post(_MESSAGES).url

    async def send(self, endpoint: str, body: bytes) -> Reply:
        """POST one job as a Messages request; returns the Reply or raises a ProviderError."""
        max_tokens = self._default_max_tokens or DEFAULT_MAX_TOKENS
        content = to_messages_body(endpoint, body, default_max_tokens=max_tokens)
        request = self._post(_MESSAGES).request(content)
        resp, raw = await exchange(self._transport, request, base=self._base)
        if resp.status_code != 200:
            raise self._error(resp, raw)
        request_id, limits = reply_headers(resp.headers, self._spec.request_id_header)
        return _reply(raw, self._secret, request_id, limits)

    def answer(
        self, endpoint: str, status_code: int, content: bytes, request_id: str | None = None
    ) -> Reply:
        """A reply that came some other way (a Message Batches result: a ``succeeded``
        line's message as a 200, an ``errored`` line's error with its status), read exactly
        as :meth:`send` reads one: the Reply, or the classified ProviderError."""
        if status_code != 200:
            headers = {self._spec.request_id_header.decode(): request_id} if request_id else None
            raise self._error(httpx.Response(status_code, headers=headers), content)
        return _reply(content, self._secret, request_id, None)


def _reply(
    raw: bytes, secret: str | None, request_id: str | None, limits: RateLimitInfo | None
) -> Reply:
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
