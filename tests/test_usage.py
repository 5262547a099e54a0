"""A reply's usage read into tokens by kind, and priced kind by kind: the parser over any JSON a
server may send, and the prices against a hand computation."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.pricing import DEFAULT_PRICES, Price, parse_prices, price_for, price_table
from aiq.usage import MAX_COUNT, Usage, anthropic_usage, openai_usage

# Any JSON value, the shapes a usage object can take included.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
# A figure as a broken server may send it: a count or not.
FIGURE = (
    st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | st.booleans()
    | st.none()
    | st.text(max_size=4)
)
OPENAI_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
ANTHROPIC_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                  "cache_read_input_tokens")  # fmt: skip
PRICES = st.builds(
    Price,
    st.floats(0, 1e4),
    st.floats(0, 1e4),
    st.none() | st.floats(0, 1e4),
    st.none() | st.floats(0, 1e4),
    st.none() | st.floats(0, 1e4),
)


def _openai_shaped() -> st.SearchStrategy[dict[str, Any]]:
    details = st.dictionaries(st.sampled_from(["cached_tokens", "audio_tokens"]), FIGURE)
    outs = st.dictionaries(st.sampled_from(["reasoning_tokens", "audio_tokens"]), FIGURE)
    return st.fixed_dictionaries(
        {},
        optional={
            **{k: FIGURE for k in OPENAI_KEYS},
            "prompt_tokens_details": st.none() | details | JSON,
            "completion_tokens_details": st.none() | outs | JSON,
        },
    )


def _anthropic_shaped() -> st.SearchStrategy[dict[str, Any]]:
    split = st.dictionaries(
        st.sampled_from(["ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"]), FIGURE
    )
    return st.fixed_dictionaries(
        {},
        optional={
            **{k: FIGURE for k in ANTHROPIC_KEYS},
            "cache_creation": st.none() | split | JSON,
            "output_tokens_details": st.none() | st.fixed_dictionaries({"thinking_tokens": FIGURE}),
        },
    )


def _sound(u: Usage) -> None:
    """What every usage aiq accepts must be: counts, parts within their whole."""
    for name in Usage.__slots__:
        value = getattr(u, name)
        assert type(value) is int and 0 <= value < MAX_COUNT, (name, value)
    assert u.fresh_in >= 0
    assert u.cache_write_1h <= u.cache_write
    assert u.reasoning <= u.tokens_out


@pytest.mark.slow
@settings(max_examples=400)
@given(value=JSON | _openai_shaped() | _anthropic_shaped(), price=PRICES)
def test_any_json_is_a_sound_usage_or_none_and_never_costs_less_than_nothing(
    value: Any, price: Price
) -> None:
    for parse in (openai_usage, anthropic_usage):
        u = parse(value)
        if u is not None:
            _sound(u)
            assert price.usage_cost_usd(u) >= 0


@pytest.mark.slow
@settings(max_examples=300)
@given(usage=_openai_shaped())
def test_openai_usage_is_unusable_exactly_when_a_figure_read_is_not_a_count(
    usage: dict[str, Any],
) -> None:
    def count(v: Any) -> bool:
        return type(v) is int and 0 <= v < MAX_COUNT

    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    outs = usage.get("completion_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    reasoning = outs.get("reasoning_tokens") if isinstance(outs, dict) else None
    usable = (
        count(prompt)
        and ("completion_tokens" not in usage or count(usage["completion_tokens"]))
        and (details is None or isinstance(details, dict))
        and (outs is None or isinstance(outs, dict))
        and (cached is None or (count(cached) and cached <= prompt))
        and (reasoning is None or count(reasoning))
    )
    u = openai_usage(usage)
    assert (u is not None) == bool(usable)
    if u is not None:
        assert (u.tokens_in, u.tokens_out) == (prompt, usage.get("completion_tokens", 0))
        assert u.cached == (cached or 0)


@pytest.mark.slow
@settings(max_examples=300)
@given(usage=_anthropic_shaped())
def test_anthropic_usage_counts_every_prompt_token_or_is_unusable(usage: dict[str, Any]) -> None:
    u = anthropic_usage(usage)
    if u is None:
        return
    fresh = usage["input_tokens"]
    written = usage.get("cache_creation_input_tokens") or 0
    read = usage.get("cache_read_input_tokens") or 0
    # input_tokens leaves out the cached part: every prompt token is in tokens_in.
    assert u.tokens_in == fresh + written + read
    assert (u.cache_write, u.cache_read, u.fresh_in) == (written, read, fresh)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 10, "completion_tokens": 5}, Usage(10, 5)),
        ({"prompt_tokens": 4}, Usage(4, 0)),  # an embedding: no completion
        ({"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": None,
          "completion_tokens_details": None}, Usage(10, 5)),  # vLLM's nulls
        ({"prompt_tokens": 10, "completion_tokens": 5,
          "prompt_tokens_details": {"cached_tokens": 6},
          "completion_tokens_details": {"reasoning_tokens": 4}},
         Usage(10, 5, cached=6, reasoning=4)),
        ({"input_tokens": 10, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 2},
          "output_tokens_details": {"reasoning_tokens": 3}},
         Usage(10, 5, cached=2, reasoning=3)),  # /v1/responses
        ({"prompt_tokens": -500, "completion_tokens": 5}, None),
        ({"prompt_tokens": 10.0, "completion_tokens": 5}, None),
        ({"prompt_tokens": "10", "completion_tokens": 5}, None),
        ({"prompt_tokens": True, "completion_tokens": 5}, None),
        ({"prompt_tokens": None, "completion_tokens": 5}, None),
        ({"prompt_tokens": 10, "completion_tokens": None}, None),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}}, None),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -1}}, None),
        ({"prompt_tokens": 2**63}, None),  # beyond SQLite's integers
        ({}, None),
        (None, None),
        ([], None),
    ],
)  # fmt: skip
def test_openai_usage_table(usage: Any, expected: Usage | None) -> None:
    assert openai_usage(usage) == expected


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"input_tokens": 10, "output_tokens": 5}, Usage(10, 5)),
        ({"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 100,
          "cache_read_input_tokens": 0,
          "cache_creation": {"ephemeral_5m_input_tokens": 60, "ephemeral_1h_input_tokens": 40}},
         Usage(110, 5, cache_write=100, cache_write_1h=40)),
        ({"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": None,
          "cache_read_input_tokens": 30}, Usage(40, 5, cache_read=30)),
        ({"input_tokens": 10, "output_tokens": 50, "output_tokens_details":
          {"thinking_tokens": 20}}, Usage(10, 50, reasoning=20)),
        ({"input_tokens": -10, "output_tokens": 5}, None),
        ({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": -3}, None),
        ({"input_tokens": 10, "output_tokens": 5.5}, None),
        ({"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 1,
          "cache_creation": {"ephemeral_1h_input_tokens": 2}}, None),
        ({"output_tokens": 5}, None),
    ],
)  # fmt: skip
def test_anthropic_usage_table(usage: Any, expected: Usage | None) -> None:
    assert anthropic_usage(usage) == expected


def test_each_kind_is_priced_at_its_own_rate() -> None:
    price = Price(2.0, 8.0, cached_input_per_m=0.5, cache_write_per_m=3.0, cache_read_per_m=0.3)
    u = Usage(1000, 300, cached=100, cache_write=200, cache_write_1h=50, cache_read=400,
              reasoning=120)  # fmt: skip
    # fresh 1000-100-200-400 = 300 at 2; cached 100 at 0.5; 5-minute writes 150 at 3; 1-hour
    # writes 50 at 2 x 2; reads 400 at 0.3; output 300 (reasoning in it) at 8.
    by_hand = (300 * 2 + 100 * 0.5 + 150 * 3 + 50 * 4 + 400 * 0.3 + 300 * 8) / 1e6
    assert math.isclose(price.usage_cost_usd(u), by_hand, rel_tol=1e-12)
    # Without cache rates: cached input half the input price, writes 1.25x, reads 0.1x.
    plain = Price(2.0, 8.0)
    by_hand = (300 * 2 + 100 * 1.0 + 150 * 2.5 + 50 * 4 + 400 * 0.2 + 300 * 8) / 1e6
    assert math.isclose(plain.usage_cost_usd(u), by_hand, rel_tol=1e-12)


def test_a_config_price_without_cache_rates_takes_the_tables_share_of_its_input_price() -> None:
    table = price_table(parse_prices({
        "gpt-4.1": {"input": 1.0, "output": 4.0},  # half the list price: cached half of 0.50
        "gpt-4o-mini": {"input": 0.15, "output": 0.6, "cached_input": 0.01},
        "claude-sonnet-4-5": {"input": 3, "output": 15, "cache_read": 0.2},
        "house": {"input": 1, "output": 2},
    }))  # fmt: skip
    assert DEFAULT_PRICES["gpt-4.1"].cached_input_per_m == 0.50
    assert table["gpt-4.1"].cached_input_per_m == pytest.approx(0.25)
    assert table["gpt-4o-mini"].cached_input_per_m == 0.01
    sonnet = table["claude-sonnet-4-5"]
    assert (sonnet.cache_read_per_m, sonnet.cache_write_per_m) == (0.2, pytest.approx(3.75))
    assert table["house"] == Price(1.0, 2.0)  # the provider's usual shares, at pricing time
    # A dated snapshot configured on its own takes its family's shares.
    snap = price_table(parse_prices({"gpt-4o-2024-08-06": {"input": 5, "output": 20}}))
    assert snap["gpt-4o-2024-08-06"].cached_input_per_m == pytest.approx(2.5)
    assert price_for("gpt-4o-2024-11-20", snap) == DEFAULT_PRICES["gpt-4o"]
