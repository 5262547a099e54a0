"""The forecast's prompt estimate (with chat template tokens) and the ratio learned from replies."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq import tokens
from aiq.calibration import PromptRatio, compare
from aiq.inputs import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, RESPONSES


def _body(**fields: object) -> bytes:
    return orjson.dumps({"model": "m", **fields})


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


@pytest.mark.parametrize(
    ("endpoint", "fields", "prompt"),
    [
        # 8 characters: 2 tokens of text, then 3 a message and 3 a request (OpenAI's cookbook).
        (CHAT, {"messages": [_user("abcdefgh")]}, 2 + 3 + 3),
        (CHAT, {"messages": [{"role": "system", "content": "abcd"}, _user("abcd")]}, 2 + 6 + 3),
        (MESSAGES, {"system": "abcd", "messages": [_user("abcd")]}, 2 + 6 + 3),  # Anthropic's
        (RESPONSES, {"input": "abcdefgh"}, 2 + 3 + 3),
        (RESPONSES, {"instructions": "abcd", "input": [_user("abcd"), _user("")]}, 2 + 9 + 3),
        (COMPLETIONS, {"prompt": "abcdefgh"}, 2),  # no chat template: the text alone
        (EMBEDDINGS, {"input": "abcdefgh"}, 2),
        (None, {"messages": [_user("abcdefgh")]}, 2),  # as the limiter books it
    ],
)
def test_the_prompt_estimate_counts_the_template_of_chat_endpoints(
    endpoint: str | None, fields: dict[str, object], prompt: int
) -> None:
    assert tokens.estimate(_body(**fields), endpoint=endpoint).prompt == prompt


@pytest.mark.slow
@given(st.lists(st.text(max_size=40), min_size=1, max_size=8))
def test_the_template_adds_3_a_message_and_3_a_request_whatever_the_text(texts: list[str]) -> None:
    body = _body(messages=[_user(t) for t in texts], max_tokens=5)
    plain = tokens.estimate(body)
    templated = tokens.estimate(body, endpoint=CHAT)
    assert templated.prompt - plain.prompt == 3 * len(texts) + 3
    assert templated.reserved == plain.reserved == 5
    assert plain.prompt == math.ceil(sum(map(len, texts)) / 4)


# Replies: (prompt text, the tokens a provider counted for it).
_replies = st.lists(
    st.tuples(st.text(min_size=1, max_size=60), st.integers(1, 500)), min_size=1, max_size=30
)


def _rows(replies: list[tuple[str, int]], model: str | None = "m") -> list:
    return [(model, CHAT, _body(messages=[_user(t)]), n) for t, n in replies]


@pytest.mark.slow
@given(_replies)
def test_the_learned_ratio_is_the_sums_ratio_and_lies_within_the_replies_own(
    replies: list[tuple[str, int]],
) -> None:
    (learned,) = compare(_rows(replies)).values()
    estimates = [tokens.estimate(b, endpoint=CHAT).prompt for _, _, b, _ in _rows(replies)]
    ratios = [n / e for (_, n), e in zip(replies, estimates, strict=True)]
    assert learned.replies == len(replies)
    assert (learned.estimated, learned.actual) == (sum(estimates), sum(n for _, n in replies))
    assert learned.highest == max(ratios)
    assert min(ratios) - 1e-9 <= learned.ratio <= max(ratios) + 1e-9
    # So the figure at the highest ratio is never below the estimate at the learned one.
    assert learned.highest * learned.estimated >= learned.actual - 1e-6


@pytest.mark.slow
@given(_replies, _replies)
def test_learning_in_two_runs_equals_learning_in_one(
    first: list[tuple[str, int]], second: list[tuple[str, int]]
) -> None:
    one = compare(_rows(first + second))["m"]
    two = compare(_rows(first))["m"].merge(compare(_rows(second))["m"])
    assert one == two


def test_each_model_learns_apart_and_replies_without_counts_are_left_out() -> None:
    rows = [
        *_rows([("abcd", 14)], "a"),  # estimate 1 + 6: x2
        *_rows([("abcd", 7)], "b"),
        *_rows([("abcd", 0)], "b"),  # no count: nothing to learn
        ("b", CHAT, b"not json", 9),  # no estimate
    ]
    learned = compare(rows)
    assert learned["a"] == PromptRatio(1, 7, 14, 2.0)
    assert learned["b"] == PromptRatio(1, 7, 7, 1.0)


@pytest.mark.parametrize(
    "value", ["", "[1, 2]", "[0, 7, 7, 1.0]", '["x", 7, 7, 1.0]', "[1, 0, 7, 1.0]", "{}"]
)
def test_a_kept_value_this_aiq_cannot_read_counts_as_nothing_learned(value: str) -> None:
    assert PromptRatio.from_json(value) is None


def test_a_kept_value_reads_back_as_written() -> None:
    ratio = PromptRatio(1_234, 10_000, 12_345, 1.58)
    assert PromptRatio.from_json(ratio.to_json()) == ratio
