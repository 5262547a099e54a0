"""What each config setting allows: one table, SETTINGS, of every Config field's check and of
what to write instead, so that a bad value is reported with its key, the value and the fix
(``aiq.yaml: rpm: 'fast' is not a whole number; use a positive whole number of requests per
minute``). config.py applies it to every value, from the file, the environment or a flag.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .contract import ON_TRUNCATED, ORDERS, VIAS
from .deadline import ACCEPTED as DEADLINES
from .deadline import parse_deadline
from .defaults import PRIORITY_MAX, PRIORITY_MIN, PRIORITY_RANGE
from .pricing import Price, parse_prices
from .registry import SPECS

PROVIDERS = tuple(SPECS)

# A check returns the value as Config holds it (an int timeout as a float, a path as a Path) or
# raises ValueError saying what is wrong with it, quoting it; check_setting adds the "use ...".

Check = Callable[[Any], Any]


def _shown(value: Any) -> str:
    """A value as the user wrote it: YAML's yes/no are booleans, not the numbers Python says."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a yes/no value)"
    if value is None:
        return "empty"
    if isinstance(value, Mapping | list | tuple):
        return "a mapping" if isinstance(value, Mapping) else "a list"
    return repr(value)


def _whole(least: int, most: int | None = None) -> Check:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{_shown(value)} is not a whole number")
        if value < least:
            raise ValueError(f"{value} is {'not positive' if least == 1 else f'below {least}'}")
        if most is not None and value > most:
            raise ValueError(f"{value} is above {most}")
        return value

    return check


def _number(least: float, most: float | None = None, *, above: bool = False) -> Check:
    """A finite number from ``least`` (excluded with ``above``) to ``most``."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isinf(value):
            raise ValueError(f"{_shown(value)} is not a number")
        if math.isnan(value):
            raise ValueError("nan is not a number")
        if value < least or (above and value == least):
            raise ValueError(f"{value:g} is {'not positive' if above else f'below {least:g}'}")
        if most is not None and value > most:
            raise ValueError(f"{value:g} is above {most:g}")
        return float(value)

    return check


def _text(*, name_like: bool = False, url: bool = False) -> Check:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{_shown(value)} is not text (quote it in YAML)")
        if not value.strip():
            raise ValueError("it is empty")
        if name_like and not _VAR_NAME.fullmatch(value):
            # Not quoted: a key pasted here by mistake must not end up in a message.
            raise ValueError("it is not the name of an environment variable (value not shown)")
        if url and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value

    return check


def _one_of(*choices: str) -> Check:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{_shown(value)} is unknown")
        return str(value)

    return check


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _yes_no(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{_shown(value)} is not true or false")
    return value


def _deadline(value: Any) -> float:
    """A deadline as written (aiq.deadline), or as a store keeps it: seconds since the epoch.
    A YAML date-time is taken as written (local time unless it names an offset)."""
    from datetime import datetime

    if isinstance(value, str):
        return parse_deadline(value, now=time.time())
    if isinstance(value, datetime):
        return parse_deadline(value.isoformat(), now=time.time())
    # A small number is YAML 1.1 reading an unquoted 06:00 as 360 (base 60), not an epoch.
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 1e9:
        return float(value)
    raise ValueError(f"{_shown(value)} is not a time or a duration (quote it in YAML)")


def _path(value: Any) -> Path:
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ValueError(f"{_shown(value)} is not a path")
    return Path(value)


def _concurrency(value: Any) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():  # a flag's text
        value = int(value)
    return _whole(1)(value)


def _headers(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{_shown(value)} is not a mapping of header names to text")
    return dict(value)


def _model_limits(value: Any) -> dict[str, tuple[int | None, int | None]]:
    """``{model: {rpm: N, tpm: N}}`` from the config file (or already parsed) as tuples."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{_shown(value)} is not a mapping of models")
    out: dict[str, tuple[int | None, int | None]] = {}
    for model, limits in value.items():
        if isinstance(limits, tuple):  # parsed already: (rpm, tpm)
            limits = dict(zip(("rpm", "tpm"), limits, strict=True))
        if not isinstance(limits, Mapping) or not limits or set(limits) - {"rpm", "tpm"}:
            raise ValueError(f"{model}: {_shown(limits)} is not {{rpm: N, tpm: N}}")
        for key, n in limits.items():
            try:
                _optional(_whole(1))(n)
            except ValueError as exc:
                raise ValueError(f"{model}: {key}: {exc}") from None
        out[str(model)] = (limits.get("rpm"), limits.get("tpm"))
    return out


