"""OpenAI-compatible APIs: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses."""

from __future__ import annotations

from typing import ClassVar

import httpx
import orjson

from ..ratelimit_headers import RateLimitInfo
from ..registry import OPENAI, ProviderSpec, endpoint_url
from ..stops import openai_stop
from ..usage import openai_usage
from .base import ProviderError, Reply, body_start, exchange, reply_headers
from .http import HttpProvider

__all__ = ["OpenAIProvider", "endpoint_url"]

_EXPECTED = {"/v1/embeddings": "data", "/v1/responses": "output"}  # a good reply carries it


# The endpoints that take a ``service_tier`` (OpenAI's flex tier: chat and responses only).
_TIERED = frozenset({"/v1/chat/completions", "/v1/responses"})


def with_tier(body: bytes, tier: str) -> bytes:
    """``body`` asking for ``tier``, unless it names a tier of its own (the line's wins). The
    stored request stays as the line gave it: the tier is how this run sends, not the request,
    so its dedup key and a later run at another tier are unchanged."""
    obj = orjson.loads(body)
    if not isinstance(obj, dict) or "service_tier" in obj:
        return body
    obj["service_tier"] = tier
    return orjson.dumps(obj)


class OpenAIProvider(HttpProvider):
    """Sends requests straight to an ``httpx.AsyncBaseTransport``; classifies every failure.

    Built by :class:`aiq.providers.http.HttpProvider` (see its docstring for why there is no
    ``httpx.AsyncClient``), with OpenAI's spec unless given another OpenAI-compatible one.
    """

    SPEC: ClassVar[ProviderSpec] = OPENAI

    def url(self, endpoint: str) -> httpx.URL:
        """The full URL of an endpoint such as ``/v1/chat/completions``, parsed once."""
        return self._post(endpoint).url

    # The service tier asked of every request whose body names none (``--via flex``).
    service_tier: str | None = None

    async def send(self, endpoint: str, body: bytes) -> Reply:
        """POST one request body; returns the Reply or raises a classified ProviderError."""
        if endpoint == "/v1/messages":
            # An OpenAI-compatible server would answer 404, which reads as a fatal bad URL.
            raise ProviderError(
                "invalid_request",
                "an Anthropic Message Batches line (params, /v1/messages): run it with "
                "--provider anthropic",
            )
        if self.service_tier is not None and endpoint in _TIERED:
            body = with_tier(body, self.service_tier)
        request = self._post(endpoint).request(body)
        resp, content = await exchange(self._transport, request, base=self._base)
        if resp.status_code != 200:
            raise self._error(resp, content)
        return self._reply(endpoint, resp, content)

    def answer(
        self, endpoint: str, status_code: int, content: bytes, request_id: str | None = None
    ) -> Reply:
        """A reply that came some other way (a batch output line: its status, body and
        request id), read exactly as :meth:`send` reads one: the Reply, or the classified
        ProviderError of a failure, by the same table."""
        if status_code != 200:
            headers = {self._spec.request_id_header.decode(): request_id} if request_id else None
            raise self._error(httpx.Response(status_code, headers=headers), content)
        # No httpx.Response for a 200: building one cost half of ingesting a batch's line.
        return self._read(endpoint, content, request_id, None)

    def _reply(self, endpoint: str, resp: httpx.Response, content: bytes) -> Reply:
        request_id, limits = reply_headers(resp.headers, self._spec.request_id_header)
        return self._read(endpoint, content, request_id, limits)

    def _read(
        self, endpoint: str, content: bytes, request_id: str | None, limits: RateLimitInfo | None
    ) -> Reply:
        """A 200 reply's Reply, or a bad_response ProviderError if it is not one."""
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
        usage = openai_usage(data.get("usage"))
        stop = openai_stop(endpoint, data)
        reply = Reply.of(content, request_id or data.get("id"), usage, limits, stop)
        if isinstance(tier := data.get("service_tier"), str):
            reply.tier = tier
        return reply
