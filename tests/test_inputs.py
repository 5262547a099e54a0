"""The input reader: the three line shapes, defaults, every way a line is rejected, the job key,
and resuming after a prefix an earlier read went through."""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.errors import InputError
from aiq.idset import IdSet
from aiq.inputs import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    BadLine,
    Defaults,
    Request,
    canonical,
    job_key,
    parse_line,
)
from aiq.requestfile import read_requests

M = Defaults(model="m")


def write(tmp_path: Path, *lines: str | bytes, name: str = "in.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join(x if isinstance(x, bytes) else x.encode() + b"\n" for x in lines))
    return path


def read(path: Path, defaults: Defaults = M) -> list[Request | BadLine]:
    return list(read_requests(path, defaults))


def only(path: Path, defaults: Defaults = M) -> Request | BadLine:
    (item,) = read(path, defaults)
    return item


def body(req: Request | BadLine) -> dict:
    assert isinstance(req, Request), req
    return orjson.loads(req.body)


# -- the three shapes -----------------------------------------------------------------------


def test_prompt_shape_becomes_one_user_message(tmp_path: Path) -> None:
    req = only(write(tmp_path, '{"custom_id": "a", "prompt": "hi"}'))
    assert isinstance(req, Request)
    assert (req.custom_id, req.endpoint, req.line_no) == ("a", CHAT, 1)
    assert body(req) == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_prompt_shape_with_system_and_body_fields(tmp_path: Path) -> None:
    line = '{"prompt": "hi", "system": "be brief", "model": "x", "max_tokens": 5, "seed": 1}'
    assert body(only(write(tmp_path, line))) == {
        "model": "x",
        "max_tokens": 5,
        "seed": 1,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
        ],
    }


