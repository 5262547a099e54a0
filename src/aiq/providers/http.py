"""What every HTTP provider is built from: its spec's headers, the timeouts, the key as aiq
cuts it out of messages, and the spec's error table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from ..registry import ProviderSpec, endpoint_url
from .base import Post, ProviderError, Reply, error_from, secret_of


class HttpProvider:
    """The constructor both HTTP providers share; subclasses build and read the requests.

    A provider builds each ``httpx.Request`` itself and hands it to the transport, without an
    ``httpx.AsyncClient`` in between. The client layer (URL and header merging, cookie
    extraction, auth and redirect machinery) cost more per request than everything else aiq
    does for a job together (bench/README.md, "Pipeline"), and aiq needs none of it: one base
    URL, fixed headers, no cookies, no redirects. Any transport works, so tests pass
    ``httpx.MockTransport(handler)``; the run passes ``aiq.transport.AiohttpTransport``.

    Timeouts travel in ``request.extensions["timeout"]``, as ``httpx.AsyncClient`` sends them.
    The caller owns the transport and closes it. ``spec`` defaults to the class's own
    (:attr:`SPEC`); a provider speaking the same API passes its own.
    """

    SPEC: ClassVar[ProviderSpec]

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        *,
        base_url: str,
        api_key: str | None,
        api_key_env: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
        default_max_tokens: int | None = None,
        spec: ProviderSpec | None = None,
    ) -> None:
        self._transport = transport
        self._spec = spec = spec or self.SPEC
        self._base = spec.root(base_url)
        # For an API that requires max_tokens: what a request naming none is sent with.
        self._default_max_tokens = default_max_tokens or spec.default_max_tokens
        self._key_env = api_key_env or spec.key_env  # named in the hint of a refused key
        self._secret = secret_of(api_key)  # cut out of error messages, never out of replies
        # One normalised Headers, copied by each Request: cheaper than a dict re-encoded each time.
        self._headers = httpx.Headers(spec.headers(api_key, extra_headers))
        self._extensions: dict[str, Any] = {
            "timeout": {
                "connect": connect_timeout_s,
                "read": read_timeout_s,
                "write": read_timeout_s,
                "pool": None,  # the worker pool bounds waiting already: queueing, not failure
            }
        }
        self._posts: dict[str, Post] = {}

    async def send(self, endpoint: str, body: bytes) -> Reply:
        """POST one request body; returns the Reply or raises a classified ProviderError."""
        raise NotImplementedError

    def _post(self, endpoint: str) -> Post:
        """How requests to ``endpoint`` are built, made once per endpoint: parsing a URL costs
        about as much as building the request, and endpoints are few."""
        post = self._posts.get(endpoint)
        if post is None:
            url = endpoint_url(self._base, endpoint)
            try:
                parsed = httpx.URL(url)
            except httpx.InvalidURL as exc:
                raise ProviderError(
                    "not_found", f"invalid URL {url!r}: {exc}", fatal=True
                ) from None
            post = self._posts[endpoint] = Post(parsed, self._headers, self._extensions)
        return post

    def _error(self, resp: httpx.Response, content: bytes) -> ProviderError:
        """The classified error of a non-200 reply, read by the spec's error table."""
        return error_from(
            resp,
            content,
            key_env=self._key_env,
            secret=self._secret,
            code_keys=self._spec.code_keys,
            request_id_header=self._spec.request_id_header.decode("latin-1"),
        )
