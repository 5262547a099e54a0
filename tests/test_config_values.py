"""Every config value is checked, wherever it came from (the YAML file, the environment, a flag,
code), and a bad one is reported with where it came from, the value and what to write."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from conftest import run_aiq, write_prompts

from aiq.config import _ALIASES, _FILE_KEYS, Config
from aiq.errors import UsageError
from aiq.settings import SETTINGS

# (key as the file spells it, the YAML value, what the message says about it). Every file key
# has a row: test_every_setting_has_bad_values_here holds the table to that.
BAD = [
    ("db", "[a]", "a list is not a path"),
    ("db", "''", "'' is not a path"),
    ("provider", "openia", "'openia' is unknown; use openai | anthropic | simulated"),
    ("base_url", "api.openai.com/v1", "'api.openai.com/v1' is not an http:// or https:// URL"),
    ("base_url", "8080", "8080 is not text"),
    ("api_key_env", "[OPENAI_API_KEY]", "a list is not text"),
    ("extra_headers", "[a, b]", "a list is not a mapping of header names"),
    ("extra_headers", "{X-Team: 5}", "a mapping is not a mapping of header names"),
    ("model", "4", "4 is not text (quote it in YAML)"),
    ("model", "''", "it is empty; use a model name"),
    ("max_tokens", "-5", "-5 is not positive; use a positive whole number of tokens"),
    ("max_tokens", "0", "0 is not positive"),
    ("max_tokens", "ten", "'ten' is not a whole number"),
    ("max_tokens", "1.5", "1.5 is not a whole number"),
    ("max_tokens", "yes", "true (a yes/no value) is not a whole number"),
    ("temperature", "hot", "'hot' is not a number; use a number from 0 to 2"),
    ("temperature", "2.5", "2.5 is above 2"),
    ("temperature", "-0.1", "-0.1 is below 0"),
    ("temperature", "yes", "true (a yes/no value) is not a number"),
    ("temperature", ".nan", "nan is not a number"),
    ("temperature", ".inf", "inf is not a number"),
    ("system", "{a: b}", "a mapping is not text"),
    ("system", "' '", "it is empty"),
    ("concurrency", "0", "0 is not positive; use auto or a positive whole number"),
    ("concurrency", "lots", "'lots' is not a whole number"),
    ("concurrency", "on", "true (a yes/no value) is not a whole number"),
    ("max_concurrency", "0", "0 is not positive"),
    (
        "rpm",
        "fast",
        "'fast' is not a whole number; use a positive whole number of requests per minute",
    ),
    ("rpm", "yes", "true (a yes/no value) is not a whole number"),
    ("rpm", "-1", "-1 is not positive"),
    ("rpm", "500.5", "500.5 is not a whole number"),
    (
        "tpm",
        "'200k'",
        "'200k' is not a whole number; use a positive whole number of tokens per minute",
    ),
    ("max_attempts", "0", "0 is not positive; use a positive whole number of attempts"),
    ("timeout", "0", "0 is not positive; use a number of seconds above 0"),
    ("timeout", "soon", "'soon' is not a number"),
    ("connect_timeout", "-1", "-1 is not positive"),
    ("backoff_base_s", "0", "0 is not positive"),
    ("backoff_cap_s", "no", "false (a yes/no value) is not a number"),
    ("grace", "-1", "-1 is below 0; use a number of seconds, 0 or more"),
    ("max_outage", "0", "0 is not positive"),
    ("max_runtime", "0", "0 is not positive"),
    ("max_cost", "free", "'free' is not a number; use a number of US dollars above 0"),
    ("model_limits", "5", "5 is not a mapping of models; use {model: {rpm: N, tpm: N}, ...}"),
    ("model_limits", "{gpt-4o: 5}", "gpt-4o: 5 is not {rpm: N, tpm: N}"),
    ("model_limits", "{gpt-4o: {rps: 1}}", "gpt-4o: a mapping is not {rpm: N, tpm: N}"),
    ("model_limits", "{gpt-4o: {rpm: 0}}", "gpt-4o: rpm: 0 is not positive"),
    ("model_limits", "{gpt-4o: {tpm: yes}}", "gpt-4o: tpm: true (a yes/no value)"),
    ("prices", "[1, 2]", "it is not a mapping of models; use {model: {input: USD per 1M"),
    ("prices", "{m: {input: 1}}", "m: {'input': 1} is not {input: USD, output: USD}"),
    ("prices", "{m: {input: -1, output: 1}}", "m: input must be a number, 0 or more (not -1)"),
    ("prices", "{m: {input: 1, output: 1, cache_read: x}}", "m: cache_read must be a number"),
    ("prices", "{m: {input: 1, output: 1, cached: 1}}", "(and optionally cached_input, cache_"),
    ("metrics_file", "5", "5 is not text"),
    ("order", "random", "'random' is unknown; use done | input"),
    ("on_truncated", "drop", "'drop' is unknown; use keep | dead"),
    ("via", "later", "'later' is unknown; use online | flex | batch | auto"),
    ("deadline", "soon", "'soon' is not a time or a duration; use a time (2026-12-02T06:00"),
    ("deadline", "6:30", "390 is not a time or a duration (quote it in YAML)"),
    ("strict", "1", "1 is not true or false"),
    ("strict", "maybe", "'maybe' is not true or false"),
    ("simulated_latency_s", "-1", "-1 is below 0"),
    ("simulated_error_rate", "1.5", "1.5 is above 1; use a number from 0 to 1"),
]


def _resolve(tmp_path: Path, text: str, **kwargs: object) -> Config:
    path = tmp_path / "aiq.yaml"
    path.write_text(text)
    return Config.resolve(config_path=path, env=kwargs.pop("env", {}), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "value", "says"), BAD)
def test_a_bad_value_names_file_key_value_and_what_to_write(
    tmp_path: Path, key: str, value: str, says: str
) -> None:
    with pytest.raises(UsageError) as caught:
        _resolve(tmp_path, f"{key}: {value}\n")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'aiq.yaml'}: {key}: ")
    assert says in message
    assert "; use " in message  # what to write instead
    assert "\n" not in message


def test_every_setting_has_bad_values_here() -> None:
    tested = {_ALIASES.get(key, key) for key, _, _ in BAD}
    assert tested == _FILE_KEYS
    fields = {f.name for f in dataclasses.fields(Config)}
    # api_key and reroute too: checked, never from a file; origin is how it was resolved
    assert set(SETTINGS) == fields - {"config_path", "origin"}


def test_a_key_pasted_as_api_key_env_is_not_repeated(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        _resolve(tmp_path, "api_key_env: sk-proj-Abc123secret\n")
    assert "not the name of an environment variable" in str(caught.value)
    assert "Abc123secret" not in str(caught.value)


def test_every_bad_value_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        _resolve(tmp_path, "rpm: fast\nmax_tokens: -5\ntemperature: hot\n")
    assert [line.split(": ")[1] for line in str(caught.value).splitlines()] == [
        "rpm",
        "max_tokens",
        "temperature",
    ]


def test_values_from_flags_and_environment_name_the_flag_or_variable(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--timeout: -1 is not positive; use a number"):
        Config.resolve(env={}, flags={"timeout_s": -1})
    with pytest.raises(UsageError, match=r"^--max-cost: 0 is not positive"):
        Config.resolve(env={}, flags={"max_cost_usd": 0})
    with pytest.raises(UsageError, match=r"^--concurrency: 'many' is not a whole number"):
        Config.resolve(env={}, flags={"concurrency": "many"})
    with pytest.raises(UsageError, match=r"^\$OPENAI_BASE_URL: 'localhost:8000' is not an http"):
        Config.resolve(env={"OPENAI_BASE_URL": "localhost:8000"})
    with pytest.raises(UsageError, match=r"^\$ANTHROPIC_BASE_URL: 'x' is not an http"):
        Config.resolve(env={"ANTHROPIC_BASE_URL": "x"}, flags={"provider": "anthropic"})


def test_a_bad_value_is_an_error_even_where_a_flag_overrides_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="rpm: 'fast'"):
        _resolve(tmp_path, "rpm: fast\n", flags={"rpm": 100})


def test_config_built_in_code_is_checked_as_well() -> None:
    with pytest.raises(UsageError, match=r"^rpm: 'fast' is not a whole number; use a positive"):
        Config(rpm="fast")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"^api_key: 5 is not text"):
        Config(api_key=5)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"temperature: 1\.5 is above 1, the most Anthropic takes"):
        Config(provider="anthropic", temperature=1.5)
    with pytest.raises(UsageError, match="backoff_base_s: 9 is above backoff_cap_s"):
        Config(backoff_base_s=9, backoff_cap_s=2)


def test_good_values_come_out_as_config_holds_them(tmp_path: Path) -> None:
    cfg = _resolve(
        tmp_path,
        "timeout: 30\nconcurrency: '8'\ndb: x/aiq.db\nmodel_limits: {m: {rpm: 5}}\n"
        "temperature: 0\nprices: {m: {input: 1, output: 2}}\nstrict: yes\n",
    )
    assert cfg.timeout_s == 30.0 and isinstance(cfg.timeout_s, float)
    assert cfg.concurrency == 8
    assert cfg.db == Path("x/aiq.db")
    assert cfg.model_limits == {"m": (5, None)}
    assert cfg.temperature == 0.0 and cfg.strict is True
    assert cfg.with_(rpm=10).model_limits == {"m": (5, None)}  # a copy passes its own checks


def test_the_example_config_is_valid() -> None:
    example = Path(__file__).parent.parent / "config.example.yaml"
    cfg = Config.resolve(config_path=example, env={})
    assert cfg.config_path == example


def test_config_path_is_the_file_read_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert Config.resolve(env={}).config_path is None
    Path("aiq.yaml").write_text("rpm: 5\n")
    assert Config.resolve(env={}).config_path == Path("aiq.yaml")


@pytest.mark.slow
def test_run_with_a_bad_config_exits_2_before_reading_anything(tmp_path: Path) -> None:
    write_prompts(tmp_path / "p.jsonl", [("a", "hello")])
    (tmp_path / "aiq.yaml").write_text("model: m\nrpm: fast\ntemperature: hot\n")

    proc = run_aiq("run", "p.jsonl", "--base-url", "http://127.0.0.1:9/v1", cwd=tmp_path)

    assert proc.returncode == 2, proc.stderr
    assert re.search(
        r"^error: aiq\.yaml: rpm: 'fast' is not a whole number; "
        r"use a positive whole number of requests per minute$",
        proc.stderr,
        re.M,
    ), proc.stderr
    assert "aiq.yaml: temperature: 'hot' is not a number; use a number from 0 to 2" in proc.stderr
    assert "Traceback" not in proc.stderr