def test_chat_shape_keeps_messages_and_fields(tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    line = json.dumps({"custom_id": "c", "messages": msgs, "top_p": 0.5})
    assert body(only(write(tmp_path, line))) == {"model": "m", "messages": msgs, "top_p": 0.5}


def test_batch_api_shape_uses_url_and_body(tmp_path: Path) -> None:
    line = {"custom_id": "b", "method": "POST", "url": EMBEDDINGS, "body": {"input": "x"}}
    req = only(write(tmp_path, json.dumps(line)))
    assert isinstance(req, Request)
    assert req.endpoint == EMBEDDINGS
    assert body(req) == {"input": "x", "model": "m"}


def test_completions_endpoint(tmp_path: Path) -> None:
    line = {"custom_id": "b", "url": COMPLETIONS, "body": {"prompt": "x", "model": "y"}}
    req = only(write(tmp_path, json.dumps(line)), Defaults(model="m", max_tokens=9))
    assert isinstance(req, Request)
    assert req.endpoint == COMPLETIONS
    assert body(req) == {"prompt": "x", "model": "y"}  # a complete request: no max_tokens added


def test_request_keeps_the_stripped_original_line(tmp_path: Path) -> None:
    raw = '  {"custom_id": "a",   "prompt": "hi"}  '
    req = only(write(tmp_path, raw))
    assert isinstance(req, Request)
    assert req.line == raw.strip().encode()


def test_missing_custom_id_is_the_line_number(tmp_path: Path) -> None:
    lines = ['{"prompt": "hi"}', "", '{ "prompt" : "hi" }', '{"prompt": "ho"}']
    a, b, c = read(write(tmp_path, *lines))
    assert isinstance(a, Request) and isinstance(b, Request) and isinstance(c, Request)
    assert a.derived_id and (a.custom_id, b.custom_id, c.custom_id) == (
        "line-1",
        "line-3",
        "line-4",
    )
    assert a.key == b.key != c.key  # the same request: one call, a result line each


def test_custom_id_null_counts_as_missing(tmp_path: Path) -> None:
    req = only(write(tmp_path, '{"custom_id": null, "prompt": "hi"}'))
    assert isinstance(req, Request) and req.derived_id


# -- defaults -------------------------------------------------------------------------------


def test_defaults_fill_only_what_the_line_leaves_out(tmp_path: Path) -> None:
    d = Defaults(model="dm", max_tokens=100, temperature=0.2)
    path = write(
        tmp_path,
        '{"prompt": "a"}',
        '{"prompt": "b", "model": "x", "max_tokens": 3, "temperature": 1}',
    )
    first, second = (body(r) for r in read(path, d))
    assert (first["model"], first["max_tokens"], first["temperature"]) == ("dm", 100, 0.2)
    assert (second["model"], second["max_tokens"], second["temperature"]) == ("x", 3, 1)


def test_no_token_or_temperature_defaults_for_embeddings(tmp_path: Path) -> None:
    line = json.dumps({"url": EMBEDDINGS, "body": {"input": "x"}})
    d = Defaults(model="e", max_tokens=100, temperature=0.2, system="s")
    assert body(only(write(tmp_path, line), d)) == {"input": "x", "model": "e"}


def test_system_default_only_when_no_system_message(tmp_path: Path) -> None:
    d = Defaults(model="m", system="house style")
    lines = [
        '{"prompt": "a"}',
        '{"prompt": "b", "system": "mine"}',
        '{"messages": [{"role": "system", "content": "own"}, {"role": "user", "content": "c"}]}',
        '{"messages": [{"role": "user", "content": "d"}]}',
    ]
    roles = [
        [(m["role"], m["content"]) for m in body(r)["messages"]]
        for r in read(write(tmp_path, *lines), d)
    ]
    assert roles == [
        [("system", "house style"), ("user", "a")],
        [("system", "mine"), ("user", "b")],
        [("system", "own"), ("user", "c")],
        [("system", "house style"), ("user", "d")],
    ]


def test_system_default_not_applied_to_completions(tmp_path: Path) -> None:
    line = json.dumps({"url": COMPLETIONS, "body": {"prompt": "x"}})
    assert "messages" not in body(only(write(tmp_path, line), Defaults(model="m", system="s")))


# -- invalid lines --------------------------------------------------------------------------

BAD_LINES = [
    ('{"prompt": ', "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got an array"),
    ('"text"', "expected a JSON object, got a string"),
    ("42", "expected a JSON object, got a number"),
    ("null", "expected a JSON object, got null"),
    ('{"model": "m"}', "no 'messages', 'prompt' or 'body'"),
    (
        '{"custom_id": 7, "prompt": "x"}',
        "field 'custom_id': expected a non-empty string, got a number",
    ),
    (
        '{"custom_id": "", "prompt": "x"}',
        "field 'custom_id': expected a non-empty string, got a string",
    ),
    (
        '{"custom_id": ["a"], "prompt": "x"}',
        "field 'custom_id': expected a non-empty string, got an array",
    ),
    ('{"prompt": 5}', "field 'prompt': expected a string, got a number"),
    ('{"prompt": "x", "system": null}', "field 'system': expected a string, got null"),
    (
        '{"prompt": "x", "max_tokens": "10"}',
        "field 'max_tokens': expected an integer, got a string",
    ),
    ('{"prompt": "x", "max_tokens": 1.5}', "field 'max_tokens': expected an integer, got a number"),
    (
        '{"prompt": "x", "max_tokens": true}',
        "field 'max_tokens': expected an integer, got a boolean",
    ),
    (
        '{"prompt": "x", "temperature": "hot"}',
        "field 'temperature': expected a number, got a string",
    ),
    ('{"prompt": "x", "model": 3}', "field 'model': expected a string, got a number"),
    ('{"messages": "hi"}', "field 'messages': expected a non-empty array of messages"),
    ('{"messages": []}', "field 'messages': expected a non-empty array of messages"),
    ('{"messages": [1]}', "field messages[0]: expected an object with a string 'role'"),
    (
        '{"messages": [{"content": "x"}]}',
        "field messages[0]: expected an object with a string 'role'",
    ),
    ('{"url": "/v1/chat/completions"}', "field 'body': missing"),
    ('{"url": "/v1/x", "body": {}}', "field 'url': '/v1/x' is not one of"),
    ('{"url": "/v1/embeddings", "body": []}', "field 'body': expected an object, got an array"),
    ('{"url": "/v1/embeddings", "method": "GET", "body": {"input": "x"}}', "only POST"),
    (
        '{"url": "/v1/embeddings", "body": {"input": "x"}, "prompt": "y"}',
        "field 'prompt': not allowed",
    ),
    ('{"url": "/v1/chat/completions", "body": {}}', "field 'body.messages': expected a non-empty"),
    ('{"url": "/v1/completions", "body": {"model": "m"}}', "field 'body.prompt': missing"),
    ('{"url": "/v1/embeddings", "body": {"model": "m"}}', "field 'body.input': missing"),
    ('{"url": "/v1/responses", "body": {"model": "m"}}', "field 'body.input': missing"),
    (
        '{"url": "/v1/responses", "body": {"input": "x", "max_output_tokens": "9"}}',
        "field 'max_output_tokens': expected an integer",
    ),
    ('{"prompt": "x", "temperature": NaN}', "not valid JSON"),
    ('{"prompt": "x", "temperature": Infinity}', "not valid JSON"),
    ('{"prompt": "x", "temperature": -Infinity}', "not valid JSON"),
    ('{"prompt": "x", "temperature": 1e999}', "not valid JSON"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_invalid_line_reports_file_line_and_reason(tmp_path: Path, line: str, reason: str) -> None:
    path = write(tmp_path, '{"prompt": "before"}', "", line, '{"prompt": "after"}')
    before, bad, after = read(path)
    assert isinstance(before, Request) and isinstance(after, Request)
    assert isinstance(bad, BadLine)
    assert (bad.path, bad.line_no) == (str(path), 3)
    assert reason in bad.reason
    assert str(bad).startswith(f"{path}:3: ")
    assert (before.line_no, after.line_no) == (1, 4)


def test_missing_model_without_a_default(tmp_path: Path) -> None:
    bad = only(write(tmp_path, '{"prompt": "x"}'), Defaults())
    assert isinstance(bad, BadLine) and "field 'model': missing" in bad.reason


def test_invalid_utf8_is_a_bad_line(tmp_path: Path) -> None:
    path = write(tmp_path, b'{"prompt": "caf\xe9"}\n', b'{"prompt": "ok"}\n')
    bad, good = read(path)
    assert isinstance(bad, BadLine) and "not valid JSON" in bad.reason and bad.line_no == 1
    assert isinstance(good, Request)


def test_duplicate_custom_id_rejects_the_later_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"custom_id": "a", "prompt": "1"}',
        '{"custom_id": "b", "prompt": "2"}',
        '{"custom_id": "a", "prompt": "3"}',
    )
    first, _, dup = read(path)
    assert isinstance(first, Request) and body(first)["messages"][0]["content"] == "1"
    assert isinstance(dup, BadLine) and dup.line_no == 3
    assert dup.reason == "custom_id 'a' appears twice"


def test_an_invalid_line_does_not_claim_its_custom_id(tmp_path: Path) -> None:
    path = write(tmp_path, '{"custom_id": "a", "prompt": 1}', '{"custom_id": "a", "prompt": "ok"}')
    bad, good = read(path)
    assert isinstance(bad, BadLine) and isinstance(good, Request)


# -- file framing ---------------------------------------------------------------------------


def test_bom_crlf_and_blank_lines(tmp_path: Path) -> None:
    a_line, b_line = b'{"custom_id": "a", "prompt": "x"}', b'{"custom_id": "b", "prompt": "y"}'
    data = b"\xef\xbb\xbf" + a_line + b"\r\n\r\n   \n" + b_line + b"\r\n"
    a, b = read(write(tmp_path, data))
    assert isinstance(a, Request) and isinstance(b, Request)
    assert (a.line_no, b.line_no) == (1, 4)
    assert (a.line, b.line) == (a_line, b_line)


def test_last_line_without_newline(tmp_path: Path) -> None:
    _, b = read(write(tmp_path, b'{"prompt": "x"}\n{"prompt": "y"}'))
    assert isinstance(b, Request) and b.line_no == 2


def test_line_longer_than_a_read_block(tmp_path: Path) -> None:
    long = "x" * (3 << 20)
    a, b = read(write(tmp_path, json.dumps({"prompt": long}), '{"prompt": "short"}'))
    assert body(a)["messages"][0]["content"] == long and isinstance(b, Request)


def test_unreadable_files_raise_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="is a directory"):
        read(tmp_path)


