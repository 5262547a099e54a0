"""Config: every setting of a run, resolved once and frozen.

Precedence, lowest first: built-in defaults < the YAML config file < environment variables <
command-line flags. This is the only module that reads environment variables or the config
file; everything below the CLI receives a Config.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .contract import OnTruncated, Order, ProviderName, Via
from .defaults import Defaults
from .errors import UsageError
from .pricing import Price, price_table
from .records import Target
from .registry import DEFAULT, SPECS, ProviderSpec, spec_for
from .settings import SETTINGS, check_setting

DEFAULT_DB = Path(".aiq") / "aiq.db"
DEFAULT_CONFIG = Path("aiq.yaml")


DEFAULT_TIMEOUT_S = 600.0  # the official SDKs' read timeout
FLEX_TIMEOUT_S = 900.0  # OpenAI's advice for the flex tier


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Everything a run needs. Build it with :meth:`Config.resolve` (or directly in code)."""

    db: Path = DEFAULT_DB
    # A provider in the registry (aiq.registry); base_url and api_key_env default to its own.
    provider: ProviderName = DEFAULT.name
    base_url: str = DEFAULT.base_url
    # The name of the environment variable holding the key, and (never printed) its value.
    api_key_env: str = DEFAULT.key_env
    api_key: str | None = field(default=None, repr=False)
    extra_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    system: str | None = None
    # The priority of lines that name none (--priority): a flag for one file, not a setting
    # of the config file, which every file a run reads would take.
    priority: int | None = None
    # "auto": enough in flight to reach the rate limits at the latency seen, up to
    # max_concurrency (worker.Worker); a number fixes it.
    concurrency: int | str = "auto"
    max_concurrency: int | None = None  # None: what the machine allows (aiq.machine)
    rpm: int | None = None
    tpm: int | None = None
    max_attempts: int = 5
    # The longest a call may take (the official SDKs wait 600 s: long generations take
    # minutes); shorter per model once its replies are seen (aiq.timeouts).
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = 10.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    grace_s: float = 30.0
    max_outage_s: float = 600.0  # how long to wait for a provider that is down; then exit 4
    max_runtime_s: float | None = None  # stop claiming after this long; exit 5, resumable
    max_cost_usd: float | None = None  # stop claiming before spending more; exit 5, resumable
    # A reply cut off at max_tokens: "keep" it as a result (counted), or "dead"-letter it for
    # a replay with more tokens (aiq.stops). Content-filter stops are always kept.
    on_truncated: OnTruncated = "keep"
    # Per-model rate limits ({model: {rpm:, tpm:}}); other models get rpm / tpm above.
    model_limits: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    # USD per 1M tokens by model, over pricing.DEFAULT_PRICES ({model: {input:, output:}}).
    prices: Mapping[str, Price] = field(default_factory=dict)
    metrics_file: str | None = None  # Prometheus textfile, rewritten during and after a run
    order: Order = "done"
    # How jobs are sent: one call each, or through the provider's batch engine
    # (aiq.batch_engine); recorded in the store, so resume and cron go on the same way.
    via: Via = "online"
    # --via auto: when the jobs must be done by, in seconds since the epoch (aiq.deadline);
    # recorded in the store with the via.
    deadline: float | None = None
    strict: bool = False
    simulated_latency_s: float = 0.5
    simulated_error_rate: float = 0.05
    # Send the store's unfinished jobs to a provider or base URL other than the one they were
    # enqueued for (routing.py refuses that otherwise).
    reroute: bool = False
    # Not a setting: the config file resolve() read, if any, for the CLI to say so.
    config_path: Path | None = None
    # What resolve() was given, so the config can be resolved again over a store's Target.
    origin: _Origin | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        for name in SETTINGS:
            try:
                object.__setattr__(self, name, check_setting(name, getattr(self, name)))
            except ValueError as exc:
                problems.append(f"{name}: {exc}")
        if problems:
            raise UsageError("\n".join(problems))
        spec = self.spec
        if spec is not DEFAULT:
            # Built in code with only the provider named: its own defaults, as resolve()
            # gives them, not those of the default provider.
            if self.base_url == DEFAULT.base_url:
                object.__setattr__(self, "base_url", spec.base_url)
            if self.api_key_env == DEFAULT.key_env:
                object.__setattr__(self, "api_key_env", spec.key_env)
        if self.temperature is not None and self.temperature > spec.max_temperature:
            most = f"{spec.max_temperature:g}"
            raise UsageError(
                f"temperature: {self.temperature:g} is above {most}, the most {spec.title} "
                f"takes; use a number from 0 to {most} with provider {spec.name}"
            )
        if self.backoff_base_s > self.backoff_cap_s:
            raise UsageError(
                f"backoff_base_s: {self.backoff_base_s:g} is above backoff_cap_s "
                f"({self.backoff_cap_s:g}); use a base no larger than the cap"
            )

    @property
    def call_timeout_s(self) -> float:
        """The longest a call may take: ``timeout_s``, or at the flex tier left at its default,
        the 900 s OpenAI advises for flex (its flex-processing guide: "increase default
        timeout to 15 minutes")."""
        if self.via == "flex" and self.timeout_s == DEFAULT_TIMEOUT_S:
            return FLEX_TIMEOUT_S
        return self.timeout_s

    @property
    def spec(self) -> ProviderSpec:
        """The provider's spec in the registry (aiq.registry)."""
        return SPECS[self.provider]  # checked by __post_init__'s SETTINGS

    @property
    def fixed_concurrency(self) -> int | None:
        """The number of requests in flight, or None for "auto"."""
        return self.concurrency if isinstance(self.concurrency, int) else None

    @property
    def defaults(self) -> Defaults:
        """Body defaults applied to input lines that leave them out."""
        return Defaults(self.model, self.max_tokens, self.temperature, self.system, self.priority)

    @property
    def price_table(self) -> dict[str, Price]:
        """The default prices with the config's over them."""
        return price_table(self.prices)

    @property
    def target(self) -> Target:
        """Where this config sends jobs, as a store records it."""
        return Target(
            provider=self.provider,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            model=self.model,
            max_tokens=self.max_tokens,
            via=self.via,
            deadline=self.deadline,
        )

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
        None are unset). ``stored`` counts only while the file and flags name no other
        provider: a store's base URL means nothing to another provider.

        Every value given is checked against SETTINGS, overridden or not (a bad file is a bad
        file), and every bad one is reported at once with where it came from: the file and
        key, the variable, or the flag. ``config_path`` of the result is the file read, if any.
        """
        origin = _Origin(config_path, env, dict(flags or {}))
        env = os.environ if env is None else env
        path = config_path if config_path is not None else _default_config_path()
        file_values, spelled = _read_yaml(path) if path is not None else ({}, {})
        values: dict[str, Any] = {}
        problems: list[str] = []

        def put(name: str, value: Any, where: str) -> None:
            try:
                values[name] = check_setting(name, value)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")

        if stored is not None:
            chosen = (flags or {}).get("provider") or file_values.get("provider")
            if chosen in (None, stored.provider):
                for name, value in stored.as_dict().items():
                    if value is not None:
                        put(name, value, f"{name} recorded in the store")
        for name, value in file_values.items():
            put(name, value, f"{path}: {spelled[name]}")
        if "AIQ_DB" in env:
            put("db", env["AIQ_DB"], "$AIQ_DB")
        set_flags = {k: v for k, v in (flags or {}).items() if v is not None}
        for name, value in set_flags.items():
            put(name, value, _flag_name(name))
        _provider_defaults(values, set_flags, env, put)
        if problems:
            raise UsageError("\n".join(problems))
        key_env = values["api_key_env"]
        values["api_key"] = env.get(key_env) or None
        return cls(**values, config_path=path, origin=origin)

    def with_(self, **changes: Any) -> Config:
        """A copy with some fields changed."""
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class _Origin:
    config_path: Path | None
    env: Mapping[str, str] | None
    flags: Mapping[str, Any]


_FILE_KEYS = {f.name for f in fields(Config)} - {
    "api_key",
    "config_path",
    "origin",
    "reroute",
    "priority",
}
_ALIASES = {
    "timeout": "timeout_s",
    "connect_timeout": "connect_timeout_s",
    "grace": "grace_s",
    "max_runtime": "max_runtime_s",
    "max_outage": "max_outage_s",
    "max_cost": "max_cost_usd",
}


def _provider_defaults(
    values: dict[str, Any],
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    put: Callable[[str, Any, str], None],
) -> None:
    """What the provider's spec decides, under the flags: an offline provider's base URL is
    its own; another's comes from the variable its SDK reads (OPENAI_BASE_URL means nothing
    to Anthropic), else the file or the store, else the spec. Then its key variable and its
    default model, where nothing named them."""
    spec = spec_for(values.get("provider", DEFAULT.name))
    if "base_url" not in flags and (spec.offline or "base_url" not in values):
        values["base_url"] = spec.base_url
    var = None if spec.offline else spec.base_url_env
    if var is not None and var in env:
        flagged = values.get("base_url")
        put("base_url", env[var], f"${var}")  # checked even where a flag overrides it
        if "base_url" in flags:
            values["base_url"] = flagged
    values.setdefault("api_key_env", spec.key_env)
    if spec.default_model is not None:
        values.setdefault("model", spec.default_model)


def _default_config_path() -> Path | None:
    return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None


def _flag_name(name: str) -> str:
    """The flag that sets a field: ``timeout_s`` is ``--timeout``."""
    spelled = next((alias for alias, n in _ALIASES.items() if n == name), name)
    return "--" + spelled.replace("_", "-")


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's settings by field name, and each one's key as the file spells it."""
    import yaml  # here, not at the top: most commands in a directory without aiq.yaml skip it

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: config file not found") from None
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read config ({exc})") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of settings at the top level")
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    unknown: list[str] = []  # every one at once: fixing them one run at a time is tedious
    for key, value in data.items():
        name = _ALIASES.get(key, key)
        if name not in _FILE_KEYS:
            import difflib  # here: only a misspelt setting needs it

            close = difflib.get_close_matches(str(key), [*_FILE_KEYS, *_ALIASES], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            unknown.append(f"{path}: unknown setting {key!r}{hint}")
        else:
            out[name], spelled[name] = value, str(key)
    if unknown:
        raise UsageError("\n".join(unknown))
    return out, spelled
