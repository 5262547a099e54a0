"""What a batch's lines make of its jobs, by the same rules as an online call (aiq.outcomes):
a line's reply read as a reply, a line's error classified by the same table; the lines a
failed batch's ``errors.data[]`` name; the progress counts. No store and no HTTP here."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from . import outcomes
from .batch_files import Line
from .batch_records import Requeue
from .outcomes import Health, RetryPolicy
from .pricing import Price, price_for
from .providers.base import ProviderError
from .providers.batches import Answers
from .records import DEAD, DONE, Job, Outcome
from .run_records import Progress

# Line errors that say the line never ran: queued again, no attempt spent.
_NOT_RUN: dict[str, Requeue] = {"batch_expired": "expired", "batch_cancelled": "cancelled"}
# errors.data codes of a batch failed on the account's limits, not on its lines.
_PACING_CODES = frozenset({"token_limit_exceeded", "rate_limit_exceeded"})


def over_token_limit(polled: Mapping[str, Any]) -> bool:
    """Whether a failed batch failed on the account's enqueued-token limit (OpenAI fails
    the batch with ``token_limit_exceeded`` and no line): no line of it is at fault."""
    codes = {e.get("code") for e in _errors(polled) if e.get("line") is None}
    return bool(codes & _PACING_CODES)


def _errors(polled: Mapping[str, Any]) -> list[dict[str, Any]]:
    data = (polled.get("errors") or {}).get("data") or []
    return [e for e in data if isinstance(e, dict)]


class LineRules:
    """Outcomes of a batch's lines. ``answers`` reads a reply exactly as an online call's;
    ``prices`` price a done job at its batch share of the list price (aiq.pricing)."""

    def __init__(
        self,
        answers: Answers,
        *,
        prices: Mapping[str, Price],
        retry: RetryPolicy,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._answers = answers
        self._prices = prices
        self._retry = retry
        self._wall = wall

    def outcome(self, job: Job, line: Line, *, started: float) -> Outcome | Requeue:
        """What a line makes of its job: an outcome by the online table, or why it never
        ran (expired, cancelled: queued again, no attempt spent)."""
        now = self._wall()
        if line.status_code is None:
            reason = _NOT_RUN.get(line.error_code or "")
            if reason is not None:
                return reason
            err = ProviderError(
                "server",
                f"batch line error {line.error_code}: {line.error_message}",
                retryable=True,
            )
            return self.failed(job, err, started=started)
        try:
            reply = self._answers.answer(job.endpoint, line.status_code, line.body, line.request_id)
        except ProviderError as err:
            return self.failed(job, err, started=started)
        model = job.model if isinstance(job.model, str) else None
        price = price_for(model, self._prices)
        cost = None
        if price is not None and reply.usage is not None:
            cost = price.tier_cost_usd(reply.usage, "batch")  # (half, unless prices: say)
        return outcomes.replied(
            job, reply, started=started, finished=now, model=model, cost_usd=cost, tier="batch"
        )

    def failed(self, job: Job, err: ProviderError, *, started: float) -> Outcome:
        """A line's failure by the online table (its job's own fault: the provider is up)."""
        fate = outcomes.failed(
            job, err, policy=self._retry, health=Health(), started=started, now=self._wall()
        )
        return fate.outcome

    def invalid_lines(
        self, polled: Mapping[str, Any], jobs: dict[int, Job], order: list[int], *,
        started: float,
    ) -> list[Outcome]:  # fmt: skip
        """A batch that failed validation: the lines its ``errors.data[]`` name get their
        error (a bad line is dead, by the table), taken out of ``jobs``; the others stay, to
        be queued again. With no line named, every job is charged the failure (so a batch
        that always fails ends)."""
        errors = _errors(polled)
        named = [e for e in errors if isinstance(e.get("line"), int)]
        block = []
        for e in named:
            n = e["line"]
            if not 1 <= n <= len(order) or order[n - 1] not in jobs:
                continue
            err = ProviderError(
                "invalid_request",
                f"batch validation: line {n}: {e.get('code')}: {e.get('message')}",
                status_code=400,
            )
            block.append(self.failed(jobs.pop(order[n - 1]), err, started=started))
        if not named:
            message = "; ".join(str(e.get("message")) for e in errors)
            err = ProviderError(
                "invalid_request", f"batch failed: {message or 'no reason given'}",
                status_code=400, retryable=True,
            )  # fmt: skip
            block = [self.failed(job, err, started=started) for job in jobs.values()]
            jobs.clear()
        return block


def count(progress: Progress, block: list[Outcome]) -> None:
    """Add written outcomes to the run's progress, as the online dispatcher counts them."""
    p = progress
    for o in block:
        if o.state == DONE:
            p.done += 1
            p.done_now += 1
            if o.usage is not None:
                p.tokens_in += o.usage.tokens_in
                p.tokens_out += o.usage.tokens_out
                p.kinds.add(o.usage)
            else:
                p.unusable += 1
            if o.cost_usd is None:
                p.unpriced += 1
            else:
                p.cost_usd += o.cost_usd
            p.billed(o.tier, o.cost_usd)
        elif o.state == DEAD:
            p.dead += 1
            p.dead_now += 1
        else:
            p.retries += 1


def oversized(ids: list[int], max_bytes: int, *, now: float) -> list[Outcome]:
    """Jobs whose request alone is over what a batch holds: dead, nothing sent."""
    message = (
        f"request over {max_bytes:,} bytes, the most a batch holds: send it online (--via online)"
    )
    return [
        Outcome(i, DEAD, 0, started_at=now, finished_at=now, error_type="invalid_request",
                error_message=message)
        for i in ids
    ]  # fmt: skip