# -- the dedup key --------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Body fields the reader does not interpret (the shape and defaulted ones are tested above).
_SPECIAL = {"custom_id", "prompt", "system", "messages", "model", "body", "url", "params"}
_SPECIAL |= {"max_tokens", "temperature", "priority"}  # (aiq's own: read, not sent)
extra_fields = st.dictionaries(
    st.text(min_size=1, max_size=10).filter(lambda k: k not in _SPECIAL), json_values, max_size=4
)


def _dump_shuffled(obj: dict, rng: random.Random, spaced: bool) -> str:
    """The same JSON object with its keys in another order and other whitespace."""
    items = list(obj.items())
    rng.shuffle(items)
    sep = (" , ", " :  ") if spaced else (",", ":")
    return json.dumps(dict(items), separators=sep)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(prompt=st.text(max_size=30), extra=extra_fields, seed=st.integers(0, 2**32))
def test_key_ignores_key_order_and_whitespace(prompt: str, extra: dict, seed: int) -> None:
    line = {"custom_id": "c", "prompt": prompt, **extra}
    rng = random.Random(seed)
    a = parse_line(_dump_shuffled(line, rng, False).encode(), 1, M)
    b = parse_line(("  " + _dump_shuffled(line, rng, True) + "\t").strip().encode(), 1, M)
    assert a.key == b.key and a.body == b.body


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(prompt=st.text(max_size=30), extra=extra_fields, data=st.data())
def test_key_changes_when_any_body_field_changes(
    prompt: str, extra: dict, data: st.DataObject
) -> None:
    line = {"prompt": prompt, **extra}
    field = data.draw(st.sampled_from(sorted(line)))
    new_value = data.draw(
        json_values.filter(lambda v: v != line[field] or type(v) is not type(line[field]))
    )
    if field == "prompt":
        new_value = data.draw(st.text(max_size=30).filter(lambda t: t != prompt))
    changed = {**line, field: new_value}
    a = parse_line(json.dumps(line).encode(), 1, M)
    b = parse_line(json.dumps(changed).encode(), 1, M)
    if orjson.loads(a.body) != orjson.loads(b.body):  # 1 and 1.0 are one JSON number
        assert a.key != b.key


