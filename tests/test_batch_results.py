"""What a batch line makes of its job (aiq.batch_results): the online error table, row by row."""

from __future__ import annotations

import httpx
import orjson
import pytest

from aiq.batch_files import Line
from aiq.batch_results import LineRules, over_token_limit, oversized
from aiq.outcomes import RetryPolicy
from aiq.pricing import Price
from aiq.providers.openai import OpenAIProvider
from aiq.records import DEAD, DONE, QUEUED, Job

_CHAT = orjson.dumps(
    {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
     "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                  "finish_reason": "stop"}],
     "usage": {"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000}}
)  # fmt: skip


def _error(code: str) -> bytes:
    return orjson.dumps({"error": {"message": "no", "type": code, "code": code}})


def _rules(price: Price | None = None) -> LineRules:
    answers = OpenAIProvider(
        httpx.MockTransport(lambda r: httpx.Response(500)), base_url="http://h/v1", api_key=None
    )
    prices = {"m": price or Price(input_per_m=2.0, output_per_m=4.0)}
    return LineRules(answers, prices=prices, retry=RetryPolicy(max_attempts=3), wall=lambda: 50.0)


def test_a_models_own_batch_share_prices_its_lines() -> None:
    price = Price(input_per_m=2.0, output_per_m=4.0, batch_share=0.4, flex_share=0.9)
    out = _rules(price).outcome(_JOB, Line(7, 200, "req_1", _CHAT, None, None), started=10.0)
    assert not isinstance(out, str)
    assert out.cost_usd == pytest.approx((2.0 + 4.0) / 1000 * 0.4)  # not the flex share


_JOB = Job(7, "/v1/chat/completions", b"", 1, None, "m")


@pytest.mark.parametrize(
    ("line", "state", "attempts", "error_type"),
    [
        (Line(7, 200, "req_1", _CHAT, None, None), DONE, 2, None),
        (Line(7, 400, None, _error("invalid_request_error"), None, None), DEAD, 2,
         "invalid_request"),
        (Line(7, 500, None, _error("server_error"), None, None), QUEUED, 2, "server"),
        (Line(7, 429, None, _error("rate_limit_exceeded"), None, None), QUEUED, 1,
         "rate_limit"),
        (Line(7, 200, None, b'{"nothing": 1}', None, None), QUEUED, 2, "bad_response"),
        (Line(7, None, None, b"", "server_hiccup", "m"), QUEUED, 2, "server"),
    ],
)  # fmt: skip
def test_a_lines_outcome_follows_the_online_table(
    line: Line, state: int, attempts: int, error_type: str | None
) -> None:
    out = _rules().outcome(_JOB, line, started=10.0)
    assert not isinstance(out, str)
    assert (out.state, out.attempts, out.error_type) == (state, attempts, error_type)
    if state == DONE:
        assert out.response == _CHAT and out.request_id == "req_1"
        assert out.cost_usd == pytest.approx((2.0 + 4.0) / 1000 / 2)  # half the list price
        assert (out.started_at, out.finished_at) == (10.0, 50.0)
    if state == QUEUED:
        assert out.next_at > 50.0  # retried later, in a later batch


@pytest.mark.parametrize(("code", "reason"), [("batch_expired", "expired"),
                                              ("batch_cancelled", "cancelled")])  # fmt: skip
def test_a_line_that_never_ran_goes_back_at_no_attempt(code: str, reason: str) -> None:
    assert _rules().outcome(_JOB, Line(7, None, None, b"", code, "m"), started=0.0) == reason


def test_validation_errors_name_their_lines_and_spare_the_others() -> None:
    jobs = {i: Job(i, "/v1/chat/completions", b"", 0, None, "m") for i in (3, 5, 9)}
    polled = {"errors": {"data": [{"code": "invalid_url", "line": 2, "message": "bad"}]}}
    (out,) = _rules().invalid_lines(polled, jobs, [3, 5, 9], started=0.0)
    assert (out.job_id, out.state) == (5, DEAD)
    assert "line 2: invalid_url" in (out.error_message or "")
    assert set(jobs) == {3, 9}  # queued again by the caller


def test_a_batch_failed_naming_no_line_charges_each_job_and_the_token_limit_none() -> None:
    jobs = {i: Job(i, "/v1/chat/completions", b"", 0, None, "m") for i in (1, 2)}
    polled = {"errors": {"data": [{"code": "weird", "line": None, "message": "boom"}]}}
    assert not over_token_limit(polled)
    block = _rules().invalid_lines(polled, jobs, [1, 2], started=0.0)
    assert [(o.state, o.attempts) for o in block] == [(QUEUED, 1), (QUEUED, 1)] and not jobs
    limit = {"errors": {"data": [{"code": "token_limit_exceeded", "line": None}]}}
    assert over_token_limit(limit) and not over_token_limit({"errors": None})


def test_a_request_too_big_for_any_batch_is_dead_naming_the_limit_and_the_way_out() -> None:
    (out,) = oversized([4], 240_000_000, now=9.0)
    assert (out.job_id, out.state, out.attempts, out.error_type) == (4, DEAD, 0, "invalid_request")
    assert "240,000,000 bytes" in (out.error_message or "") and "--via online" in (
        out.error_message or ""
    )
