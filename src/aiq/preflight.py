"""``aiq check``: is everything in place for a run? Config, key, endpoint, model, prices, store.

Each check gives one Finding (``check_records.py``): ``ok``, ``warn`` (works, but may surprise)
or ``FAIL`` with what to do. Nothing is sent that costs tokens: the endpoint and the model are
confirmed through the provider's model list (``GET /models``), and the store is opened
read-only.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from datetime import date
from pathlib import Path

import httpx

from . import machine, prices, routing
from .check_records import FAIL, OK, WARN, CheckReport, Finding
from .config import Config
from .database import StoreOutdated
from .errors import StoreError, UsageError
from .pricing import PRICE_MAX_AGE_DAYS, Price
from .providers.failures import error_message, secret_of
from .records import STATE_NAMES
from .registry import endpoint_url
from .store import JobStore

# Statuses that pass with time (besides 5xx): a timeout, "too early", a rate limit.
_PASSING = frozenset({408, 425, 429})
# A bound on requests in flight below this is worth a warning: 30,000 requests a minute at 3 s
# need ~1,500 at once.
_FEW_IN_FLIGHT = 1_000


async def run_checks(
    resolve: Callable[[], Config],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    today: date | None = None,
) -> CheckReport:
    """Run every check. ``resolve`` builds the Config, so a config error becomes findings;
    ``today`` (default: the clock's) dates the default prices."""
    try:
        config = resolve()
    except UsageError as exc:
        findings = [
            Finding(FAIL, "config", line, "fix the config file or the flag")
            for line in str(exc).splitlines()
        ]
        return CheckReport([*findings, Finding(WARN, "checks", "the rest need a valid config")])
    config, routed = await _aim(config)
    findings = [_config_finding(config), *routed]
    if config.spec.offline:
        findings.append(Finding(OK, "provider", f"{config.provider}: no key or network needed"))
    else:
        findings.append(key := _key_finding(config))
        if key.status == FAIL:  # the provider would only refuse us
            findings.append(Finding(WARN, "endpoint", "not checked without an API key"))
        else:
            found = await _endpoint_findings(config, transport)
            # A key the server refused (or asked for) says more than the environment did.
            if found[0].subject == key.subject:
                findings[-1] = found.pop(0)
            findings += found
    findings += _price_findings(config, await _run_models(config), today or date.today())
    findings.append(_concurrency_finding(config))
    findings.append(await _store_finding(config.db))
    return CheckReport(findings)


def _config_finding(c: Config) -> Finding:
    return Finding(
        OK, "config", f"provider {c.provider}, base URL {c.base_url}, model {c.model or '(none)'}"
    )


def _key_finding(c: Config) -> Finding:
    if c.api_key:
        return Finding(OK, "API key", f"found in ${c.api_key_env} (not shown)")
    if c.spec.needs_key(c.base_url):
        return Finding(
            FAIL,
            "API key",
            f"${c.api_key_env} is not set",
            f"export {c.api_key_env}=…, or set api_key_env: to the variable that holds it",
        )
    return Finding(OK, "API key", f"${c.api_key_env} is not set: fine for a server that needs none")


def _base_url_finding(c: Config) -> Finding | None:
    """A warning for an OpenAI-compatible base URL without ``/v1``: a run adds it (as the
    model list was asked for here), where other clients would not."""
    base = c.base_url.rstrip("/")
    if c.spec.host_base or base.endswith("/v1"):
        return None
    return Finding(
        WARN,
        "base URL",
        f"{base} does not end in /v1: aiq adds it, so requests go to "
        f"{endpoint_url(base, '/v1/chat/completions')} and the like",
        f"did you mean {base}/v1? It sends to the same place, and other clients expect it",
    )


_LIST_TIMEOUT_S = 30.0


async def _endpoint_findings(
    c: Config, transport: httpx.AsyncBaseTransport | None
) -> list[Finding]:
    url, headers = c.spec.models_request(c.base_url, c.api_key, c.extra_headers)
    shown = url.split("?")[0]
    # The model list comes at once: --timeout's 600 s are for long generations, not this.
    timeout = httpx.Timeout(min(c.timeout_s, _LIST_TIMEOUT_S), connect=c.connect_timeout_s)
    try:
        async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
            resp = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        # httpx messages never include headers, so the key cannot leak through them.
        what = str(exc) or type(exc).__name__
        found = [
            Finding(
                FAIL,
                "endpoint",
                f"cannot reach {shown} ({what})",
                "check --base-url (or base_url:) and the network",
                provider=True,
            )
        ]
    else:
        found = _answer_findings(c, resp, shown)
    note = _base_url_finding(c)
    return found if note is None else [found[0], note, *found[1:]]


def _answer_findings(c: Config, resp: httpx.Response, shown: str) -> list[Finding]:
    """What the model list's answer says about the key, the endpoint and the model."""
    if resp.status_code == 404:
        return [
            Finding(OK, "endpoint", f"{shown} answered, but serves no model list (HTTP 404)"),
            Finding(WARN, "model", f"cannot confirm {c.model or 'the model'}: no model list"),
        ]
    if resp.status_code != 200:
        said, _ = error_message(resp, resp.content, secret=secret_of(c.api_key))
        return [_refusal_finding(c, resp.status_code, said, shown)]
    models = _model_ids(resp)
    if models is None:
        return [
            Finding(
                FAIL,
                "endpoint",
                f"{shown} answered 200 but not with a model list",
                "check --base-url: it should end in /v1",
                provider=True,
            )
        ]
    return [
        Finding(OK, "endpoint", f"{shown} answered ({len(models)} models listed)"),
        _model_finding(c, models),
    ]


def _refusal_finding(c: Config, status: int, said: str, shown: str) -> Finding:
    """An error status from the model list, with the server's message and advice that fits
    it: set a key it wants, check the key it refused, wait out a passing failure, or fix
    what a retry cannot."""
    if status in (401, 403) and not c.api_key:  # it wants a key after all
        return Finding(
            FAIL,
            "API key",
            f"${c.api_key_env} is not set, and {shown} wants one ({said})",
            f"set it: export {c.api_key_env}=…, or set api_key_env: to the variable that holds it",
            provider=True,
        )
    if status in (401, 403):
        return Finding(
            FAIL,
            "API key",
            f"refused by {shown} ({said})",
            f"check the key in ${c.api_key_env} and its permissions",
            provider=True,
        )
    if status in _PASSING or status >= 500:
        fix = "try again later, and check the provider's status page"
    else:
        fix = (
            "a refusal, not a passing failure: check --base-url (the API's base, such as "
            "http://host:8000/v1) and any headers or parameters the server wants"
        )
    return Finding(FAIL, "endpoint", f"{shown} answered {said}", fix, provider=True)


def _model_ids(resp: httpx.Response) -> list[str] | None:
    try:
        data = resp.json().get("data")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, AttributeError, TypeError):
        return None