def test_key_depends_on_endpoint_and_is_tagged() -> None:
    data = canonical({"model": "m", "prompt": "x"})
    assert job_key(CHAT, data) != job_key(COMPLETIONS, data)
    assert len(job_key(CHAT, data)) == 32
    assert canonical({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()


def test_key_ignores_custom_id(tmp_path: Path) -> None:
    a, b = read(
        write(tmp_path, '{"custom_id": "a", "prompt": "x"}', '{"custom_id": "b", "prompt": "x"}')
    )
    assert isinstance(a, Request) and isinstance(b, Request)
    assert a.key == b.key and a.id_hash != b.id_hash


# -- resuming after a prefix ----------------------------------------------------------------


def test_read_after_an_unchanged_prefix_yields_only_new_lines(tmp_path: Path) -> None:
    path = write(tmp_path, '{"custom_id": "a", "prompt": "1"}', "not json", "")
    first = read_requests(path, M)
    list(first)
    assert first.prefix is not None
    assert (first.prefix.lines, first.prefix.valid, first.prefix.bad[0][0]) == (3, 1, 2)
    with path.open("ab") as f:
        f.write(b'{"custom_id": "b", "prompt": "2"}\n{"custom_id": "a", "prompt": "again"}\n')
    second = read_requests(path, M)
    items = list(second.read(after=first.prefix))
    assert second.skipped == first.prefix
    b, dup = items
    assert isinstance(b, Request) and (b.custom_id, b.line_no) == ("b", 4)
    assert isinstance(dup, BadLine) and dup.line_no == 5 and "appears twice" in dup.reason
    assert second.prefix is not None and second.prefix.valid == 2 and len(second.prefix.bad) == 2


def test_a_changed_prefix_or_other_defaults_read_everything(tmp_path: Path) -> None:
    path = write(tmp_path, '{"prompt": "1"}', '{"prompt": "2"}')
    first = read_requests(path, M)
    list(first)
    assert first.prefix is not None
    other = read_requests(path, Defaults(model="other"))
    assert len(list(other.read(after=first.prefix))) == 2 and other.skipped is None
    path.write_bytes(b'{"prompt": "0"}\n{"prompt": "2"}\n{"prompt": "3"}\n')
    changed = read_requests(path, M)
    assert len(list(changed.read(after=first.prefix))) == 3 and changed.skipped is None


def test_an_unterminated_last_line_stays_out_of_the_prefix(tmp_path: Path) -> None:
    # A writer may still be appending: the last line is read, but not remembered as read.
    path = write(tmp_path, b'{"custom_id": "a", "prompt": "1"}\n{"custom_id": "b", "prompt": "2"}')
    first = read_requests(path, M)
    assert [r.custom_id for r in first if isinstance(r, Request)] == ["a", "b"]
    assert first.prefix is not None and (first.prefix.lines, first.prefix.valid) == (1, 1)
    with path.open("ab") as f:
        f.write(b'\n{"custom_id": "c", "prompt": "3"')
    second = read_requests(path, M)
    b, c = second.read(after=first.prefix)
    assert isinstance(b, Request) and (b.custom_id, b.line_no) == ("b", 2)  # not "twice"
    assert isinstance(c, BadLine) and c.line_no == 3  # half written
    assert second.prefix is not None and (second.prefix.lines, second.prefix.bad) == (2, [])


# -- IdSet ----------------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=8, max_size=8), max_size=300), st.data())
def test_idset_behaves_like_a_set(keys: list[bytes], data: st.DataObject) -> None:
    ids, model = IdSet(), set()
    for k in keys:
        assert ids.add(k) == (k not in model)
        model.add(k)
    assert len(ids) == len(model)
    restored = IdSet.from_bytes(ids.to_bytes())
    assert len(restored) == len(model) and all(k in restored for k in model)
    if model:
        gone = data.draw(st.sampled_from(sorted(model)))
        restored.discard(gone)
        assert gone not in restored and len(restored) == len(model) - 1


def test_idset_ignores_matches_across_entries() -> None:
    # Two entries of bucket (1, 2) whose bytes, read across the boundary, spell a third key.
    first = bytes([1, 2, 9, 9, 9, 9, 1, 2])
    second = bytes([1, 2, 5, 6, 7, 8, 0, 0])
    straddling = first[6:] + second[:6]
    ids = IdSet()
    assert ids.add(first) and ids.add(second)
    assert straddling not in ids
    assert ids.add(straddling) and straddling in ids and len(ids) == 3
    ids.discard(straddling)
    assert first in ids and second in ids and len(ids) == 2


def test_responses_lines_take_only_the_model_default(tmp_path: Path) -> None:
    line = '{"url": "/v1/responses", "body": {"input": "hi"}}'
    d = Defaults(model="m", max_tokens=64, temperature=0.5, system="be brief")
    req = only(write(tmp_path, line), d)
    assert isinstance(req, Request) and req.endpoint == "/v1/responses"
    assert json.loads(req.body) == {"model": "m", "input": "hi"}
