"""OpenAI-compatible APIs: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from ..stops import openai_stop
from ..usage import openai_usage
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

_EXPECTED = {"/v1/embeddings": "data", "/v1/responses": "output"}  # a good reply carries it


def endpoint_url(base_url: str, endpoint: str) -> str:
    """Where ``endpoint`` (``/v1/chat/completions``, as lines name it) goes at ``base_url``.

    Base URLs conventionally end in ``/v1`` already, and then it is not repeated; any other
    base gets the whole endpoint, ``/v1`` included (``http://host:8000`` sends to
    ``http://host:8000/v1/chat/completions``). ``aiq check`` asks for the model list by this
    rule too, so it probes where a run will send.
    """
    base = base_url.rstrip("/")
    if base.endswith("/v1") and endpoint.startswith("/v1/"):
        endpoint = endpoint[3:]
    return base + endpoint


class OpenAIProvider:
    """Sends requests straight to an ``httpx.AsyncBaseTransport``; classifies every failure.

    The provider builds each ``httpx.Request`` itself and hands it to the transport, without
    an ``httpx.AsyncClient`` in between. The client layer (URL and header merging, cookie
    extraction, auth and redirect machinery) cost more per request than everything else aiq
    does for a job together (bench/README.md, "Pipeline"), and aiq needs none of it: one base
    URL, fixed headers, no cookies, no redirects. Any transport works, so tests pass
    ``httpx.MockTransport(handler)``; the run passes ``aiq.transport.AiohttpTransport``.

    Timeouts travel in ``request.extensions["timeout"]``, as ``httpx.AsyncClient`` sends them.
    The caller owns the transport and closes it.
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        *,
        base_url: str,
        api_key: str | None,
        api_key_env: str = "OPENAI_API_KEY",
        extra_headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
    ) -> None:
        self._transport = transport
        self._base = base_url.rstrip("/")
        self._key_env = api_key_env
        # Only what the request needs: every header costs ~3 µs a request between httpx and
        # aiohttp. Accept-Encoding is named so the server uses no encoding httpx.Response
        # cannot decode; aiohttp adds its own User-Agent and Accept.
        headers = {
            "accept-encoding": "gzip, deflate",
            "content-type": "application/json",
            **(extra_headers or {}),
        }
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._secret = secret_of(api_key)  # cut out of error messages, never out of replies
        # One normalised Headers, copied by each Request: cheaper than a dict re-encoded each time.
        self._headers = httpx.Headers(headers)
        self._extensions: dict[str, Any] = {
            "timeout": {
                "connect": connect_timeout_s,
                "read": read_timeout_s,
                "write": read_timeout_s,
                "pool": None,  # the worker pool bounds waiting already: queueing, not failure
            }
        }
        self._posts: dict[str, Post] = {}

    def url(self, endpoint: str) -> httpx.URL:
        """The full URL of an endpoint such as ``/v1/chat/completions``, parsed once."""
        return self._post(endpoint).url

    def _post(self, endpoint: str) -> Post:
        """How requests to ``endpoint`` are built, made once per endpoint."""
        post = self._posts.get(endpoint)
        if post is None:
            # Parsing a URL costs about as much as building the request; endpoints are few.
            url = httpx.URL(endpoint_url(self._base, endpoint))
            post = self._posts[endpoint] = Post(url, self._headers, self._extensions)
        return post

    async def send(self, endpoint: str, body: bytes) -> Reply:
        """POST one request body; returns the Reply or raises a classified ProviderError."""
        if endpoint == "/v1/messages":
            # An OpenAI-compatible server would answer 404, which reads as a fatal bad URL.
            raise ProviderError(
                "invalid_request",
                "an Anthropic Message Batches line (params, /v1/messages): run it with "
                "--provider anthropic",
            )
        try:
            post = self._post(endpoint)
        except httpx.InvalidURL as exc:
            message = f"invalid URL {endpoint_url(self._base, endpoint)!r}: {exc}"
            raise ProviderError("not_found", message, fatal=True) from None
        request = post.request(body)
        resp, content = await exchange(self._transport, request, base=self._base)
        if resp.status_code != 200:
            raise error_from(resp, content, key_env=self._key_env, secret=self._secret)
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
        request_id, limits = reply_headers(resp.headers, b"x-request-id")
        usage = openai_usage(data.get("usage"))
        stop = openai_stop(endpoint, data)
        return Reply.of(content, request_id or data.get("id"), usage, limits, stop)
