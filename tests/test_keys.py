"""The dedup key: stable across key order and whitespace, different for any body change."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.inputs import Defaults, parse_line

DEFAULTS = Defaults(model="m")

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Fields with a meaning of their own (line shape, validated types) are tested elsewhere.
RESERVED = {"custom_id", "messages", "model", "prompt", "system", "body", "url", "method",
            "max_tokens", "temperature", "params", "priority"}  # fmt: skip
_field = st.text(min_size=1, max_size=10).filter(lambda k: k not in RESERVED)
_extra = st.dictionaries(
    _field,
    _json,
    max_size=4,
)
_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text()}),
    min_size=1,
    max_size=4,
)


def _shuffled(obj: object, rng: random.Random) -> object:
    """The same JSON value with every object's keys in another order."""
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(obj, list):
        return [_shuffled(v, rng) for v in obj]
    return obj


def _line(obj: object, rng: random.Random) -> bytes:
    """Serialise with random key order, indentation and separators, ASCII-escaped or not."""
    return json.dumps(
        _shuffled(obj, rng),
        indent=rng.choice([None, 0, 2]),
        separators=rng.choice([(",", ":"), (", ", ": "), (" ,", " :  ")]),
        ensure_ascii=rng.choice([True, False]),
    ).encode()


@pytest.mark.slow
@settings(max_examples=200)
@given(messages=_messages, extra=_extra, seed=st.integers(0, 2**32))
def test_key_is_stable_across_key_order_and_whitespace(
    messages: list[dict], extra: dict, seed: int
) -> None:
    obj = {"custom_id": "x", "model": "gpt", "messages": messages, **extra}
    rng = random.Random(seed)
    one = parse_line(_line(obj, rng).replace(b"\n", b" "), 1, DEFAULTS)
    two = parse_line(_line(obj, rng).replace(b"\n", b" "), 1, DEFAULTS)
    assert one.key == two.key
    assert one.body == two.body


@pytest.mark.slow
@settings(max_examples=200)
@given(messages=_messages, extra=_extra, field=_field, value=_json)
def test_key_differs_when_any_body_field_differs(
    messages: list[dict], extra: dict, field: str, value: object
) -> None:
    base = {"model": "gpt", "messages": messages, **extra}
    changed = dict(base)
    if changed.get(field, object()) == value:
        changed["model"] = "gpt-other"  # change a field that is certainly in the body
    else:
        changed[field] = value
    a = parse_line(json.dumps(base).encode(), 1, DEFAULTS)
    b = parse_line(json.dumps(changed).encode(), 1, DEFAULTS)
    assert a.key != b.key


@given(content=st.text(), other=st.text())
def test_key_ignores_custom_id_but_not_content(content: str, other: str) -> None:
    def key(custom_id: str, text: str) -> bytes:
        line = {"custom_id": custom_id, "prompt": text}
        return parse_line(json.dumps(line).encode(), 1, DEFAULTS).key

    assert key("a", content) == key("b", content)  # same request, shared call
    assert (key("a", content) == key("a", other)) == (content == other)


def test_defaults_are_part_of_the_key() -> None:
    line = b'{"prompt": "hi"}'
    assert (
        parse_line(line, 1, Defaults(model="a")).key != parse_line(line, 1, Defaults(model="b")).key
    )
    explicit = b'{"prompt": "hi", "model": "a"}'
    assert parse_line(line, 1, Defaults(model="a")).key == parse_line(explicit, 1, DEFAULTS).key
