"""Dated default prices: the staleness rule on an injected clock, the table in force
(`aiq prices`, text and --json, with the config over it), and what `aiq check` says of a stale
price and a missing one (real `aiq` subprocesses)."""

from __future__ import annotations

import asyncio
import json
from datetime import date, timedelta
from pathlib import Path

import pytest
from conftest import run_aiq
from hypothesis import given
from hypothesis import strategies as st

from aiq import DEFAULT_CHECKS, DEFAULT_PRICES, PRICE_MAX_AGE_DAYS, Config, PriceCheck, run_checks
from aiq.prices import CONFIG, DEFAULT, prices_in_force, row_for
from aiq.pricing import Price, parse_prices, price_table

CHECKED = date(2026, 3, 1)


def test_a_price_goes_stale_the_day_after_180_days() -> None:
    check = PriceCheck(CHECKED, "https://example.com/pricing")
    assert not check.stale(CHECKED)
    assert not check.stale(CHECKED + timedelta(days=PRICE_MAX_AGE_DAYS))
    assert check.stale(CHECKED + timedelta(days=PRICE_MAX_AGE_DAYS + 1))
    assert check.age_days(CHECKED + timedelta(days=200)) == 200
    nothing = PriceCheck(None, "aiq's simulated provider")  # no list price to check
    assert not nothing.stale(date(2100, 1, 1)) and nothing.age_days(CHECKED) is None


@given(st.dates(), st.dates(), st.integers(min_value=0, max_value=3_650))
def test_stale_is_older_than_the_bound(checked: date, today: date, bound: int) -> None:
    stale = PriceCheck(checked, "x").stale(today, bound)
    assert stale == ((today - checked).days > bound)


def test_every_default_price_says_when_and_where_it_was_checked() -> None:
    assert set(DEFAULT_CHECKS) == set(DEFAULT_PRICES)
    for model, check in DEFAULT_CHECKS.items():
        if check.confirmed and check.checked is not None:  # a source to go back to
            assert check.where.startswith("https://"), model
        else:
            assert check.where and " " in check.where, model  # says why there is none
    assert DEFAULT_CHECKS["aiq-simulated"].checked is None
    assert not DEFAULT_CHECKS["gpt-4o-mini"].confirmed  # no stored OpenAI page confirmed it
    assert DEFAULT_CHECKS["claude-sonnet-4-5"].confirmed


def test_haiku_3_has_its_own_cache_rates_from_the_page() -> None:
    # 1.2x and 0.12x of input on Anthropic's page, not the usual 1.25x and 0.1x.
    assert DEFAULT_PRICES["claude-3-haiku"].cache_write_per_m == 0.30
    assert DEFAULT_PRICES["claude-3-haiku"].cache_read_per_m == 0.03


def test_the_table_in_force_puts_the_config_over_the_defaults() -> None:
    overrides = {"gpt-4o-mini": Price(0.3, 1.2), "house-model": Price(0, 0)}
    rows = {r.model: r for r in prices_in_force(overrides)}

    assert set(rows) == set(DEFAULT_PRICES) | {"house-model"}
    mini = rows["gpt-4o-mini"]
    assert mini.source == CONFIG and mini.check is None and not mini.stale(date(2100, 1, 1))
    assert mini.price.cached_input_per_m == 0.15  # the default's share, of the config's input
    assert rows["house-model"].source == CONFIG
    assert rows["gpt-4o"].source == DEFAULT and rows["gpt-4o"].check == DEFAULT_CHECKS["gpt-4o"]


def test_a_snapshot_row_is_its_family_with_the_family_date() -> None:
    row = row_for("claude-sonnet-4-5-20250929", price_table(), {})
    assert row is not None and row.model == "claude-sonnet-4-5-20250929"
    assert row.check == DEFAULT_CHECKS["claude-sonnet-4-5"]
    assert row_for("house-model", price_table(), {}) is None


def _price_findings(tmp_path: Path, model: str, today: date, yaml: str = "") -> list:
    path = tmp_path / "aiq.yaml"
    path.write_text(yaml or "{}\n")
    flags = {"provider": "simulated", "model": model, "db": tmp_path / "x.db"}
    report = asyncio.run(
        run_checks(lambda: Config.resolve(config_path=path, flags=flags), today=today)
    )
    return [f for f in report.findings if f.subject == "price"]


def test_check_warns_of_a_default_over_180_days_old_on_the_injected_clock(
    tmp_path: Path,
) -> None:
    checked = DEFAULT_CHECKS["claude-sonnet-4-5"].checked
    assert checked is not None

    (fresh,) = _price_findings(tmp_path, "claude-sonnet-4-5", checked + timedelta(days=180))
    assert fresh.status == "ok" and f"checked {checked.isoformat()}" in fresh.message

    (old,) = _price_findings(tmp_path, "claude-sonnet-4-5", checked + timedelta(days=181))
    assert old.status == "warn" and "181 days old" in old.message
    assert old.fix is not None and "prices: {claude-sonnet-4-5: {input: USD" in old.fix

    yaml = "prices: {claude-sonnet-4-5: {input: 3, output: 15}}\n"  # the user's price: no age
    (own,) = _price_findings(tmp_path, "claude-sonnet-4-5", date(2100, 1, 1), yaml)
    assert own.status == "ok" and "(the config)" in own.message


