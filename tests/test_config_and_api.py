"""Config precedence and validation, the public API surface, and output formatting."""

from __future__ import annotations

import inspect
import io
import json
import re
from pathlib import Path

import pytest
from conftest import API_KEY, aiq_env, run_aiq
from fakeserver import FakeServer

import aiq
from aiq.config import Config
from aiq.durations import fmt_duration
from aiq.errors import AiqError, FatalProviderError, UsageError
from aiq.progress import PlainProgress
from aiq.run_records import Progress


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    cfg_file = tmp_path / "aiq.yaml"
    cfg_file.write_text("model: from-file\nconcurrency: 4\nbase_url: http://file/v1\nrpm: 10\n")
    env = {"OPENAI_BASE_URL": "http://env/v1", "OPENAI_API_KEY": "sk-env"}
    cfg = Config.resolve(config_path=cfg_file, env=env, flags={"rpm": 99, "model": None})
    assert cfg.model == "from-file"  # file beats default; an unset flag changes nothing
    assert cfg.concurrency == 4
    assert cfg.base_url == "http://env/v1"  # env beats file
    assert cfg.rpm == 99  # flag beats file
    assert cfg.api_key == "sk-env"
    assert "sk-env" not in repr(cfg)


def test_api_key_env_names_the_variable(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("api_key_env: MY_GATEWAY_KEY\n")
    cfg = Config.resolve(config_path=cfg_file, env={"MY_GATEWAY_KEY": "k-1"})
    assert cfg.api_key == "k-1"


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("concurency: 3\n")
    with pytest.raises(UsageError, match=r"unknown setting 'concurency'.*'concurrency'"):
        Config.resolve(config_path=cfg_file, env={})


@pytest.mark.parametrize(
    "flags",
    [{"concurrency": 0}, {"rpm": -1}, {"provider": "nope"}, {"order": "random"}],
)
def test_bad_values_are_usage_errors(flags: dict) -> None:
    with pytest.raises(UsageError):
        Config.resolve(env={}, flags=flags)


def test_every_error_carries_its_exit_code() -> None:
    codes = {cls.__name__: cls.exit_code for cls in AiqError.__subclasses__()}
    assert codes == {
        "UsageError": 2,
        "InputError": 2,
        "StoreError": 2,
        "OutputError": 2,
        "StoreLocked": 3,
        "FatalProviderError": 4,
        "LimitReached": 5,
        "Interrupted": 130,
    }


def test_an_error_carries_the_summary_of_the_run_it_stopped(tmp_path: Path) -> None:
    """A fatal provider error ends a run that did work: the CLI shows what it did (with
    --json, as JSON on stdout) from the error's ``summary``, declared on every AiqError."""
    assert UsageError("bad flag").summary is None
    assert str(FatalProviderError("refused", summary=None)) == "refused"
    (tmp_path / "k.jsonl").write_text('{"custom_id": "a", "prompt": "hi"}\n')
    with FakeServer(require_key=API_KEY) as server:
        args = ("--base-url", server.base_url, "--model", "m", "--json")
        proc = run_aiq("run", "k.jsonl", *args, cwd=tmp_path, env=aiq_env(OPENAI_API_KEY="sk-no"))
    assert proc.returncode == 4, proc.stderr
    shown = json.loads(proc.stdout)
    assert (shown["stopped"], shown["exit_code"], shown["status"]["counts"]["queued"]) == (
        "fatal",
        4,
        1,
    )


def test_public_api_is_declared() -> None:
    public = {
        name
        for name in dir(aiq)
        if not name.startswith("_") and not inspect.ismodule(getattr(aiq, name))
    }
    assert sorted(public) == sorted(n for n in aiq.__all__ if n != "__version__")
    for name in aiq.__all__:
        assert getattr(aiq, name) is not None


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "?"), (0, "0s"), (59.4, "59s"), (61, "1m01s"), (3725, "1h02m")]
)
def test_fmt_duration(seconds: float | None, text: str) -> None:
    assert fmt_duration(seconds) == text


def test_plain_progress_lines_have_timestamps_and_no_ansi() -> None:
    out = io.StringIO()
    show = PlainProgress(out, every_s=0)
    show(Progress(total=10, done=4, dead=1, retries=2, in_flight=3, tokens_in=5, tokens_out=6))
    line = out.getvalue()
    assert re.match(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d done 4/10 · dead 1 · 50% finished", line
    )
    assert "in flight 3" in line and "retries 2" in line and "dead 1" in line
    assert "\x1b[" not in line


def test_live_progress_renders_every_figure() -> None:
    from rich.console import Console

    from aiq.progress import LiveProgress

    buf = io.StringIO()
    live = LiveProgress(Console(file=buf, force_terminal=True, width=160))
    live(Progress(total=200, done=50, dead=2, retries=7, in_flight=9, tokens_in=1234))
    live.close()
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue())
    for part in ("done 50/200", "in flight 9", "retries 7", "dead 2", "tokens 1,234 in"):
        assert part in text


def test_an_anthropic_config_built_in_code_gets_anthropic_defaults() -> None:
    config = Config(provider="anthropic")
    assert config.base_url == "https://api.anthropic.com"
    assert config.api_key_env == "ANTHROPIC_API_KEY"
    custom = Config(provider="anthropic", base_url="http://127.0.0.1:9/v1", api_key_env="K")
    assert (custom.base_url, custom.api_key_env) == ("http://127.0.0.1:9/v1", "K")
