"""The provider registry: every spec resolves to a config and a provider, its rules hold, and
a provider aiq does not know is refused with the choices named."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import get_args

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq.config import Config
from aiq.contract import PROVIDER_NAMES, ProviderName
from aiq.errors import UsageError
from aiq.providers.anthropic import AnthropicProvider
from aiq.providers.base import ProviderError
from aiq.providers.factory import CLASSES, make_provider
from aiq.providers.openai import OpenAIProvider
from aiq.providers.simulated import SimulatedTransport
from aiq.registry import ANTHROPIC, OPENAI, SIMULATED, SPECS, ProviderSpec, spec_for
from aiq.transport import AiohttpTransport

KEY = "sk-registry-0123456789"
ALL = sorted(SPECS)


def test_the_registry_names_every_provider_of_the_contract() -> None:
    assert tuple(SPECS) == PROVIDER_NAMES == get_args(ProviderName)
    assert all(SPECS[name].name == name for name in SPECS)
    assert set(CLASSES) >= {spec.api for spec in SPECS.values()}  # a class for every API


@pytest.mark.parametrize("name", ALL)
def test_every_spec_resolves_to_its_own_defaults(name: str) -> None:
    spec = SPECS[name]
    resolved = Config.resolve(env={}, flags={"provider": name})
    built = Config(provider=spec.name)  # in code, naming only the provider
    for config in (resolved, built):
        assert config.spec is spec
        assert config.base_url == spec.base_url
        assert config.api_key_env == spec.key_env
    assert resolved.model == spec.default_model
    assert resolved.target.provider == name


@pytest.mark.parametrize("name", ALL)
def test_every_spec_makes_a_provider(name: str) -> None:
    spec = SPECS[name]
    config = Config.resolve(env={spec.key_env: KEY}, flags={"provider": name})

    async def make() -> None:
        provider, transport = make_provider(config, pool_size=4)
        try:
            assert type(provider) is CLASSES[spec.api]
            assert isinstance(transport, SimulatedTransport if spec.offline else AiohttpTransport)
        finally:
            await transport.aclose()

    asyncio.run(make())


def test_an_unknown_provider_is_refused_with_the_choices() -> None:
    with pytest.raises(UsageError, match=r"provider 'gemini' is unknown; use openai \| anthropic"):
        spec_for("gemini")
    with pytest.raises(UsageError, match=r"^--provider: 'gemini' is unknown; use openai \| anth"):
        Config.resolve(env={}, flags={"provider": "gemini"})
    with pytest.raises(UsageError, match=r"provider: 'gemini' is unknown; use .*simulated"):
        Config(provider="gemini")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "base_url", "needs"),
    [
        (OPENAI, "https://api.openai.com/v1", True),
        (OPENAI, "https://api.openai.com/v1/", True),
        (OPENAI, "http://127.0.0.1:8000/v1", False),  # vLLM, a gateway: may take none
        (ANTHROPIC, "https://api.anthropic.com", True),
        (ANTHROPIC, "https://api.anthropic.com/", True),
        (ANTHROPIC, "http://127.0.0.1:8000", False),
        (SIMULATED, SIMULATED.base_url, False),
    ],
)
def test_a_key_is_needed_at_the_official_url_only(
    spec: ProviderSpec, base_url: str, needs: bool
) -> None:
    assert spec.needs_key(base_url) is needs
    config = Config(provider=spec.name, base_url=base_url, api_key=None)

    async def make() -> None:
        _, transport = make_provider(config, pool_size=1)
        await transport.aclose()

    if needs:
        with pytest.raises(UsageError, match=f"^no API key: set {spec.key_env} "):
            asyncio.run(make())
    else:
        asyncio.run(make())


@given(st.sampled_from(ALL), st.text(max_size=40))
def test_a_key_is_never_needed_away_from_the_official_url(name: str, base_url: str) -> None:
    spec = SPECS[name]
    if spec.needs_key(base_url):
        assert spec.official(base_url) and spec.key_needed and not spec.offline


@pytest.mark.parametrize(
    ("spec", "base_url", "url", "headers"),
    [
        (OPENAI, "https://api.openai.com/v1", "https://api.openai.com/v1/models",
         {"x-team": "a", "authorization": f"Bearer {KEY}"}),
        (OPENAI, "http://h:8000", "http://h:8000/v1/models",
         {"x-team": "a", "authorization": f"Bearer {KEY}"}),
        (ANTHROPIC, "https://api.anthropic.com/v1/", "https://api.anthropic.com/v1/models?limit=1000",
         {"x-team": "a", "anthropic-version": "2023-06-01", "x-api-key": KEY}),
    ],
)  # fmt: skip
def test_the_model_list_is_asked_for_where_a_run_sends(
    spec: ProviderSpec, base_url: str, url: str, headers: dict[str, str]
) -> None:
    got_url, got = spec.models_request(base_url, KEY, {"x-team": "a"})
    assert (got_url, list(got.items())) == (url, list(headers.items()))


class Recorder:
    def __init__(self, reply: httpx.Response) -> None:
        self.reply = reply
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.reply


@pytest.mark.parametrize(
    ("cls", "base_url", "endpoint", "url", "names"),
    [
        (OpenAIProvider, "http://h/v1/", "/v1/chat/completions", "http://h/v1/chat/completions",
         ["host", "accept-encoding", "content-type", "x-team", "authorization"]),
        (AnthropicProvider, "http://h/v1", "/v1/chat/completions", "http://h/v1/messages",
         ["host", "accept-encoding", "content-type", "anthropic-version", "x-team", "x-api-key"]),
    ],
)  # fmt: skip
def test_a_provider_sends_its_specs_headers(
    cls: type[OpenAIProvider | AnthropicProvider],
    base_url: str,
    endpoint: str,
    url: str,
    names: list[str],
) -> None:
    recorder = Recorder(httpx.Response(500, json={"error": {"message": "down"}}))
    provider = cls(
        httpx.MockTransport(recorder), base_url=base_url, api_key=KEY, extra_headers={"x-team": "a"}
    )
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(ProviderError, match="HTTP 500: down"):
        asyncio.run(provider.send(endpoint, body))
    (request,) = recorder.requests
    assert str(request.url) == url
    assert [k for k in request.headers if k != "content-length"] == names
    assert request.extensions["timeout"] == {"connect": 10.0, "read": 120.0, "write": 120.0,
                                             "pool": None}  # fmt: skip


def test_a_new_spec_alone_changes_what_goes_on_the_wire() -> None:
    """An OpenAI-compatible provider with its own key header, request-id header and error
    codes, run by the OpenAI class: one spec, no code."""
    spec = dataclasses.replace(
        OPENAI, name="openai", auth_header="api-key", auth_value="{key}",
        request_id_header=b"apim-request-id", code_keys=("type",), key_env="AZURE_KEY",
    )  # fmt: skip
    ok = httpx.Response(200, headers={"apim-request-id": "r-1"}, json={"id": "x", "choices": []})
    recorder = Recorder(ok)
    provider = OpenAIProvider(httpx.MockTransport(recorder), base_url="http://h", api_key=KEY,
                              spec=spec)  # fmt: skip
    reply = asyncio.run(provider.send("/v1/chat/completions", b'{"model": "m"}'))
    assert recorder.requests[0].headers["api-key"] == KEY
    assert "authorization" not in recorder.requests[0].headers
    assert reply.request_id == "r-1"
    refused = {"error": {"message": "no", "type": "auth_failed", "code": "x"}}
    recorder.reply = httpx.Response(401, json=refused)
    with pytest.raises(ProviderError) as info:
        asyncio.run(provider.send("/v1/chat/completions", b'{"model": "m"}'))
    assert info.value.fatal and "AZURE_KEY" in info.value.message  # the spec's key variable


def test_anthropic_temperature_is_held_to_its_specs_most() -> None:
    with pytest.raises(UsageError, match=r"1\.5 is above 1, the most Anthropic takes; use a "):
        Config(provider="anthropic", temperature=1.5)
    assert Config(provider="openai", temperature=1.5).temperature == 1.5
