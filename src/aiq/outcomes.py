"""What becomes of a job after an attempt: the product's central contract, as pure functions.

README's "Rate limits, retries and outages" states the rules: a failure the job's own costs
it an attempt and is retried with backoff until ``--max-attempts``, then dead-lettered; a 429,
an outage, or an endpoint never reached costs none; a fatal error stops the run and leaves
every job as it was. The functions here take what the call gave (a reply or a classified
error), the retry policy, what the circuit breakers say and the time, and return the job's
next state, attempts and next time, with any pause for every sender and any reason to stop
the run. They feed no limiter or breaker and stop nothing: the sender does that, driven by
what they return (aiq.sender), so each rule is one row of a table test
(tests/test_outcomes.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from . import backoff
from .contract import billed_tier
from .durations import duration_text
from .providers.base import ProviderError, Reply
from .records import DEAD, DONE, QUEUED, Job, Outcome
from .stops import TRUNCATED, stop_message
from .text import quoted

# Failures a down provider gives: what the circuit breakers count (aiq.breaker).
OUTAGE_ERRORS = frozenset({"server", "timeout", "connection"})

# Why a failure ends the run (exit 4, every job kept): the error is fatal itself (a bad key,
# a quota), no call has reached the endpoint, or every call has been refused with 429s for
# longer than --max-outage.
GiveUp = Literal["fatal", "unreachable", "refused"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many failures a job may have, how long to wait between them, and how long a run
    waits for a provider that is down before it stops (exit 4, resumable)."""

    max_attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 60.0
    max_outage_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Health:
    """What the circuit breakers say once the failed call is recorded in them."""

    down: bool = False  # every model's breaker is open: the provider is down
    reached: bool = True  # some call of this run has reached the endpoint
    unreachable: bool = False  # the endpoint is given up on: no call has reached it
    broken: bool = False  # this job's model's breaker is open while other models answer


@dataclass(frozen=True, slots=True)
class Refusals:
    """The run's streak of 429s (aiq.refusals), this one included."""

    rounds: int = 0  # rounds of refusals with no success between
    lasted_s: float = 0.0  # how long every call has been refused


NO_REFUSALS = Refusals()


@dataclass(frozen=True, slots=True)
class Fate:
    """A failed attempt's decision: the outcome to record, how long every sender of the
    job's limiter pauses (None: no pause), and why the run stops (None: it goes on)."""

    outcome: Outcome
    pause_s: float | None = None
    give_up: GiveUp | None = None


def outage_like(err: ProviderError) -> bool:
    """Whether ``err`` is how a down provider fails (the breakers count these)."""
    return err.error_type in OUTAGE_ERRORS


def replied(
    job: Job,
    reply: Reply,
    *,
    started: float,
    finished: float,
    model: str | None,
    cost_usd: float | None,
    dead_truncated: bool = False,
    tier: str | None = None,
) -> Outcome:
    """A reply came: the job is done (its attempt counted), or dead if it was cut off at
    max_tokens under ``--on-truncated dead``. A reply that stopped short is stored as sent
    either way, its stop named in ``error_type`` (status counts it). Its tier is the one
    ``cost_usd`` was priced at: ``tier`` (a batch line's), else the one the reply names.
    Built as the record itself: this runs for every job, and a decision beside it would be
    one more object."""
    out = Outcome(
        job.id,
        DONE,
        job.attempts + 1,
        started_at=started,
        finished_at=finished,
        status_code=reply.status_code,
        request_id=reply.request_id,
        response=reply.body,
        usage=reply.usage,
        latency_s=finished - started,
        model=model,
        cost_usd=cost_usd,
        tier=billed_tier(tier or reply.tier),
    )
    if (stop := reply.stop) is not None:
        dead = stop.kind == TRUNCATED and dead_truncated  # for a replay with more tokens
        out.error_type = stop.kind
        out.error_message = stop_message(stop, reply.tokens_out, dead=dead)
        if dead:
            out.state = DEAD
    return out