def _model_finding(c: Config, models: list[str]) -> Finding:
    if c.model is None:
        return Finding(
            WARN,
            "model",
            "none configured: every line must name its own",
            "set --model or model: in the config for lines naming none",
        )
    if c.model in models:
        return Finding(OK, "model", f"{c.model} is listed by the endpoint")
    close = difflib.get_close_matches(c.model, models, n=1)
    hint = f" (closest: {close[0]})" if close else ""
    return Finding(
        FAIL,
        "model",
        f"{c.model} is not among the {len(models)} models the endpoint lists{hint}",
        "fix --model or model: in the config",
        provider=True,
    )


def _concurrency_finding(c: Config) -> Finding:
    """How many requests may be in flight, and what bounds that when not the provider: a
    machine that allows few (the open-files limit) keeps a high rate limit out of reach."""
    fixed = c.fixed_concurrency  # not bound by max_concurrency: only by the machine
    bound = machine.run_bound(c.max_concurrency if fixed is None else None)
    if fixed is not None and fixed > bound.senders:
        return Finding(
            WARN,
            "concurrency",
            f"--concurrency {fixed:,} is over the {bound.senders:,} in flight that "
            f"{bound.reason} allows",
            f"lower --concurrency to {bound.senders:,}, or raise the bound",
        )
    if fixed is not None:
        return Finding(OK, "concurrency", f"{fixed:,} in flight (fixed)")
    if c.max_concurrency is None and bound.senders < _FEW_IN_FLIGHT:
        return Finding(
            WARN,
            "concurrency",
            f"auto, up to {bound.senders:,} in flight: held back by {bound.reason}; a high "
            "rate limit at a few seconds' latency needs more",
            "raise the hard open-files limit (ulimit -Hn, or LimitNOFILE= under systemd)",
        )
    return Finding(
        OK, "concurrency", f"auto, up to {bound.senders:,} in flight (bound by {bound.reason})"
    )


