"""``aiq errors`` and ``aiq show``: why jobs died, by error type, and everything the store
keeps of one custom_id's job, read out as records a caller renders (text here, or JSON).

Reads only; the SQL is the store's. Failures are kept per attempt from migration
0009_priority on (the ``errors`` table); a job that failed before then has its last error
only, in its row, and ``show`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from .errors import UsageError
from .records import STATE_NAMES
from .replay import unknown_type
from .store import JobStore
from .text import plural


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadType:
    """Dead jobs of one last-error type: how many, the latest's message, example ids."""

    error_type: str
    jobs: int
    last_message: str | None
    last_at: float | None  # when the latest of them died
    custom_ids: list[str]  # the first ``limit``, latest to die first
    items: int  # custom_ids whose job is dead of it, in every input file

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.error_type,
            "count": self.jobs,
            "last_message": self.last_message,
            "last_at": _iso(self.last_at),
            "custom_ids": self.custom_ids,
            "custom_id_count": self.items,
        }


async def dead_errors(
    store: JobStore, *, error_type: str | None = None, limit: int = 5
) -> list[DeadType]:
    """The store's dead jobs by error type, most first, with ``limit`` example custom_ids
    each. UsageError for an ``error_type`` no dead job has (naming those they have)."""
    if limit < 0:
        raise UsageError(f"--limit {limit}: give how many custom_ids to show a type, 0 or more")
    async with store.snapshot():
        if error_type is not None:
            have = await store.dead_error_types()
            if have and error_type not in have:
                raise UsageError(unknown_type(error_type, have, "shown", "--type"))
        types = await store.dead_by_type(error_type=error_type)
        ids: dict[str, list[str]] = {}
        for t, custom_id in await store.dead_custom_ids(error_type=error_type):
            ids.setdefault(t, []).append(custom_id)
    return [
        DeadType(
            error_type=t,
            jobs=n,
            last_message=message,
            last_at=at,
            custom_ids=ids.get(t, [])[:limit],
            items=len(ids.get(t, [])),
        )
        for t, n, message, at in types
    ]


def errors_lines(types: list[DeadType]) -> list[str]:
    """``aiq errors`` as text: a block per error type."""
    if not types:
        return ["no dead jobs"]
    total = sum(t.jobs for t in types)
    lines = [f"{plural(total, 'dead job')}, {plural(len(types), 'error type')}:"]
    for t in types:
        lines.append(f"{t.error_type}: {plural(t.jobs, 'job')}, the latest at {_iso(t.last_at)}")
        lines.append(f"  {t.last_message or '(no message)'}")
        if t.custom_ids:
            more = t.items - len(t.custom_ids)
            lines.append(
                "  custom_ids: " + ", ".join(t.custom_ids) + (f" and {more:,} more" if more else "")
            )
    return lines


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """One failed attempt as the store recorded it."""

    attempts: int  # the job's attempts after it (a rate limit costs none)
    at: float
    error_type: str | None
    status_code: int | None
    message: str | None
    request_id: str | None
    then: str  # what became of the job: "retried" or "dead"

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "at": _iso(self.at, "milliseconds"),
            "type": self.error_type,
            "status_code": self.status_code,
            "message": self.message,
            "request_id": self.request_id,
            "then": self.then,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Shown:
    """One input line named by the custom_id asked for, and its job."""

    custom_id: str
    file: str
    line_no: int
    line: Any  # the input line, parsed
    job: dict[str, Any]  # the job's row: state, attempts, priority, timings, request id …
    request: dict[str, Any]  # {"method", "url", "body"}: exactly what is sent
    reply: Any  # the reply as stored (parsed JSON, else text), None when none is
    errors: list[Failure] = field(default_factory=list)
    # False: the job failed before the store kept every failure; only its last is known.
    errors_complete: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "custom_id": self.custom_id,
            "file": self.file,
            "line_no": self.line_no,
            "line": self.line,
            **self.job,
            "errors": [e.as_dict() for e in self.errors],
            "errors_complete": self.errors_complete,
            "request": self.request,
            "reply": self.reply,
        }


async def show(store: JobStore, custom_id: str) -> list[Shown]:
    """Every input line named ``custom_id`` (one a file), with all the store keeps of its job.
    UsageError when no input line of the store has that name."""
    async with store.snapshot():
        found = await store.items_named(custom_id)
        if not found:
            raise UsageError(
                f"custom_id {custom_id!r}: not in any input file of this store (check the id, "
                "or pass --db for another store; lines without one are named line-N)"
            )
        kept_since = await store.errors_kept_since()
        return [await _shown(store, row, kept_since) for row in found]


