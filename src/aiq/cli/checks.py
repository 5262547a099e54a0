"""``aiq check`` and ``aiq prices``: is the set-up right, and what will the requests cost."""

from __future__ import annotations

import json
from datetime import date
from typing import TYPE_CHECKING

import typer

from .app import guard, load_config, sync
from .options import BaseUrlOpt, ConfigOpt, DbOpt, JsonOpt, ModelOpt, ProviderOpt, TracebackOpt

if TYPE_CHECKING:
    from ..config import Config


def check(
    db: DbOpt = None,
    config: ConfigOpt = None,
    provider: ProviderOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    as_json: JsonOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Check config, API key, endpoint, model, prices and store; one line each, with fixes."""

    def body() -> None:
        def resolve() -> Config:
            return load_config(db, config, provider=provider, base_url=base_url, model=model)

        from .. import preflight

        result = sync(preflight.run_checks(resolve))
        if as_json:
            print(json.dumps({"exit_code": result.exit_code,
                              "findings": [f.as_dict() for f in result.findings]}))  # fmt: skip
        else:
            print("\n".join(map(str, result.findings)))
        raise typer.Exit(result.exit_code)

    guard(traceback, body)


def prices_command(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """The prices in force: aiq's dated list prices with the config's `prices:` over them."""

    def body() -> None:
        from .. import prices

        rows = prices.prices_in_force(load_config(None, config).prices)
        today = date.today()
        if as_json:
            print(json.dumps({"max_age_days": prices.PRICE_MAX_AGE_DAYS,
                              "prices": [r.as_dict(today) for r in rows]}))  # fmt: skip
        else:
            print("\n".join(prices.table_lines(rows, today)))

    guard(traceback, body)