def _price_findings(c: Config, models: set[str], today: date) -> list[Finding]:
    """A line for each model the run would send to: its price and where it came from; a
    warning for a model with none (a failure under --max-cost, which refuses to run it), or
    with a default checked over PRICE_MAX_AGE_DAYS before ``today``."""
    if not models:
        return [Finding(OK, "price", "no default model to price; lines are priced by their model")]
    table = c.price_table
    return [_price_finding(c, model, table, today) for model in sorted(models)]


def _price_finding(c: Config, model: str, table: dict[str, Price], today: date) -> Finding:
    how = f"set prices: {{{model}: {{input: USD, output: USD}}}} (per 1M tokens) in the config"
    row = prices.row_for(model, table, c.prices)
    if row is None:
        return Finding(
            FAIL if c.max_cost_usd is not None else WARN,
            "price",
            f"none for {model}: its cost shows as unknown, and --max-cost refuses to run it",
            how,
        )
    p = row.price
    figures = f"{model}: ${p.input_per_m:g} in / ${p.output_per_m:g} out per 1M tokens"
    if row.check is None:
        return Finding(OK, "price", f"{figures} (the config)")
    when = row.check.checked
    if when is None:
        return Finding(OK, "price", f"{figures} ({row.check.where})")
    if row.check.confirmed:
        source = f"aiq's list price, checked {when.isoformat()} against {row.check.where}"
    else:
        source = f"aiq's list price of {when.isoformat()}, unverified: {row.check.where}"
    if not row.stale(today):
        return Finding(OK, "price", f"{figures} ({source})")
    return Finding(
        WARN,
        "price",
        f"{figures} ({source}): {row.check.age_days(today)} days old, over "
        f"{PRICE_MAX_AGE_DAYS}, so it may be out of date",
        f"check the provider's pricing page and {how}; `aiq prices` shows the table in force",
    )


async def _run_models(config: Config) -> set[str]:
    """The models a run would send to: the config's default, and those the store's queued and
    running jobs name (a job naming none takes the default)."""
    named: set[str | None] = {config.model}
    if config.db.exists():
        try:
            store = await JobStore.open(config.db, readonly=True)
        except StoreError:
            store = None  # the store's own finding says why
        if store is not None:
            try:
                with store.errors():
                    named |= await store.waiting_models()
            except StoreError:
                pass
            finally:
                await store.close()
    return {m for m in named if m is not None}


async def _aim(config: Config) -> tuple[Config, list[Finding]]:
    """The config as a run on this store would use it: aimed where its jobs go (see
    routing.py), with a FAIL if the run would be refused for sending them elsewhere."""
    if not config.db.exists():
        return config, []
    try:
        store = await JobStore.open(config.db, readonly=True)
    except StoreError:
        return config, []  # the store's own finding says why
    try:
        with store.errors():
            return await routing.aim(store, config), []
    except UsageError as exc:
        return config, [Finding(FAIL, "store", str(exc), "pass --reroute to the run, or --db")]
    except StoreError:
        return config, []
    finally:
        await store.close()


async def _store_finding(db: Path) -> Finding:
    if not db.exists():
        parent = next((p for p in db.absolute().parents if p.exists()), None)
        if parent is not None and not os.access(parent, os.W_OK):
            return Finding(
                FAIL,
                "store",
                f"{db} cannot be created: {parent} is not writable",
                "make it writable, or pass --db PATH",
            )
        return Finding(OK, "store", f"{db} does not exist yet: the first add or run creates it")
    try:
        store = await JobStore.open(db, readonly=True)
    except StoreOutdated:
        return Finding(OK, "store", f"{db} was written by an older aiq: the next run upgrades it")
    except StoreError as exc:
        return Finding(FAIL, "store", str(exc))
    try:
        with store.errors():
            stats = await store.stats()
    except StoreError as exc:  # damaged past its schema
        return Finding(FAIL, "store", str(exc))
    finally:
        await store.close()
    counts = ", ".join(f"{stats.counts[s]} {s}" for s in STATE_NAMES)
    if not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK):
        return Finding(
            FAIL,
            "store",
            f"{db} is readable but not writable",
            "make it and its directory writable, or pass --db PATH",
        )
    return Finding(OK, "store", f"{db}: schema up to date, {stats.total} jobs ({counts})")