def refused(err: ProviderError) -> bool:
    """A 429's kind: the provider declined the call for now, at the client's pace (a rate
    limit) or for want of capacity (a flex tier's), not for anything in the request."""
    return err.error_type in ("rate_limit", "capacity")


def own_fault(err: ProviderError, health: Health) -> bool:
    """Whether a failure is the job's own, and costs it an attempt: not a refusal (the
    client's pace, the provider's capacity), a fatal error (the account or settings), a
    provider that is down (every breaker open) or an endpoint no call has reached."""
    if err.fatal or refused(err):
        return False
    return not (outage_like(err) and health.down) and not (err.unreachable and not health.reached)


def failed(
    job: Job,
    err: ProviderError,
    *,
    policy: RetryPolicy,
    health: Health,
    started: float,
    now: float,
    retry_after_s: float | None = None,
    refusals: Refusals = NO_REFUSALS,
    full: bool = False,
    held: bool = False,
    rand: Callable[[], float] = random.random,
) -> Fate:
    """A failed attempt: retry later, dead-letter, or stop the run (see :func:`own_fault`
    for when it costs an attempt). ``retry_after_s`` is the delay to honour (for a 429, as
    the limiter read it); ``full``: the 429 is a full server's, not its window's (the
    limiter's ``server_full``), so the others go on; ``held``: the pause for it holds the
    job too and may end sooner (the limiter's ``pause_tested``). Either way the job waits
    no longer than its own backoff; ``now`` and ``started`` are wall-clock times."""
    out = _attempted(job, err, own_fault(err, health), started=started, now=now)
    if err.fatal:  # not the job's fault: it stays as it was, and the run stops
        return Fate(out, give_up="fatal")
    if err.unreachable and not health.reached and health.unreachable:
        return Fate(out, give_up="unreachable")
    rate_limited = refused(err)
    # A 429 costs no attempt, so its backoff grows with the run's streak of refusals.
    attempt = max(1, out.attempts, refusals.rounds if rate_limited else 0)
    wait_s, pause_s = _waits(attempt, policy, retry_after_s, rate_limited, full, held, rand)
    if rate_limited and refusals.lasted_s > policy.max_outage_s:
        return Fate(out, pause_s, give_up="refused")
    if not err.retryable or out.attempts >= policy.max_attempts:
        out.state, out.finished_at = DEAD, now
        if outage_like(err) and health.broken:
            out.error_message = _failed_alone(job, err)
        return Fate(out, pause_s)
    if err.cut and not (health.down or health.broken):
        # Cut by the learned timeout while the provider answers other calls: a hang, not a
        # provider that needs a rest. Waiting on would add a backoff to the hang's cost.
        wait_s = 0.0
    out.next_at = now + wait_s
    return Fate(out, pause_s)


def _waits(
    attempt: int,
    policy: RetryPolicy,
    retry_after_s: float | None,
    rate_limited: bool,
    full: bool,
    held: bool,
    rand: Callable[[], float],
) -> tuple[float, float | None]:
    """How long a failed job waits, and how long every sender pauses (None: none)."""
    wait_s = backoff.delay(
        attempt, base_s=policy.base_s, cap_s=policy.cap_s, retry_after_s=retry_after_s, rand=rand
    )
    if full or held:  # the hint if it is sooner than the job's own backoff
        own_s = backoff.delay(attempt, base_s=policy.base_s, cap_s=policy.cap_s, rand=rand)
        wait_s = min(wait_s, own_s)
    if (retry_after_s is None and not rate_limited) or full:
        return wait_s, None
    # The server's pace holds for every request, not just this one: pause all senders (for
    # as long as it said, or for the streak's backoff if it named no time).
    if retry_after_s is None:
        return wait_s, wait_s
    # The pause holds every sender to its end, and the limiter paces what comes back then:
    # backoff's spread on top of it only kept the refused job back (at a LiteLLM minute's
    # turn, up to half a second after the rest had gone).
    return min(wait_s, retry_after_s), retry_after_s


