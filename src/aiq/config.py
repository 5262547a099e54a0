"""Config: every setting of a run, resolved once and frozen.

Precedence, lowest first: built-in defaults < the YAML config file < environment variables <
command-line flags. This is the only module that reads environment variables or the config
file; everything below the CLI receives a Config.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError
from .inputs import Defaults
from .pricing import Price, parse_prices, price_table
from .records import Target

PROVIDERS = ("openai", "anthropic", "simulated")
DEFAULT_DB = Path(".aiq") / "aiq.db"
DEFAULT_CONFIG = Path("aiq.yaml")
OPENAI_BASE_URL = "https://api.openai.com/v1"
SIMULATED_BASE_URL = "http://simulated.invalid/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_KEY_ENV = "ANTHROPIC_API_KEY"
SIMULATED_MODEL = "aiq-simulated"


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a run needs. Build it with :meth:`Config.resolve` (or directly in code)."""

    db: Path = DEFAULT_DB
    provider: str = "openai"
    base_url: str = OPENAI_BASE_URL
    # The name of the environment variable holding the key, and (never printed) its value.
    api_key_env: str = DEFAULT_KEY_ENV
    api_key: str | None = field(default=None, repr=False)
    extra_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    system: str | None = None
    # "auto": enough in flight to reach the rate limits at the latency seen, up to
    # max_concurrency (worker.Worker); a number fixes it.
    concurrency: int | str = "auto"
    max_concurrency: int = 256
    rpm: int | None = None
    tpm: int | None = None
    max_attempts: int = 5
    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    grace_s: float = 30.0
    max_outage_s: float = 600.0  # how long to wait for a provider that is down; then exit 4
    max_runtime_s: float | None = None  # stop claiming after this long; exit 5, resumable
    max_cost_usd: float | None = None  # stop claiming before spending more; exit 5, resumable
    # Per-model rate limits ({model: {rpm:, tpm:}}); other models get rpm / tpm above.
    model_limits: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    # USD per 1M tokens by model, over pricing.DEFAULT_PRICES ({model: {input:, output:}}).
    prices: Mapping[str, Price] = field(default_factory=dict)
    metrics_file: str | None = None  # Prometheus textfile, rewritten during and after a run
    order: str = "done"
    strict: bool = False
    # Send the store's unfinished jobs to a provider or base URL other than the one they were
    # enqueued for (runner refuses that otherwise).
    reroute: bool = False
    simulated_latency_s: float = 0.5
    simulated_error_rate: float = 0.05
    # What resolve() was given, so the config can be resolved again over a store's Target.
    origin: _Origin | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise UsageError(f"provider {self.provider!r}: use one of {', '.join(PROVIDERS)}")
        if self.provider == "anthropic":
            # Built in code with only the provider named: Anthropic's own defaults, as
            # resolve() gives them, not OpenAI's.
            if self.base_url == OPENAI_BASE_URL:
                object.__setattr__(self, "base_url", ANTHROPIC_BASE_URL)
            if self.api_key_env == DEFAULT_KEY_ENV:
                object.__setattr__(self, "api_key_env", ANTHROPIC_KEY_ENV)
        if isinstance(self.concurrency, str):
            try:
                parsed: int | str = (
                    self.concurrency if self.concurrency == "auto" else int(self.concurrency)
                )
            except ValueError:
                raise UsageError(
                    f"concurrency must be a number or 'auto', got {self.concurrency!r}"
                ) from None
            object.__setattr__(self, "concurrency", parsed)
        if self.max_outage_s <= 0:
            raise UsageError(f"max_outage must be positive, got {self.max_outage_s}")
        for name in ("max_concurrency", "max_attempts"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise UsageError(f"{name} must be positive, got {value}")
        if isinstance(self.concurrency, int) and self.concurrency < 1:
            raise UsageError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.max_runtime_s is not None and self.max_runtime_s <= 0:
            raise UsageError(f"max_runtime must be positive, got {self.max_runtime_s}")
        if self.max_cost_usd is not None and self.max_cost_usd <= 0:
            raise UsageError(f"max_cost must be positive, got {self.max_cost_usd}")
        if not isinstance(self.prices, Mapping) or not all(
            isinstance(p, Price) for p in self.prices.values()
        ):
            try:
                object.__setattr__(self, "prices", parse_prices(self.prices))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        object.__setattr__(self, "model_limits", _model_limits(self.model_limits))
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise UsageError("timeouts must be positive")
        if self.order not in ("done", "input"):
            raise UsageError(f"order {self.order!r}: use 'done' or 'input'")

    @property
    def fixed_concurrency(self) -> int | None:
        """The number of requests in flight, or None for "auto"."""
        return self.concurrency if isinstance(self.concurrency, int) else None

    @property
    def pool_size(self) -> int:
        """Connections the HTTP pool may open: as many as requests may be in flight."""
        return self.concurrency if isinstance(self.concurrency, int) else self.max_concurrency

    @property
    def defaults(self) -> Defaults:
        """Body defaults applied to input lines that leave them out."""
        return Defaults(self.model, self.max_tokens, self.temperature, self.system)

    @property
    def price_table(self) -> dict[str, Price]:
        """The default prices with the config's over them."""
        return price_table(self.prices)

    @property
    def target(self) -> Target:
        """Where this config sends jobs, as a store records it."""
        return Target(self.provider, self.base_url, self.api_key_env, self.model, self.max_tokens)

    def aimed_at(self, stored: Target) -> Config:
        """This config resolved again with ``stored`` (a store's Target) as a layer between
        the defaults and the config file: what the user did not set comes from the store, so
        ``aiq resume`` goes where the run it resumes went. A config built in code, not by
        resolve(), is taken as it is."""
        if self.origin is None:
            return self
        o = self.origin
        return Config.resolve(config_path=o.config_path, env=o.env, flags=o.flags, stored=stored)

    @classmethod
    def resolve(
        cls,
        *,
        config_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        flags: Mapping[str, Any] | None = None,
        stored: Target | None = None,
    ) -> Config:
        """Merge defaults < the store's Target < YAML file < environment < flags (flags of
        None are unset). ``stored`` counts only while the file, environment and flags name no
        other provider: a store's base URL means nothing to another provider."""
        origin = _Origin(config_path, env, dict(flags or {}))
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        path = config_path if config_path is not None else _default_config_path()
        file_values = _read_yaml(path) if path is not None else {}
        if stored is not None:
            chosen = (flags or {}).get("provider") or file_values.get("provider")
            if chosen in (None, stored.provider):
                layer = {k: v for k, v in stored.as_dict().items() if v is not None}
                file_values = {**layer, **file_values}
        values.update(file_values)
        if "OPENAI_BASE_URL" in env:
            values["base_url"] = env["OPENAI_BASE_URL"]
        if "AIQ_DB" in env:
            values["db"] = env["AIQ_DB"]
        set_flags = {k: v for k, v in (flags or {}).items() if v is not None}
        values.update(set_flags)
        if values.get("provider") == "simulated":
            if "base_url" not in set_flags:
                values["base_url"] = SIMULATED_BASE_URL
            values.setdefault("model", SIMULATED_MODEL)
        elif values.get("provider") == "anthropic":
            # OPENAI_BASE_URL is not for Anthropic; its SDK reads ANTHROPIC_BASE_URL.
            if "base_url" not in set_flags:
                default = file_values.get("base_url", ANTHROPIC_BASE_URL)
                values["base_url"] = env.get("ANTHROPIC_BASE_URL", default)
            values.setdefault("api_key_env", ANTHROPIC_KEY_ENV)
        key_env = values.get("api_key_env", DEFAULT_KEY_ENV)
        values["api_key"] = env.get(key_env) or None
        if "db" in values:
            values["db"] = Path(values["db"])
        values["origin"] = origin
        try:
            return cls(**values)
        except TypeError as exc:  # a YAML value of the wrong type
            raise UsageError(f"config: {exc}") from None

    def with_(self, **changes: Any) -> Config:
        """A copy with some fields changed."""
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class _Origin:
    config_path: Path | None
    env: Mapping[str, str] | None
    flags: Mapping[str, Any]


def _model_limits(value: Any) -> dict[str, tuple[int | None, int | None]]:
    """``{model: {rpm: N, tpm: N}}`` from the config file (or already parsed) as tuples."""
    if not isinstance(value, Mapping):
        raise UsageError("model_limits: expected a mapping of model: {rpm: N, tpm: N}")
    out: dict[str, tuple[int | None, int | None]] = {}
    for model, limits in value.items():
        if isinstance(limits, tuple):
            out[str(model)] = limits
            continue
        if not isinstance(limits, Mapping) or set(limits) - {"rpm", "tpm"}:
            raise UsageError(f"model_limits: {model}: expected {{rpm: N, tpm: N}}, got {limits!r}")
        for key, n in limits.items():
            if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
                raise UsageError(f"model_limits: {model}: {key} must be a positive whole number")
        out[str(model)] = (limits.get("rpm"), limits.get("tpm"))
    return out


_FILE_KEYS = {f.name for f in fields(Config)} - {"api_key", "origin", "reroute"}
_ALIASES = {
    "timeout": "timeout_s",
    "connect_timeout": "connect_timeout_s",
    "grace": "grace_s",
    "max_runtime": "max_runtime_s",
    "max_outage": "max_outage_s",
    "max_cost": "max_cost_usd",
}


def _default_config_path() -> Path | None:
    return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: config file not found") from None
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read config ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of settings at the top level")
    out: dict[str, Any] = {}
    unknown: list[str] = []  # every one at once: fixing them one run at a time is tedious
    for key, value in data.items():
        name = _ALIASES.get(key, key)
        if name not in _FILE_KEYS:
            close = difflib.get_close_matches(str(key), [*_FILE_KEYS, *_ALIASES], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            unknown.append(f"{path}: unknown setting {key!r}{hint}")
        else:
            out[name] = value
    if unknown:
        raise UsageError("\n".join(unknown))
    return out