def _prices(value: Any) -> dict[str, Price]:
    if isinstance(value, Mapping) and all(isinstance(p, Price) for p in value.values()):
        return dict(value)
    return parse_prices(value)


_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECONDS = "a number of seconds above 0"
SETTINGS: dict[str, tuple[Check, str]] = {
    "db": (_path, "the path of the store's file"),
    "provider": (_one_of(*PROVIDERS), " | ".join(PROVIDERS)),
    "base_url": (_text(url=True), "the API's base URL, such as https://api.openai.com/v1"),
    "api_key_env": (_text(name_like=True), "the NAME of the variable that holds the key"),
    "api_key": (_optional(_text()), "a key in the environment variable api_key_env names"),
    "extra_headers": (_headers, "{Header-Name: value, ...}"),
    "model": (_optional(_text()), "a model name such as gpt-4o-mini"),
    "max_tokens": (_optional(_whole(1)), "a positive whole number of tokens"),
    "temperature": (_optional(_number(0, 2)), "a number from 0 to 2"),
    "system": (_optional(_text()), "the system prompt, as text"),
    "priority": (_optional(_whole(PRIORITY_MIN, PRIORITY_MAX)), PRIORITY_RANGE),
    "concurrency": (_concurrency, "auto or a positive whole number of requests in flight"),
    "max_concurrency": (_optional(_whole(1)), "a positive whole number of requests in flight"),
    "rpm": (_optional(_whole(1)), "a positive whole number of requests per minute"),
    "tpm": (_optional(_whole(1)), "a positive whole number of tokens per minute"),
    "max_attempts": (_whole(1), "a positive whole number of attempts"),
    "timeout_s": (_number(0, above=True), _SECONDS),
    "connect_timeout_s": (_number(0, above=True), _SECONDS),
    "backoff_base_s": (_number(0, above=True), _SECONDS),
    "backoff_cap_s": (_number(0, above=True), _SECONDS),
    "grace_s": (_number(0), "a number of seconds, 0 or more"),
    "max_outage_s": (_number(0, above=True), _SECONDS),
    "max_runtime_s": (_optional(_number(0, above=True)), _SECONDS),
    "max_cost_usd": (_optional(_number(0, above=True)), "a number of US dollars above 0"),
    "model_limits": (_model_limits, "{model: {rpm: N, tpm: N}, ...}"),
    "prices": (
        _prices,
        "{model: {input: USD per 1M tokens, output: USD per 1M tokens}, ...}, each with "
        "cached_input, cache_write, cache_read, batch_share, flex_share if you like",
    ),
    "metrics_file": (_optional(_text()), "the path of a file to write metrics to"),
    "order": (_one_of(*ORDERS), " | ".join(ORDERS)),
    "on_truncated": (_one_of(*ON_TRUNCATED), " | ".join(ON_TRUNCATED)),
    "via": (_one_of(*VIAS), " | ".join(VIAS)),
    "deadline": (_optional(_deadline), DEADLINES),
    "strict": (_yes_no, "true or false"),
    "reroute": (_yes_no, "true or false"),
    "simulated_latency_s": (_number(0), "a number of seconds, 0 or more"),
    "simulated_error_rate": (_number(0, 1), "a number from 0 to 1"),
}


def check_setting(name: str, value: Any) -> Any:
    """``value`` as Config holds it; ValueError saying what is wrong and what to write."""
    check, allowed = SETTINGS[name]
    try:
        return check(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; use {allowed}") from None
