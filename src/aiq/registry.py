"""The provider registry: everything aiq knows about each provider, one spec apiece.

Config takes its defaults from a spec (base URL, key variable, the variable its SDK reads a
base URL from, the highest temperature), ``aiq check`` its model list and key rule, and
:func:`aiq.providers.factory.make_provider` the class, transport and headers of a run. No
other module tests a provider's name.

Adding a provider is adding one :class:`ProviderSpec` to :data:`SPECS` (and its name to
``contract.ProviderName``, so mypy knows it). One that speaks OpenAI's or Anthropic's API
needs nothing else; a new wire format needs its provider class too, named in
``providers/factory.py``.

Pure data and string rules: no HTTP here, so config.py can read it without loading httpx.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .contract import Api, ProviderName
from .errors import UsageError

ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_MAX_TOKENS = 1024
"""``max_tokens`` for an Anthropic request naming none, when the config sets none either."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProviderSpec:
    """One provider: where it is, how a request authenticates, what its errors look like.

    The defaults are OpenAI's conventions, which most servers (vLLM, gateways) follow.
    """

    name: ProviderName
    title: str  # as messages name it: "Anthropic"
    api: Api = "openai"  # the wire format: which provider class sends its requests
    base_url: str  # its official base URL, the default
    key_env: str  # the variable holding its key, by default
    base_url_env: str | None = None  # the variable its own SDK reads a base URL from
    # Whether a key is needed at ``base_url`` (the real service); any other server (vLLM, a
    # gateway) may take none, so a missing key is only refused here.
    key_needed: bool = True
    # Answered in-process, with no network and no key (the simulated provider): its base URL
    # is fixed, and its store is never shared with a real provider's (routing.py).
    offline: bool = False
    default_model: str | None = None  # the model of a config naming none
    # Sent as ``max_tokens`` by a request naming none: the API requires one. None: none sent.
    default_max_tokens: int | None = None
    max_temperature: float = 2.0
    # How a request authenticates: header name and value ("{key}" replaced by the key).
    auth_header: str = "authorization"
    auth_value: str = "Bearer {key}"
    fixed_headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The base URL is the host, as its SDK takes it: a trailing /v1 is cut (every endpoint
    # names its own). Otherwise /v1 is kept and not repeated (:func:`endpoint_url`).
    host_base: bool = False
    models_path: str = "/v1/models"  # the model list aiq check reads, as endpoint_url joins it
    models_query: str = ""  # and its query string
    # The error table: which of ``error``'s keys names the code (the first that is text), and
    # the reply header holding the request id (lower case).
    code_keys: tuple[str, ...] = ("code", "type")
    request_id_header: bytes = b"x-request-id"

    def root(self, base_url: str) -> str:
        """``base_url`` as requests are built on it: no trailing slash, nor /v1 for a host."""
        base = base_url.rstrip("/")
        return base.removesuffix("/v1") if self.host_base else base

    def official(self, base_url: str) -> bool:
        """Whether ``base_url`` is the provider's own service."""
        return base_url.rstrip("/") == self.base_url

    def needs_key(self, base_url: str) -> bool:
        """Whether a run to ``base_url`` is refused without a key: at the official URL only."""
        return self.key_needed and not self.offline and self.official(base_url)

    def headers(
        self, api_key: str | None, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Every header a request carries: only what it needs (each costs ~3 µs a request
        between httpx and aiohttp). Accept-Encoding is named so the server uses no encoding
        httpx.Response cannot decode; aiohttp adds its own User-Agent and Accept."""
        headers = {
            "accept-encoding": "gzip, deflate",
            "content-type": "application/json",
            **self.fixed_headers,
            **(extra or {}),
        }
        if api_key:
            headers[self.auth_header] = self.auth_value.format(key=api_key)
        return headers

    def models_request(
        self, base_url: str, api_key: str | None, extra: Mapping[str, str] | None = None
    ) -> tuple[str, dict[str, str]]:
        """The URL and headers that list the provider's models, as its SDK would ask: where
        a run sends, /v1 and all."""
        headers = {**(extra or {}), **self.fixed_headers}
        if api_key:
            headers[self.auth_header] = self.auth_value.format(key=api_key)
        return endpoint_url(self.root(base_url), self.models_path) + self.models_query, headers


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


OPENAI = ProviderSpec(
    name="openai",
    title="OpenAI",
    base_url="https://api.openai.com/v1",
    key_env="OPENAI_API_KEY",
    base_url_env="OPENAI_BASE_URL",
)
ANTHROPIC = ProviderSpec(
    name="anthropic",
    title="Anthropic",
    api="anthropic",
    base_url="https://api.anthropic.com",
    key_env="ANTHROPIC_API_KEY",
    # OPENAI_BASE_URL is not for Anthropic; its SDK reads ANTHROPIC_BASE_URL.
    base_url_env="ANTHROPIC_BASE_URL",
    default_max_tokens=ANTHROPIC_MAX_TOKENS,
    max_temperature=1.0,
    auth_header="x-api-key",
    auth_value="{key}",
    fixed_headers=MappingProxyType({"anthropic-version": ANTHROPIC_VERSION}),
    host_base=True,
    models_query="?limit=1000",  # the list is paged, 20 a page unless asked; 1000 is its most
    code_keys=("type",),
    request_id_header=b"request-id",
)
SIMULATED = ProviderSpec(
    name="simulated",
    title="the simulated provider",
    base_url="http://simulated.invalid/v1",
    key_env=OPENAI.key_env,  # none is read; the default variable's name keeps targets stable
    key_needed=False,
    offline=True,
    default_model="aiq-simulated",
)

SPECS: Mapping[str, ProviderSpec] = MappingProxyType(
    {spec.name: spec for spec in (OPENAI, ANTHROPIC, SIMULATED)}
)
DEFAULT = OPENAI  # the provider of a config naming none


def spec_for(name: str) -> ProviderSpec:
    """The spec of provider ``name``; UsageError naming the choices for one aiq does not know."""
    try:
        return SPECS[name]
    except KeyError:
        raise UsageError(f"provider {name!r} is unknown; use {' | '.join(SPECS)}") from None
