"""OpenAI-compatible APIs: /v1/chat/completions, /v1/completions, /v1/embeddings."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
import orjson

from .base import ProviderError, Reply, classify_status, fatal_hint, retry_after_s

_EXPECTED = {"/v1/embeddings": "data"}  # the key a well-formed reply must carry


class OpenAIProvider:
    """Sends requests over a shared httpx client; classifies every failure."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        base_url: str,
        api_key: str | None,
        api_key_env: str = "OPENAI_API_KEY",
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._base = base_url.rstrip("/")
        # Lines name endpoints as "/v1/…"; base URLs conventionally end in "/v1" already.
        self._strip_v1 = self._base.endswith("/v1")
        self._key_env = api_key_env
        self._headers = {"content-type": "application/json", **(extra_headers or {})}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"

    def url(self, endpoint: str) -> str:
        """The full URL of an endpoint such as ``/v1/chat/completions``."""
        if self._strip_v1 and endpoint.startswith("/v1/"):
            endpoint = endpoint[3:]
        return self._base + endpoint

    async def send(self, endpoint: str, body: bytes) -> Reply:
        """POST one request body; returns the Reply or raises a classified ProviderError."""
        try:
            resp = await self._client.post(self.url(endpoint), content=body, headers=self._headers)
        except httpx.TimeoutException as exc:
            raise ProviderError("timeout", _describe(exc), retryable=True) from None
        except httpx.TransportError as exc:
            raise ProviderError("connection", _describe(exc), retryable=True) from None
        if resp.status_code != 200:
            raise self._error(resp)
        return self._reply(endpoint, resp)

    def _reply(self, endpoint: str, resp: httpx.Response) -> Reply:
        try:
            data = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            data = None
        expected = _EXPECTED.get(endpoint, "choices")
        if not isinstance(data, dict) or expected not in data:
            raise ProviderError(
                "bad_response",
                f"HTTP 200 without a well-formed reply (no {expected!r}): {resp.content[:200]!r}",
                status_code=200,
                retryable=True,
            )
        usage = data.get("usage") or {}
        return Reply(
            status_code=200,
            body=resp.content,
            request_id=resp.headers.get("x-request-id") or data.get("id"),
            tokens_in=int(usage.get("prompt_tokens") or 0),
            tokens_out=int(usage.get("completion_tokens") or 0),
        )

    def _error(self, resp: httpx.Response) -> ProviderError:
        message, code = _error_message(resp)
        error_type, retryable, fatal = classify_status(resp.status_code, message, code)
        if fatal:
            message = f"{message} ({fatal_hint(error_type, self._key_env)})"
        return ProviderError(
            error_type,
            message,
            status_code=resp.status_code,
            retryable=retryable,
            fatal=fatal,
            retry_after_s=retry_after_s(resp.headers, message),
        )


def _error_message(resp: httpx.Response) -> tuple[str, str | None]:
    """The provider's own message and code from an OpenAI-shaped error body, if any."""
    try:
        err = orjson.loads(resp.content).get("error")
        if isinstance(err, dict):
            code = err.get("code") or err.get("type")
            return f"HTTP {resp.status_code}: {err.get('message') or err}", code
    except (orjson.JSONDecodeError, AttributeError):
        pass
    text = resp.content[:300].decode("utf-8", "replace").strip()
    return f"HTTP {resp.status_code}: {text or resp.reason_phrase}", None


def _describe(exc: Exception) -> str:
    # httpx messages never include headers, so the API key cannot leak through them.
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
