"""OpenAI-compatible APIs: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses."""

from __future__ import annotations

from typing import ClassVar

import httpx
import orjson

from ..registry import OPENAI, ProviderSpec, endpoint_url
from ..stops import openai_stop
from ..usage import openai_usage
from .base import ProviderError, Reply, body_start, exchange, reply_headers
from .http import HttpProvider

__all__ = ["OpenAIProvider", "endpoint_url"]

_EXPECTED = {"/v1/embeddings": "data", "/v1/responses": "output"}  # a good reply carries it


class OpenAIProvider(HttpProvider):
    """Sends requests straight to an ``httpx.AsyncBaseTransport``; classifies every failure.

    Built by :class:`aiq.providers.http.HttpProvider` (see its docstring for why there is no
    ``httpx.AsyncClient``), with OpenAI's spec unless given another OpenAI-compatible one.
    """

    SPEC: ClassVar[ProviderSpec] = OPENAI

    def url(self, endpoint: str) -> httpx.URL:
        """The full URL of an endpoint such as ``/v1/chat/completions``, parsed once."""
        return self._post(endpoint).url

    async def send(self, endpoint: str, body: bytes) -> Reply:
        """POST one request body; returns the Reply or raises a classified ProviderError."""
        if endpoint == "/v1/messages":
            # An OpenAI-compatible server would answer 404, which reads as a fatal bad URL.
            raise ProviderError(
                "invalid_request",
                "an Anthropic Message Batches line (params, /v1/messages): run it with "
                "--provider anthropic",
            )
        request = self._post(endpoint).request(body)
        resp, content = await exchange(self._transport, request, base=self._base)
        if resp.status_code != 200:
            raise self._error(resp, content)
        return self._reply(endpoint, resp, content)

    def _reply(self, endpoint: str, resp: httpx.Response, content: bytes) -> Reply:
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            data = None
        expected = _EXPECTED.get(endpoint, "choices")
        if not isinstance(data, dict) or expected not in data:
            raise ProviderError(
                "bad_response",
                f"HTTP 200 without a well-formed reply (no {expected!r}): "
                f"{body_start(content, self._secret, 200)!r}",
                status_code=200,
                retryable=True,
            )
        request_id, limits = reply_headers(resp.headers, self._spec.request_id_header)
        usage = openai_usage(data.get("usage"))
        stop = openai_stop(endpoint, data)
        reply = Reply.of(content, request_id or data.get("id"), usage, limits, stop)
        if isinstance(tier := data.get("service_tier"), str):
            reply.tier = tier
        return reply
