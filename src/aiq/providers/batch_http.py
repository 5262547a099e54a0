"""What every provider's batch API client shares: one httpx client, JSON calls whose
failures are classified by the online error table, and a result file streamed a line at a
time (so a 200 MB file never sits in memory).

The transport is httpx's own (``httpx.AsyncHTTPTransport``), not aiq's aiohttp one: these
are a few calls per batch, and only httpx's streams request and response bodies. Each
provider's client (``openai_batches``, ``anthropic_batches``) implements
:class:`aiq.providers.batches.BatchService` on top of this.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import orjson

from ..registry import ProviderSpec, endpoint_url
from .base import ProviderError
from .failures import error_from, secret_of


def json_object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` as the JSON object it should be (an answer, a result file's line); None when
    it is not one, for the caller to say what that means."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


class BatchHttp:
    """One account's batch endpoints at ``base_url``; close with :meth:`aclose`."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        *,
        base_url: str,
        api_key: str | None,
        spec: ProviderSpec,
        api_key_env: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        default_max_tokens: int | None = None,
    ) -> None:
        self._spec = spec
        # A request naming no max_tokens gets this where the API requires one (Anthropic).
        self._max_tokens = default_max_tokens or spec.default_max_tokens
        self._base = spec.root(base_url)
        self._key_env = api_key_env or spec.key_env
        self._secret = secret_of(api_key)
        headers = spec.headers(api_key, extra_headers)
        headers.pop("content-type", None)  # each request says its own (JSON or multipart)
        self._client = httpx.AsyncClient(
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _url(self, path: str) -> str:
        return endpoint_url(self._base, path)

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One call's JSON answer, or its classified ProviderError."""
        try:
            resp = await self._client.request(method, self._url(path), **kwargs)
        except httpx.TimeoutException as exc:
            raise ProviderError("timeout", f"{method} {path}: no answer ({exc!r})") from None
        except httpx.TransportError as exc:
            raise ProviderError("connection", f"{method} {path}: {exc!r}", retryable=True) from None
        if resp.status_code != 200:
            raise self._error(resp, resp.content)
        if (data := json_object(resp.content)) is None:
            raise ProviderError(
                "bad_response", f"{method} {path}: HTTP 200 without a JSON object",
                status_code=200, retryable=True,
            )  # fmt: skip
        return data

    def _error(self, resp: httpx.Response, content: bytes) -> ProviderError:
        return error_from(
            resp, content, key_env=self._key_env, secret=self._secret,
            code_keys=self._spec.code_keys,
        )  # fmt: skip

    async def _stream_lines(self, path: str) -> AsyncIterator[bytes]:
        """``GET path``'s body, one non-empty line at a time."""
        try:
            async with self._client.stream("GET", self._url(path)) as resp:
                if resp.status_code != 200:
                    raise self._error(resp, await resp.aread())
                pending = b""
                async for chunk in resp.aiter_bytes():
                    pending += chunk
                    *whole, pending = pending.split(b"\n")
                    for line in whole:
                        if line.strip():
                            yield line
                if pending.strip():
                    yield pending
        except httpx.TimeoutException as exc:
            raise ProviderError("timeout", f"GET {path}: no answer ({exc!r})") from None
        except httpx.TransportError as exc:
            raise ProviderError("connection", f"GET {path}: {exc!r}", retryable=True) from None
