"""`aiq replay-dead --set`: dead jobs sent again with body fields changed, as new requests,
one result line per custom_id (real `aiq` subprocesses, a real fake server, real SQLite);
and the parsing of --set and the refusal of a change that makes a body invalid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import API_KEY, read_jsonl, run_aiq
from fakeserver import FakeServer
from hypothesis import given
from hypothesis import strategies as st

from aiq.errors import UsageError
from aiq.inputs import CHAT, MESSAGES, canonical, job_key
from aiq.overrides import parse_sets, rebuild


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        (["max_tokens=2048"], {"max_tokens": 2048}),
        (["model=gpt-4o"], {"model": "gpt-4o"}),  # not JSON: the text
        (['stop="2048"'], {"stop": "2048"}),  # JSON text
        (["temperature=0.5", "seed=null"], {"temperature": 0.5, "seed": None}),
        (['response_format={"type": "json_object"}'], {"response_format": {"type": "json_object"}}),
        (["user=a=b"], {"user": "a=b"}),  # split at the first =
        (["stream=false"], {"stream": False}),
    ],
)
def test_set_values_are_json_else_text(given: list[str], parsed: dict[str, Any]) -> None:
    assert parse_sets(given) == parsed


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@given(name=st.from_regex(r"[a-z_]{1,12}", fullmatch=True), value=_JSON)
def test_any_json_value_comes_back_as_given(name: str, value: Any) -> None:
    if name not in ("priority", "custom_id"):
        assert parse_sets([f"{name}={orjson.dumps(value).decode()}"]) == {name: value}


@given(text=st.text())
def test_text_that_is_not_json_is_taken_as_it_is(text: str) -> None:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        assert parse_sets([f"stop={text}"]) == {"stop": text}


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (["max_tokens"], "--set 'max_tokens': expected FIELD=VALUE"),
        (["=5"], "--set '=5': expected FIELD=VALUE"),
        (["priority=5"], "--set 'priority=5': priority is aiq's, not a field of the request body"),
        (["model=a", "model=b"], "--set model: given twice, as 'a' and 'b'"),
    ],
)
def test_a_bad_set_is_refused_saying_what_to_write(given: list[str], says: str) -> None:
    with pytest.raises(UsageError, match="^" + says.replace("(", r"\(")):
        parse_sets(given)


def _job(endpoint: str, body: dict[str, Any]) -> tuple[int, int, int, str, bytes]:
    return (7, 1, 3, endpoint, canonical(body))


def test_a_rebuilt_body_is_a_new_request_keeping_the_priority() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
    r = rebuild({"max_tokens": 2048, "temperature": None}, _job(CHAT, body), "job 7")
    assert json.loads(r.body) == {**body, "max_tokens": 2048}
    assert r.key == job_key(CHAT, r.body) != job_key(CHAT, canonical(body))
    assert (r.priority, r.changed) == (3, ("max_tokens",))  # temperature was not there


@pytest.mark.parametrize(
    ("endpoint", "sets", "says"),
    [
        (CHAT, {"max_tokens": "lots"}, "field 'max_tokens': expected an integer, got a string"),
        (CHAT, {"model": None}, "field 'model': missing"),
        (CHAT, {"messages": []}, "field 'body.messages': expected a non-empty array"),
        (MESSAGES, {"messages": "hi"}, "field 'params.messages': expected a non-empty array"),
        (CHAT, {"temperature": True}, "field 'temperature': expected a number, got a boolean"),
    ],
)
def test_a_change_making_a_body_invalid_is_refused_with_the_reason(
    endpoint: str, sets: dict[str, Any], says: str
) -> None:
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(UsageError) as caught:
        rebuild(sets, _job(endpoint, body), "custom_id 'q1'")
    assert "would make the request of custom_id 'q1' invalid: " + says in str(caught.value)
    assert str(caught.value).endswith("nothing was replayed")


@pytest.mark.slow
def test_replay_with_set_gives_one_result_line_per_custom_id_the_new_reply(
    tmp_path: Path,
) -> None:
    lines = [{"custom_id": f"ok{i}", "prompt": f"fine {i}"} for i in range(3)]
    lines += [{"custom_id": f"down{i}", "prompt": f"x {i}", "model": "broken"} for i in range(3)]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "aiq.yaml").write_text("backoff_base_s: 0.01\nbackoff_cap_s: 0.02\n")
    with FakeServer(require_key=API_KEY, status_for_model={"broken": 500}) as server:
        args = ("--base-url", server.base_url, "--max-attempts", "2")
        ran = run_aiq("run", "b.jsonl", "--model", "m", *args, cwd=tmp_path)
        assert ran.returncode == 1, ran.stderr

        dry = run_aiq("replay-dead", "--dry-run", "--set", "model=m", "--set", "max_tokens=64",
                      cwd=tmp_path)  # fmt: skip
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.splitlines() == [
            "would replay 3 dead jobs; nothing was changed",
            '  model: set to "m" in 3 bodies',
            "  max_tokens: set to 64 in 3 bodies",
        ]
        bad = run_aiq("replay-dead", "--set", "max_tokens=lots", cwd=tmp_path)
        assert bad.returncode == 2 and "field 'max_tokens': expected an integer" in bad.stderr
        status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)["counts"]
        assert (status["dead"], status["queued"]) == (3, 0)  # neither changed anything

        # One id alone first: the others stay dead.
        one = run_aiq("replay-dead", "--id", "down0", "--set", "model=m", cwd=tmp_path)
        assert one.returncode == 0, one.stderr
        assert one.stdout.startswith('replayed 1 dead job as 1 request with model="m"; run')
        every = run_aiq("replay-dead", "--error", "server", "--set", "model=m",
                        "--set", "max_tokens=64", cwd=tmp_path)  # fmt: skip
        assert every.returncode == 0, every.stderr
        assert every.stdout.startswith("replayed 2 dead jobs as 2 requests")
        before = len(server.requests)
        resumed = run_aiq("resume", *args, cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        sent = [r.body for r in server.requests[before:]]

    assert sorted(b["messages"][-1]["content"] for b in sent) == ["x 0", "x 1", "x 2"]
    assert all(b["model"] == "m" for b in sent)
    assert sorted(b.get("max_tokens") for b in sent if b["messages"][-1]["content"] != "x 0") == [
        64,
        64,
    ]
    results = read_jsonl(tmp_path / "b.results.jsonl")
    assert sorted(r["custom_id"] for r in results) == sorted(x["custom_id"] for x in lines)
    by_id = {r["custom_id"]: r for r in results}
    for i in range(3):
        reply = by_id[f"down{i}"]["response"]["body"]["choices"][0]["message"]["content"]
        assert reply == FakeServer.reply_text(f"x {i}")
    assert (tmp_path / "b.dead.jsonl").read_text() == ""
    status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
    assert status["counts"] == {"queued": 0, "running": 0, "done": 6, "dead": 0}
    # The custom_id's failures followed it to the new request.
    shown = json.loads(run_aiq("show", "down1", "--json", cwd=tmp_path).stdout)["lines"][0]
    assert [e["type"] for e in shown["errors"]] == ["server", "server"]
    assert shown["state"] == "done" and shown["request"]["body"]["max_tokens"] == 64


def test_an_id_named_moves_alone_off_a_request_it_shares(tmp_path: Path) -> None:
    import asyncio

    from aiq.defaults import Defaults
    from aiq.enqueue import add_file
    from aiq.replay import replay
    from aiq.requestfile import read_requests
    from aiq.store import JobStore

    path = tmp_path / "p.jsonl"
    path.write_text('{"custom_id": "a", "prompt": "same"}\n{"custom_id": "b", "prompt": "same"}\n')

    async def scenario() -> tuple[int, list[tuple[Any, ...]]]:
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            source = await store.add_source(str(path), out_path="o", dead_path="d")
            await add_file(store, source, read_requests(path, Defaults(model="m")))
            async with store.transaction():
                await store.connection.execute("UPDATE jobs SET state = 3, error_type = 'x'")
            done = await replay(store, custom_ids=("a",), sets={"max_tokens": 5})
            rows = await store.connection.execute_fetchall(
                "SELECT i.custom_id, j.state, json_extract(j.body, '$.max_tokens') FROM items i "
                "JOIN jobs j ON j.k64 = i.job_k64 ORDER BY i.custom_id"
            )
            return done.replayed, [tuple(r) for r in rows]

    assert asyncio.run(scenario()) == (1, [("a", 0, 5), ("b", 3, None)])