def _attempted(
    job: Job, err: ProviderError, charged: bool, *, started: float, now: float
) -> Outcome:
    """The failed attempt's record, the job still queued (with no retry time yet)."""
    return Outcome(
        job.id,
        QUEUED,
        job.attempts + 1 if charged else job.attempts,
        started_at=started,
        status_code=err.status_code,
        error_type=err.error_type,
        error_message=err.message,
        request_id=err.request_id,
        latency_s=now - started,
        # No reply in time (not a 408, not a connection never made): it may have been billed.
        timed_out=err.error_type == "timeout" and err.status_code is None and not err.unreachable,
    )


def _failed_alone(job: Job, err: ProviderError) -> str:
    """A dead letter's message when the job's model failed while the others answered."""
    model = job.model if isinstance(job.model, str) else None
    return (
        f"{err.message}; most calls to {model or 'this model'} failed so while other models "
        "answered: its deployment may be down. Once it answers, run aiq replay-dead "
        f"--error {err.error_type}, then aiq resume"
    )


def too_large(job: Job, why: str, *, now: float) -> Outcome:
    """A request over its whole tokens-per-minute limit (``why``, from RequestTooLarge): it
    can never be sent, so it is dead at once, charged no attempt (it was never sent)."""
    return Outcome(
        job.id,
        DEAD,
        job.attempts,
        started_at=now,
        finished_at=now,
        error_type="invalid_request",
        error_message=(
            f"request too large: it {why} tokens per minute, so it can never be sent; "
            "shorten the prompt or lower max_tokens"
        ),
    )


def given_up(
    why: GiveUp, err: ProviderError, *, policy: RetryPolicy, last_error: str
) -> ProviderError:
    """The fatal error a run stops with, given ``why`` and the error that ended it.
    ``last_error`` is the provider's last outage-like error of the run."""
    if why == "fatal":
        return err
    if why == "unreachable":
        return endpoint_lost(last_error)
    if err.error_type == "capacity":
        return no_capacity_throughout(policy.max_outage_s, err.message)
    return refused_throughout(policy.max_outage_s, err.message)


def endpoint_lost(last_error: str) -> ProviderError:
    """No call has reached the endpoint: a wrong URL or a server not running, most likely;
    waiting --max-outage for it would only hide that."""
    return ProviderError(
        "connection",
        f"{quoted(last_error)}; no call has reached the endpoint in this run (each was "
        "refused, found no host or timed out connecting). Check --base-url and that the "
        "server is running",
        fatal=True,
    )


def provider_down(max_outage_s: float, last_error: str) -> ProviderError:
    """The provider has failed every call for longer than --max-outage."""
    return ProviderError(
        "outage",
        f"the provider has failed every call for over {duration_text(max_outage_s)} "
        f"(--max-outage), the last with {quoted(last_error)}; no job was charged for it. "
        "Check the provider's status page",
        fatal=True,
    )


def no_capacity_throughout(max_outage_s: float, message: str) -> ProviderError:
    """Every call turned away for want of capacity (a flex tier's) for longer than
    --max-outage: the tier is full for now, not the limits."""
    return ProviderError(
        "capacity",
        f"the provider has had no capacity for any call for over "
        f"{duration_text(max_outage_s)} (--max-outage), the last answer {quoted(message)}; no "
        "job was charged for it. Run aiq resume later, or send at the default tier",
        fatal=True,
    )


def refused_throughout(max_outage_s: float, message: str) -> ProviderError:
    """Every call refused with a 429 for longer than --max-outage: a limit that does not
    refill (a model that always fails, a quota nobody reports), not a pace to wait for."""
    return ProviderError(
        "rate_limit",
        f"the provider has answered every call with 429 for over "
        f"{duration_text(max_outage_s)} (--max-outage), the last with {quoted(message)}; no "
        "job was charged for it. Check the account's limits for this model, then run aiq "
        "resume",
        fatal=True,
    )
