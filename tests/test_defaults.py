"""Config defaults (model, max_tokens, temperature, system): added only where a line leaves the
thing out in every spelling, only where the model takes it, never to complete requests; counted
for `add` and `--dry-run`. And lines without a custom_id: named line-N."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq.inputs import (
    APPLIED_MAX_COMPLETION_TOKENS,
    APPLIED_MAX_TOKENS,
    APPLIED_MODEL,
    APPLIED_SYSTEM,
    APPLIED_TEMPERATURE,
    MASKS,
    WITHHELD_TEMPERATURE,
    BadLine,
    Defaults,
    Request,
    count_defaults,
    is_reasoning_model,
    parse_line,
)
from aiq.requestfile import read_requests

ALL = Defaults(model="gpt-4o-mini", max_tokens=100, temperature=0.2, system="Be brief.")
USER = {"role": "user", "content": "hi"}
SYS = {"role": "system", "content": "Be brief."}

# (the line, what its body becomes under ALL, which defaults it took)
CASES: list[tuple[dict[str, Any], dict[str, Any], int]] = [
    (  # a prompt line takes every default
        {"prompt": "hi"},
        {"model": "gpt-4o-mini", "max_tokens": 100, "temperature": 0.2, "messages": [SYS, USER]},
        APPLIED_MODEL | APPLIED_MAX_TOKENS | APPLIED_TEMPERATURE | APPLIED_SYSTEM,
    ),
    (  # its own ceiling, under the newer name: no max_tokens beside it
        {"messages": [USER], "max_completion_tokens": 5},
        {"model": "gpt-4o-mini", "max_completion_tokens": 5, "temperature": 0.2,
         "messages": [SYS, USER]},
        APPLIED_MODEL | APPLIED_TEMPERATURE | APPLIED_SYSTEM,
    ),
    (  # a developer message is the system prompt under another name
        {"messages": [{"role": "developer", "content": "mine"}, USER], "model": "m"},
        {"model": "m", "max_tokens": 100, "temperature": 0.2,
         "messages": [{"role": "developer", "content": "mine"}, USER]},
        APPLIED_MAX_TOKENS | APPLIED_TEMPERATURE,
    ),
    (  # a system message anywhere, not only first
        {"messages": [USER, {"role": "system", "content": "later"}], "model": "m",
         "max_tokens": 1, "temperature": 1},
        {"model": "m", "max_tokens": 1, "temperature": 1,
         "messages": [USER, {"role": "system", "content": "later"}]},
        0,
    ),
    (  # the prompt line's own system
        {"prompt": "hi", "system": "mine", "model": "m"},
        {"model": "m", "max_tokens": 100, "temperature": 0.2,
         "messages": [{"role": "system", "content": "mine"}, USER]},
        APPLIED_MAX_TOKENS | APPLIED_TEMPERATURE,
    ),
    (  # a reasoning model: max_completion_tokens, and no temperature
        {"prompt": "hi", "model": "o4-mini"},
        {"model": "o4-mini", "max_completion_tokens": 100, "messages": [SYS, USER]},
        APPLIED_MAX_COMPLETION_TOKENS | WITHHELD_TEMPERATURE | APPLIED_SYSTEM,
    ),
    (  # gpt-5.1 with reasoning_effort none takes a temperature
        {"prompt": "hi", "model": "gpt-5.1", "reasoning_effort": "none"},
        {"model": "gpt-5.1", "reasoning_effort": "none", "max_completion_tokens": 100,
         "temperature": 0.2, "messages": [SYS, USER]},
        APPLIED_MAX_COMPLETION_TOKENS | APPLIED_TEMPERATURE | APPLIED_SYSTEM,
    ),
    (  # the line's own max_tokens is the line's business, reasoning model or not
        {"prompt": "hi", "model": "o3", "max_tokens": 7},
        {"model": "o3", "max_tokens": 7, "messages": [SYS, USER]},
        WITHHELD_TEMPERATURE | APPLIED_SYSTEM,
    ),
    (  # a Batch API line is a complete request: the model at most
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [USER]}},
        {"model": "gpt-4o-mini", "messages": [USER]},
        APPLIED_MODEL,
    ),
    (
        {"url": "/v1/chat/completions", "body": {"model": "x", "messages": [USER]}},
        {"model": "x", "messages": [USER]},
        0,
    ),
    (
        {"url": "/v1/responses", "body": {"input": "hi"}},
        {"model": "gpt-4o-mini", "input": "hi"},
        APPLIED_MODEL,
    ),
    (
        {"url": "/v1/completions", "body": {"prompt": "hi", "model": "x"}},
        {"model": "x", "prompt": "hi"},
        0,
    ),
    (
        {"url": "/v1/embeddings", "body": {"input": "hi"}},
        {"model": "gpt-4o-mini", "input": "hi"},
        APPLIED_MODEL,
    ),
    (  # so is a Message Batches line (Anthropic's max_tokens comes at send time, if missing)
        {"custom_id": "a", "params": {"model": "claude-x", "messages": [USER]}},
        {"model": "claude-x", "messages": [USER]},
        0,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected", "applied"), CASES)
def test_defaults_fill_only_what_the_line_leaves_out_in_every_spelling(
    line: dict[str, Any], expected: dict[str, Any], applied: int
) -> None:
    req = parse_line(json.dumps(line).encode(), 1, ALL)
    assert orjson.loads(req.body) == expected
    assert req.applied == applied


@pytest.mark.parametrize(
    ("model", "reasoning"),
    [
        ("o1", True), ("o1-mini", True), ("o3", True), ("o3-pro-2025-06-10", True),
        ("o4-mini", True), ("gpt-5", True), ("gpt-5-mini", True), ("gpt-5-nano", True),
        ("gpt-5.1", True), ("gpt-5.2-pro", True), ("gpt-5-codex", True),
        ("codex-mini-latest", True),
        ("openai/o3-mini", True), ("ft:o4-mini-2025-04-16:org::abc", True),
        ("gpt-5-chat-latest", False), ("gpt-4o", False), ("gpt-4.1-mini", False),
        ("omni-moderation-latest", False), ("o", False), ("claude-sonnet-4-5", False),
        ("llama-3-70b", False), ("gpt-4o-mini", False),
    ],
)  # fmt: skip
def test_reasoning_models_are_told_apart_by_name(model: str, reasoning: bool) -> None:
    assert is_reasoning_model(model) is reasoning


@pytest.mark.slow
@given(
    line=st.fixed_dictionaries(
        {"prompt": st.text(max_size=5)},
        optional={
            "model": st.sampled_from(["gpt-4o", "o3", "gpt-5", "gpt-5-chat-latest"]),
            "max_tokens": st.integers(1, 9),
            "max_completion_tokens": st.integers(1, 9),
            "temperature": st.sampled_from([0, 0.5, 1]),
            "system": st.text(max_size=5),
            "reasoning_effort": st.sampled_from(["none", "low"]),
        },
    ),
    d=st.builds(
        Defaults,
        model=st.sampled_from(["gpt-4o", "o4-mini"]),
        max_tokens=st.none() | st.integers(1, 999),
        temperature=st.none() | st.floats(0, 2),
        system=st.none() | st.text(min_size=1, max_size=5),
    ),
)
def test_a_line_never_says_a_thing_twice_nor_what_its_model_refuses(
    line: dict[str, Any], d: Defaults
) -> None:
    body = orjson.loads(parse_line(json.dumps(line).encode(), 1, d).body)
    for name, value in line.items():  # the line's own fields are never changed
        if name not in ("prompt", "system"):
            assert body[name] == value
    assert (
        "max_tokens" not in body
        or "max_completion_tokens" not in body
        or ("max_tokens" in line and "max_completion_tokens" in line)
    )
    roles = [m["role"] for m in body["messages"]]
    assert roles.count("system") + roles.count("developer") <= 1
    if is_reasoning_model(body["model"]):
        assert "max_tokens" not in body or "max_tokens" in line
        assert (
            "temperature" not in body
            or "temperature" in line
            or (line.get("reasoning_effort") == "none")
        )


def test_counts_name_each_default_and_the_lines_that_took_it() -> None:
    masks = [0] * MASKS
    masks[APPLIED_MODEL | APPLIED_MAX_TOKENS] = 3
    masks[APPLIED_MODEL] = 2
    masks[APPLIED_MAX_COMPLETION_TOKENS | WITHHELD_TEMPERATURE] = 1
    assert count_defaults(masks) == {
        "model": 5,
        "max_tokens": 3,
        "max_tokens (as max_completion_tokens)": 1,
        "temperature withheld": 1,
    }


def test_the_reader_counts_the_defaults_of_the_whole_file_resumed_or_not(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b", "model": "o3"}\n')
    d = Defaults(model="m", max_tokens=5, temperature=0.3)
    first = read_requests(path, d)
    list(first)
    want = {"model": 1, "max_tokens": 1, "temperature": 1,
            "max_tokens (as max_completion_tokens)": 1, "temperature withheld": 1}  # fmt: skip
    assert count_defaults(first.applied) == want
    with path.open("a") as f:
        f.write('{"prompt": "c"}\n{"prompt": "d", "model": "x"}')  # the last line unterminated
    again = read_requests(path, d)
    assert len(list(again.read(after=first.prefix))) == 2 and again.skipped is not None
    want = {"model": 2, "max_tokens": 3, "temperature": 3,
            "max_tokens (as max_completion_tokens)": 1, "temperature withheld": 1}  # fmt: skip
    assert count_defaults(again.applied) == want


# -- lines without a custom_id ---------------------------------------------------------------


def test_a_custom_id_like_a_line_name_cannot_take_another_lines_place(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "a"}\n'  # line-1
        '{"custom_id": "line-1", "prompt": "b"}\n'  # taken by line 1
        '{"custom_id": "line-4", "prompt": "c"}\n'
        '{"prompt": "d"}\n'  # would be line-4: taken by line 3
    )
    a, b, c, d = read_requests(path, Defaults(model="m"))
    assert isinstance(a, Request) and a.custom_id == "line-1"
    assert (
        isinstance(b, BadLine) and "'line-1' appears twice (lines without a custom_id" in b.reason
    )
    assert isinstance(c, Request) and c.custom_id == "line-4"
    assert isinstance(d, BadLine) and "no custom_id, and 'line-4'" in d.reason
    assert "give this line a custom_id" in d.reason