def _run(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    proc = run_aiq(*args, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


YAML = "prices:\n  gpt-4o-mini: {input: 0.2, output: 0.8}\n  house-model: {input: 1, output: 2}\n"


@pytest.mark.slow
def test_aiq_prices_prints_the_table_in_force_with_each_source(tmp_path: Path) -> None:
    code, out, _ = _run(tmp_path, "prices")
    assert code == 0
    (sonnet,) = [line for line in out.splitlines() if line.startswith("claude-sonnet-4-5 ")]
    assert sonnet.split()[1:6] == ["3", "15", "-", "3.75", "0.3"]
    assert "default, checked 20" in sonnet
    (mini,) = [line for line in out.splitlines() if line.startswith("gpt-4o-mini ")]
    assert "default, unverified, written 2025-11-01" in mini and "check it" in mini
    assert "`prices:`" in out

    (tmp_path / "aiq.yaml").write_text(YAML)
    code, out, err = _run(tmp_path, "prices")
    assert code == 0 and "config: aiq.yaml" in err
    (mini,) = [line for line in out.splitlines() if line.startswith("gpt-4o-mini ")]
    assert mini.split()[1:3] == ["0.2", "0.8"] and "config (over aiq's default)" in mini
    (house,) = [line for line in out.splitlines() if line.startswith("house-model ")]
    assert house.split()[-1] == "config"


@pytest.mark.slow
def test_aiq_prices_json_has_each_rows_source_date_and_age(tmp_path: Path) -> None:
    (tmp_path / "aiq.yaml").write_text(YAML)
    code, out, _ = _run(tmp_path, "prices", "--json")
    assert code == 0
    table = json.loads(out)
    assert table["max_age_days"] == 180
    rows = {r["model"]: r for r in table["prices"]}

    assert rows["gpt-4o-mini"]["source"] == "config" and rows["gpt-4o-mini"]["input"] == 0.2
    assert rows["gpt-4o-mini"]["checked"] is None and rows["gpt-4o-mini"]["stale"] is False
    assert rows["house-model"]["output"] == 2
    sonnet = rows["claude-sonnet-4-5"]
    assert sonnet["source"] == "default" and sonnet["confirmed"] is True
    assert sonnet["where"].startswith("https://platform.claude.com/")
    assert date.fromisoformat(sonnet["checked"]) == DEFAULT_CHECKS["claude-sonnet-4-5"].checked
    assert sonnet["age_days"] == (date.today() - date.fromisoformat(sonnet["checked"])).days
    gpt4o = rows["gpt-4o"]  # written 2025-11-01, unverified: stale from 2026-05 on
    assert gpt4o["confirmed"] is False and gpt4o["stale"] is True


def _check_prices(tmp_path: Path, *args: str) -> tuple[int, list[dict]]:
    code, out, _ = _run(tmp_path, "check", "--json", "--provider", "simulated", *args)
    findings = json.loads(out)["findings"]
    return code, [f for f in findings if f["subject"] == "price"]


@pytest.mark.slow
def test_check_warns_of_a_stale_default_price_saying_how_to_set_one(tmp_path: Path) -> None:
    code, (price,) = _check_prices(tmp_path, "--model", "gpt-4o")

    assert code == 0  # a warning: the run would work
    assert price["status"] == "warn"
    assert "2025-11-01" in price["message"] and "days old, over 180" in price["message"]
    assert "prices: {gpt-4o: {input: USD, output: USD}}" in price["fix"]
    assert "aiq prices" in price["fix"]


@pytest.mark.slow
def test_check_prices_every_model_the_store_would_send_to(tmp_path: Path) -> None:
    lines = [{"custom_id": "a", "prompt": "hi"}, {"custom_id": "b", "prompt": "hi", "model": "x-1"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "aiq.yaml").write_text(YAML)
    code, _, err = _run(tmp_path, "add", "p.jsonl", "--model", "house-model")
    assert code == 0, err

    code, found = _check_prices(tmp_path, "--model", "house-model")

    assert code == 0
    by_model = {f["message"].split(":")[0].removeprefix("none for "): f for f in found}
    assert set(by_model) == {"house-model", "x-1"}
    assert (
        by_model["house-model"]["status"] == "ok"
        and "(the config)" in by_model["house-model"]["message"]
    )
    missing = by_model["x-1"]
    assert missing["status"] == "warn" and "its cost shows as unknown" in missing["message"]
    assert "prices: {x-1: {input: USD, output: USD}}" in missing["fix"]


def test_prices_may_give_a_models_batch_and_flex_shares() -> None:
    prices = parse_prices(
        {"m": {"input": 2, "output": 8, "batch_share": 0.4}, "n": {"input": 1, "output": 1}}
    )
    assert prices["m"].tier_share("batch") == 0.4
    assert prices["m"].tier_share("flex") == 0.5  # the usual share, not the batch one
    assert prices["n"].tier_share("batch") == prices["n"].tier_share("flex") == 0.5
    assert prices["n"].tier_share("priority") == prices["n"].tier_share(None) == 1.0


@pytest.mark.parametrize("share", [0, 1.5])
def test_a_share_outside_zero_to_one_is_refused_with_what_to_write(share: float) -> None:
    with pytest.raises(ValueError, match=r"m: flex_share is a share of the list price.*0\.5"):
        parse_prices({"m": {"input": 2, "output": 8, "flex_share": share}})
