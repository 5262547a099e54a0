"""What becomes of a job after an attempt (aiq.outcomes): README's rules, one row each.

Each row's id is README's own wording (the test below checks that it still is), and each
row asserts the whole decision: the outcome to record (state, attempts, next time, message),
the pause for every sender, and whether the run stops. Backoff draws are fixed at 0.5, so a
wait under a ceiling of C seconds is C / 2.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq.contract import ErrorType, JobState
from aiq.outcomes import (
    NO_REFUSALS,
    Fate,
    Health,
    Refusals,
    RetryPolicy,
    failed,
    given_up,
    replied,
    too_large,
)
from aiq.providers.base import ProviderError, Reply
from aiq.records import DEAD, DONE, QUEUED, Job, Outcome
from aiq.stops import CONTENT_FILTER, TRUNCATED, Stop
from aiq.usage import Usage

NOW = 1_800_000_000.0
STARTED = NOW - 2.0
POLICY = RetryPolicy(max_attempts=5, base_s=1.0, cap_s=60.0, max_outage_s=600.0)
JOB = Job(7, "/v1/chat/completions", b"{}", attempts=2, first_attempt_at=NOW - 60, model="m")
LAST = replace(JOB, attempts=POLICY.max_attempts - 1)  # its next failure is its last


def half() -> float:
    return 0.5


def error(
    error_type: ErrorType,
    status: int | None = None,
    *,
    retryable: bool = False,
    fatal: bool = False,
    retry_after_s: float | None = None,
    unreachable: bool = False,
) -> ProviderError:
    return ProviderError(
        error_type,
        f"{error_type} {status}",
        status_code=status,
        retryable=retryable,
        fatal=fatal,
        retry_after_s=retry_after_s,
        unreachable=unreachable,
    )


def kept(err: ProviderError, attempts: int, next_at: float = 0.0, **fields: object) -> Outcome:
    """The job back in the queue after ``err``."""
    out = Outcome(
        JOB.id,
        QUEUED,
        attempts,
        started_at=STARTED,
        next_at=next_at,
        status_code=err.status_code,
        error_type=err.error_type,
        error_message=err.message,
        latency_s=NOW - STARTED,
    )
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def dead(err: ProviderError, attempts: int, **fields: object) -> Outcome:
    return kept(err, attempts, 0.0, state=DEAD, finished_at=NOW, **fields)


SERVER = error("server", 500, retryable=True)
SLOW_DOWN = error("server", 503, retryable=True, retry_after_s=7.0)
TIMEOUT = error("timeout", retryable=True)
LEARNED_CUT = ProviderError("timeout", "no reply in 0.3 s", retryable=True, cut=True)  # aiq cut it
REQUEST_TIMEOUT = error("timeout", 408, retryable=True)
CONNECTION = error("connection", retryable=True, unreachable=True)
CONNECT_TIMEOUT = error("timeout", retryable=True, unreachable=True)
RESET = error("connection", retryable=True)
BAD_JSON = error("bad_response", 200, retryable=True)
BAD_REQUEST = error("invalid_request", 400)
TOO_LARGE_429 = error("invalid_request", 429)
AUTH = error("auth", 401, fatal=True)
SPEND_LIMIT = error("spend_limit", 429, fatal=True)
RATE_LIMIT = error("rate_limit", 429, retryable=True)
RATE_LIMIT_AFTER = error("rate_limit", 429, retryable=True, retry_after_s=3.0)
NO_ROOM = error("capacity", 429, retryable=True)

UP = Health()
DOWN = Health(down=True)
BROKEN = Health(broken=True)
NEVER_REACHED = Health(reached=False)
GIVEN_UP = Health(reached=False, unreachable=True)

# (README's words, job, error, health, refusals, the decision)
RULES: list[tuple[str, Job, ProviderError, Health, Refusals, Fate]] = [
    (
        "Retried with exponential backoff and full jitter",
        JOB, SERVER, UP, NO_REFUSALS,
        Fate(kept(SERVER, 3, NOW + 4 * 0.5)),  # attempt 3: under 1, 2, 4 s
    ),
    (
        "never sooner than the server asked",
        JOB, SLOW_DOWN, UP, NO_REFUSALS,
        Fate(kept(SLOW_DOWN, 3, NOW + 7.0), pause_s=7.0),  # (the pause's end: no spread on it)
    ),
    (
        "A cut call is retried, and costs the job an attempt (the provider may have billed it)",
        JOB, TIMEOUT, UP, NO_REFUSALS,
        Fate(kept(TIMEOUT, 3, NOW + 2.0, timed_out=True)),
    ),
    (
        "one cut at its learned timeout goes again at once while the provider answers other calls",
        JOB, LEARNED_CUT, UP, NO_REFUSALS,
        Fate(kept(LEARNED_CUT, 3, NOW, timed_out=True)),
    ),
    (
        "Only when every model's breaker is open is the provider",  # a cut then waits
        JOB, LEARNED_CUT, DOWN, NO_REFUSALS,
        Fate(kept(LEARNED_CUT, 2, NOW + 2 * 0.5, timed_out=True)),  # attempt 2: under 2 s
    ),
    (
        "408, 409, 425, 429, 5xx",  # a 408 is an answer: no call timed out unanswered
        JOB, REQUEST_TIMEOUT, UP, NO_REFUSALS,
        Fate(kept(REQUEST_TIMEOUT, 3, NOW + 2.0)),
    ),
    (
        "connection errors",
        JOB, RESET, UP, NO_REFUSALS,
        Fate(kept(RESET, 3, NOW + 2.0)),
    ),
    (
        "a 200 with a body that is not the expected JSON",
        JOB, BAD_JSON, UP, NO_REFUSALS,
        Fate(kept(BAD_JSON, 3, NOW + 2.0)),
    ),
    (
        "Dead-lettered at once with the provider's message: 400, 413, 422, context length",
        JOB, BAD_REQUEST, UP, NO_REFUSALS,
        Fate(dead(BAD_REQUEST, 3)),
    ),
    (
        'A 429 "Request too large" (more tokens than the whole limit) is permanent',
        JOB, TOO_LARGE_429, UP, NO_REFUSALS,
        Fate(dead(TOO_LARGE_429, 3)),
    ),
    (
        "Fatal (exit 4, every job kept): 401, 403, 404",
        JOB, AUTH, UP, NO_REFUSALS,
        Fate(kept(AUTH, 2), give_up="fatal"),
    ),
    (
        "a spend limit's 429",  # money, not pacing: not retried, no pause
        JOB, SPEND_LIMIT, UP, NO_REFUSALS,
        Fate(kept(SPEND_LIMIT, 2), give_up="fatal"),
    ),
    (
        "`--max-attempts` counts only failures that are the job's own",
        LAST, SERVER, UP, NO_REFUSALS,
        Fate(dead(SERVER, 5)),
    ),
    (
        "**A 429** pauses every request until the server's `retry-after-ms` / `retry-after`",
        JOB, RATE_LIMIT_AFTER, UP, Refusals(rounds=1),
        Fate(kept(RATE_LIMIT_AFTER, 2, NOW + 3.0), pause_s=3.0),
    ),
    (
        "and costs the job no attempt",  # not even its last
        LAST, RATE_LIMIT, UP, Refusals(rounds=1),
        Fate(kept(RATE_LIMIT, 4, NOW + 8 * 0.5), pause_s=8 * 0.5),
    ),
    (
        "One that names no delay pauses by the run's streak of refusals",  # round 6: under 32 s
        JOB, RATE_LIMIT, UP, Refusals(rounds=6, lasted_s=40.0),
        Fate(kept(RATE_LIMIT, 2, NOW + 32 * 0.5), pause_s=32 * 0.5),
    ),
    (
        "up to `backoff_cap_s`",
        JOB, RATE_LIMIT, UP, Refusals(rounds=20, lasted_s=400.0),
        Fate(kept(RATE_LIMIT, 2, NOW + 60 * 0.5), pause_s=60 * 0.5),
    ),
    (
        "a streak of nothing but 429s for over `--max-outage` ends the run with exit 4, "
        "every job kept",
        JOB, RATE_LIMIT, UP, Refusals(rounds=9, lasted_s=601.0),
        Fate(kept(RATE_LIMIT, 2), pause_s=60 * 0.5, give_up="refused"),
    ),
    (
        "Such a refusal is backed off as a 429 is (it costs the job no attempt",
        LAST, NO_ROOM, UP, Refusals(rounds=2, lasted_s=3.0),
        Fate(kept(NO_ROOM, 4, NOW + 8 * 0.5), pause_s=8 * 0.5),
    ),
    (
        "a streak of them for over `--max-outage` ends the run with exit 4, every job kept",
        JOB, NO_ROOM, UP, Refusals(rounds=9, lasted_s=601.0),
        Fate(kept(NO_ROOM, 2), pause_s=60 * 0.5, give_up="refused"),
    ),
    (
        "no job is charged for the outage",
        LAST, SERVER, DOWN, NO_REFUSALS,
        Fate(kept(SERVER, 4, NOW + 8 * 0.5)),
    ),
    (
        "its jobs are retried as any job's own failures are",
        JOB, SERVER, BROKEN, NO_REFUSALS,
        Fate(kept(SERVER, 3, NOW + 4 * 0.5)),
    ),
    (
        "the dead letter's message says its model failed alone",
        LAST, SERVER, BROKEN, NO_REFUSALS,
        Fate(
            dead(
                SERVER, 5,
                error_message="server 500; most calls to m failed so while other models "
                "answered: its deployment may be down. Once it answers, run aiq replay-dead "
                "--error server, then aiq resume",
            )
        ),
    ),
    (
        "Those failures cost no job an attempt",  # an endpoint no call has reached
        LAST, CONNECTION, NEVER_REACHED, NO_REFUSALS,
        Fate(kept(CONNECTION, 4, NOW + 8 * 0.5)),
    ),
    (
        "the run stops with exit 4, naming the URL and the error",
        JOB, CONNECTION, GIVEN_UP, NO_REFUSALS,
        Fate(kept(CONNECTION, 2), give_up="unreachable"),
    ),
    (
        "Once the endpoint has answered, even with an error, it going away is an outage",
        JOB, CONNECT_TIMEOUT, UP, NO_REFUSALS,  # a connect timeout: no reply was missed
        Fate(kept(CONNECT_TIMEOUT, 3, NOW + 2.0)),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("job", "err", "health", "refusals", "fate"),
    [pytest.param(*row, id=words) for words, *row in RULES],
)
def test_a_failure_is_decided_as_readme_says(
    job: Job, err: ProviderError, health: Health, refusals: Refusals, fate: Fate
) -> None:
    got = failed(
        job, err, policy=POLICY, health=health, started=STARTED, now=NOW,
        retry_after_s=err.retry_after_s, refusals=refusals, rand=half,
    )  # fmt: skip
    assert got == fate


def test_a_full_servers_429_pauses_no_one_and_backs_off_its_job_alone() -> None:
    # (aiq.feedback's server_full: the server took a request let through an earlier pause.)
    # The refused job backs off by its own tries, whatever its hint (the minute's
    # turn, from LiteLLM's parallel limiter) or the streak: the others keep the server busy.
    hinted = error("rate_limit", 429, retryable=True, retry_after_s=52.9)
    got = failed(
        JOB, hinted, policy=POLICY, health=UP, started=STARTED, now=NOW, retry_after_s=52.9,
        refusals=NO_REFUSALS, full=True, rand=half,
    )  # fmt: skip
    assert got == Fate(kept(hinted, 2, NOW + 2 * 0.5))  # its own backoff (two tries), no pause
    # A hint sooner than that (the simulated provider's retry-after-ms) is kept.
    soon = error("rate_limit", 429, retryable=True, retry_after_s=0.2)
    got = failed(
        JOB, soon, policy=POLICY, health=UP, started=STARTED, now=NOW, retry_after_s=0.2,
        refusals=NO_REFUSALS, full=True, rand=half,
    )  # fmt: skip
    assert got == Fate(kept(soon, 2, NOW + 0.2 + 0.02 * 0.5))


def test_a_429_whose_pause_is_tested_holds_its_job_by_the_pause_alone() -> None:
    # The pause may end early (a request let through it got through): the job comes back
    # after its own backoff and waits in the pause, not 52.9 s on its own.
    hinted = error("rate_limit", 429, retryable=True, retry_after_s=52.9)
    got = failed(
        JOB, hinted, policy=POLICY, health=UP, started=STARTED, now=NOW, retry_after_s=52.9,
        refusals=Refusals(rounds=1), held=True, rand=half,
    )  # fmt: skip
    assert got == Fate(kept(hinted, 2, NOW + 2 * 0.5), pause_s=52.9)


def _plain(markdown: str) -> str:
    """Words only: no code or bold marks, one space for any run of white space."""
    return re.sub(r"\s+", " ", markdown.replace("`", "").replace("**", ""))


def test_each_rule_is_in_readmes_words() -> None:
    """A row whose words left README is a rule that changed, or a row that drifted."""
    readme = _plain((Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8"))
    missing = [words for words, *_ in RULES if _plain(words) not in readme]
    assert not missing


def _reply(stop: Stop | None) -> Reply:
    usage = Usage(tokens_in=12, tokens_out=34)
    return Reply.of(b'{"ok": true}', "req_1", usage, None, stop)


def done(stop: Stop | None, state: JobState = DONE, message: str | None = None) -> Outcome:
    return Outcome(
        JOB.id,
        state,
        3,
        started_at=STARTED,
        finished_at=NOW,
        status_code=200,
        request_id="req_1",
        response=b'{"ok": true}',
        usage=Usage(tokens_in=12, tokens_out=34),
        latency_s=NOW - STARTED,
        model="m",
        cost_usd=0.25,
        tier="online",  # the reply names no tier: the list price's
        error_type=None if stop is None else stop.kind,
        error_message=message,
    )


CUT = Stop(TRUNCATED, 'finish_reason "length"')
FILTERED = Stop(CONTENT_FILTER, 'finish_reason "content_filter"')


@pytest.mark.parametrize(
    ("stop", "dead_truncated", "state"),
    [
        pytest.param(None, False, DONE, id="a reply: done, its attempt counted"),
        pytest.param(CUT, False, DONE, id="Cut-off replies are kept as results by default"),
        pytest.param(CUT, True, DEAD, id="with `--on-truncated dead` each is dead-lettered"),
        pytest.param(
            FILTERED, True, DONE, id="`--on-truncated` does not cover content-filter stops"
        ),
    ],
)
def test_a_reply_is_done_or_as_on_truncated_says(
    stop: Stop | None, dead_truncated: bool, state: JobState
) -> None:
    got = replied(
        JOB, _reply(stop), started=STARTED, finished=NOW, model="m", cost_usd=0.25,
        dead_truncated=dead_truncated,
    )  # fmt: skip
    assert got == done(stop, state, message=got.error_message)
    if stop is not None:  # its message says what stopped it (aiq.stops words it)
        assert got.error_message is not None and stop.said in got.error_message


@pytest.mark.parametrize(
    ("said", "batch_line", "billed"),
    [(None, False, "online"), ("default", False, "online"), ("priority", False, "online"),
     ("flex", False, "flex"), ("default", True, "batch"), (None, True, "batch")],
)  # fmt: skip
def test_a_replys_tier_is_the_one_it_is_billed_at(
    said: str | None, batch_line: bool, billed: str
) -> None:
    # What aiq.pricing prices a reply at: flex by the reply's word, a batch line as batch
    # whatever its body says, any other tier at the list price (online).
    reply = _reply(None)
    reply.tier = said
    got = replied(
        JOB, reply, started=STARTED, finished=NOW, model="m", cost_usd=0.25,
        tier="batch" if batch_line else None,
    )  # fmt: skip
    assert got.tier == billed


def test_a_request_over_the_whole_limit_is_dead_at_once_with_no_attempt() -> None:
    got = too_large(JOB, "needs 9,000 but the limit is 8,000", now=NOW)
    assert got == Outcome(
        JOB.id,
        DEAD,
        2,
        started_at=NOW,
        finished_at=NOW,
        error_type="invalid_request",
        error_message="request too large: it needs 9,000 but the limit is 8,000 tokens per "
        "minute, so it can never be sent; shorten the prompt or lower max_tokens",
    )


def test_the_run_stops_with_the_reason_it_gave_up_for() -> None:
    assert given_up("fatal", AUTH, policy=POLICY, last_error="x") is AUTH
    lost = given_up("unreachable", CONNECTION, policy=POLICY, last_error="cannot reach it.")
    assert lost.fatal and lost.error_type == "connection"
    assert lost.message.startswith("cannot reach it; no call has reached the endpoint")
    refused = given_up("refused", RATE_LIMIT, policy=POLICY, last_error="")
    assert refused.fatal and refused.error_type == "rate_limit"
    assert "429 for over 10 min (--max-outage), the last with rate_limit 429" in refused.message
    full = given_up("refused", NO_ROOM, policy=POLICY, last_error="")
    assert full.fatal and full.error_type == "capacity"
    assert "no capacity for any call for over 10 min (--max-outage)" in full.message


ERRORS = st.builds(
    error,
    st.sampled_from(
        ["server", "timeout", "connection", "rate_limit", "capacity", "invalid_request", "auth"]
    ),
    st.sampled_from([None, 400, 429, 500]),
    retryable=st.booleans(),
    fatal=st.booleans(),
    retry_after_s=st.none() | st.floats(0.0, 120.0),
    unreachable=st.booleans(),
)
HEALTH = st.builds(
    Health, down=st.booleans(), reached=st.booleans(), unreachable=st.booleans(),
    broken=st.booleans(),
)  # fmt: skip
REFUSALS = st.builds(Refusals, rounds=st.integers(0, 100), lasted_s=st.floats(0.0, 2000.0))


@given(
    attempts=st.integers(0, POLICY.max_attempts - 1),
    err=ERRORS,
    health=HEALTH,
    refusals=REFUSALS,
    draw=st.floats(0.0, 1.0, exclude_max=True),
)
def test_every_failure_keeps_the_contract(
    attempts: int, err: ProviderError, health: Health, refusals: Refusals, draw: float
) -> None:
    """Whatever the failure: one attempt at most is charged, and only for the job's own;
    a run that stops leaves the job queued with no retry time; a dead job is finished now;
    a retry is never sooner than the server asked, nor later than the cap allows."""
    job = replace(JOB, attempts=attempts)
    fate = failed(
        job, err, policy=POLICY, health=health, started=STARTED, now=NOW,
        retry_after_s=err.retry_after_s, refusals=refusals, rand=lambda: draw,
    )  # fmt: skip
    out = fate.outcome
    assert out.job_id == job.id and out.error_type == err.error_type
    assert out.attempts in (attempts, attempts + 1)
    if err.fatal or err.error_type in ("rate_limit", "capacity"):
        assert out.attempts == attempts  # the account's or the pace's doing, not the job's
    if err.fatal:
        assert fate.give_up == "fatal"
    if fate.give_up is not None:
        assert (out.state, out.next_at, out.finished_at) == (QUEUED, 0.0, None)
    elif out.state == DEAD:
        assert out.finished_at == NOW and out.next_at == 0.0
        assert not err.retryable or out.attempts >= POLICY.max_attempts
    else:
        assert out.state == QUEUED and err.retryable and out.attempts < POLICY.max_attempts
        floor = err.retry_after_s or 0.0
        assert NOW + floor <= out.next_at <= NOW + max(POLICY.cap_s, floor * 1.1)
    if fate.pause_s is not None:
        assert err.retry_after_s is not None or err.error_type in ("rate_limit", "capacity")