async def _shown(store: JobStore, row: dict[str, Any], kept_since: float | None) -> Shown:
    first = row["first_attempt_at"]
    return Shown(
        custom_id=row["custom_id"],
        file=row["source"].path,
        line_no=row["line_no"],
        line=_parsed(row["line"]),
        job=_job(row),
        request={"method": "POST", "url": row["endpoint"], "body": _parsed(row["body"])},
        reply=None if row["response"] is None else _parsed(row["response"]),
        errors=await _failures(store, row),
        errors_complete=kept_since is not None and (first is None or first >= kept_since),
    )


async def _failures(store: JobStore, row: dict[str, Any]) -> list[Failure]:
    """The job's failed attempts, oldest first, from the error history."""
    failures = [
        Failure(
            attempts=a,
            at=at,
            error_type=t,
            status_code=code,
            message=m,
            request_id=rid,
            then="dead" if state == 3 else "retried",
        )
        for a, at, t, code, m, rid, state in await store.errors_of(row["id"])
    ]
    if not failures and row["error_type"] is not None and row["state"] != 2:
        # Its last error, from its row, where the history has none.
        failures.append(
            Failure(
                attempts=row["attempts"],
                at=row["finished_at"] or row["first_attempt_at"] or 0.0,
                error_type=row["error_type"],
                status_code=row["status_code"],
                message=row["error_message"],
                request_id=None,
                then=STATE_NAMES[row["state"]],
            )
        )
    return failures


def _job(row: dict[str, Any]) -> dict[str, Any]:
    """The job's own fields, times as ISO 8601."""
    return {
        "state": STATE_NAMES[row["state"]],
        "attempts": row["attempts"],
        "priority": row["priority"],
        "added_at": _iso(row["created_at"]),
        "first_attempt_at": _iso(row["first_attempt_at"]),
        "finished_at": _iso(row["finished_at"]),
        "next_attempt_at": _iso(row["next_at"]) if row["state"] == 0 and row["next_at"] else None,
        "latency_s": row["latency_s"],
        "status_code": row["status_code"],
        "request_id": row["request_id"],
        "model": row["model"],
        "tokens_in": row["tokens_in"],
        "tokens_out": row["tokens_out"],
        "cost_usd": row["cost_usd"],
        "tier": row["tier"],  # the tier cost_usd was billed at; None: no reply, or not recorded
        "timeouts": row["timeouts"],
    }


def show_lines(shown: list[Shown]) -> list[str]:
    """``aiq show`` as text: a block per input line."""
    lines: list[str] = []
    for s in shown:
        j = s.job
        if lines:
            lines.append("")
        lines.append(f"{s.custom_id} · {s.file}:{s.line_no}")
        lines.append(
            f"  state: {j['state']}, {plural(j['attempts'], 'attempt')}, priority {j['priority']}"
        )
        times = [
            ("added", j["added_at"]), ("first sent", j["first_attempt_at"]),
            ("finished", j["finished_at"]), ("next attempt", j["next_attempt_at"]),
        ]  # fmt: skip
        shown_times = [f"{name} {at}" for name, at in times if at]
        if j["latency_s"] is not None:
            shown_times.append(f"last call {j['latency_s']:.2f} s")
        lines.append("  times: " + ", ".join(shown_times))
        if j["request_id"] or j["status_code"]:
            lines.append(f"  request id: {j['request_id'] or '-'}, status {j['status_code']}")
        lines.extend(_failure_lines(s))
        lines.append(f"  request: POST {s.request['url']} {_compact(s.request['body'])}")
        lines.append(f"  reply: {'(none stored)' if s.reply is None else _compact(s.reply)}")
    return lines


def _failure_lines(s: Shown) -> list[str]:
    if not s.errors:
        return ["  errors: none"]
    head = f"  errors: {len(s.errors)}"
    if not s.errors_complete:
        head += " (only the last is known: the job failed before this store kept every error)"
    out = [head]
    for e in s.errors:
        code = f" (HTTP {e.status_code})" if e.status_code else ""
        rid = f", request id {e.request_id}" if e.request_id else ""
        out.append(
            f"    {_iso(e.at, 'milliseconds')} {e.error_type}{code}, {e.then}{rid}: {e.message}"
        )
    return out


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _parsed(raw: bytes | str) -> Any:
    """Stored JSON as a value; text that is not JSON as it is."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return bytes(raw).decode(errors="replace") if not isinstance(raw, str) else raw


def _iso(ts: float | None, timespec: str = "seconds") -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec=timespec)
