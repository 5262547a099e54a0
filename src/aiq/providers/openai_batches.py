"""OpenAI's Files and Batches API over HTTP: upload, create, get, list, download, cancel.

As the API reference describes them (platform.openai.com/docs/api-reference/batch and
/files; the shapes are those of openai-python's ``openai.types.Batch`` and ``FileObject``).
Every failure is a classified ProviderError by the same table as an online call. Bodies
stream both ways: an input file is read from disk in chunks as it is sent, and an output
file is read a line at a time, so 200 MB never sit in memory.

The transport is httpx's own (``httpx.AsyncHTTPTransport``), not aiq's aiohttp one: these
are a few calls per batch, and only httpx's streams request and response bodies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson

from ..registry import OPENAI, ProviderSpec, endpoint_url
from .base import ProviderError
from .failures import error_from, secret_of

# How far back a lost upload or creation is looked for, before the batch was planned: the
# provider's clock and ours may differ, and a list is newest first.
_LOOK_BACK_S = 3600.0


class BatchApi:
    """One account's Files and Batches endpoints at ``base_url``; close with :meth:`aclose`."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        *,
        base_url: str,
        api_key: str | None,
        api_key_env: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        spec: ProviderSpec = OPENAI,
    ) -> None:
        self._spec = spec
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
        try:
            data = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
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

    # -- files ------------------------------------------------------------------------------

    async def upload(self, path: Path, filename: str) -> dict[str, Any]:
        """``POST /v1/files`` (purpose batch) of the file at ``path``, read in chunks as sent;
        the FileObject."""
        with path.open("rb") as f:
            return await self._call(
                "POST", "/v1/files",
                data={"purpose": "batch"}, files={"file": (filename, f, "application/jsonl")},
            )  # fmt: skip

    async def find_file(self, filename: str, *, since: float) -> dict[str, Any] | None:
        """The newest batch file named ``filename`` uploaded after ``since`` (less a margin),
        from ``GET /v1/files``: how an upload whose answer was lost is found again."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"purpose": "batch", "limit": 100, "order": "desc"}
            if after:
                params["after"] = after
            page = await self._call("GET", "/v1/files", params=params)
            data = page.get("data") or []
            for f in data:
                if f.get("filename") == filename and f.get("status") != "error":
                    return f
            older = any((f.get("created_at") or 0) < since - _LOOK_BACK_S for f in data)
            if not data or older or not page.get("has_more"):
                return None
            after = data[-1].get("id")

    async def lines(self, file_id: str) -> AsyncIterator[bytes]:
        """A file's content (``GET /v1/files/{id}/content``), one line at a time."""
        path = f"/v1/files/{file_id}/content"
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

    # -- batches ------------------------------------------------------------------------

    async def create(
        self, input_file_id: str, endpoint: str, metadata: Mapping[str, str]
    ) -> dict[str, Any]:
        """``POST /v1/batches`` with a 24 h window; the Batch."""
        body = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": "24h",
            "metadata": dict(metadata),
        }
        return await self._call(
            "POST", "/v1/batches", content=orjson.dumps(body),
            headers={"content-type": "application/json"},
        )  # fmt: skip

    async def get(self, batch_id: str) -> dict[str, Any]:
        """``GET /v1/batches/{id}``."""
        return await self._call("GET", f"/v1/batches/{batch_id}")

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/batches/{id}/cancel``: ``cancelling``, then ``cancelled``."""
        return await self._call("POST", f"/v1/batches/{batch_id}/cancel")

    async def find_batch(
        self, metadata: Mapping[str, str], *, since: float
    ) -> dict[str, Any] | None:
        """The batch whose metadata holds every pair of ``metadata``, created after ``since``
        (less a margin), from ``GET /v1/batches`` (newest first): how a creation whose answer
        was lost is found again."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 100}
            if after:
                params["after"] = after
            page = await self._call("GET", "/v1/batches", params=params)
            data = page.get("data") or []
            for b in data:
                meta = b.get("metadata") or {}
                if all(meta.get(k) == v for k, v in metadata.items()):
                    return b
            older = any((b.get("created_at") or 0) < since - _LOOK_BACK_S for b in data)
            if not data or older or not page.get("has_more"):
                return None
            after = data[-1].get("id")
