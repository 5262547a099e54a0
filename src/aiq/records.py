"""What the store hands out and takes in: job states, sources, claimed jobs, outcomes, counts
and stats. Plain records, so that readers of them need not import the store."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# Job states live in aiq.contract; named here too, where the store's readers look for them.
from .contract import DEAD as DEAD
from .contract import DONE as DONE
from .contract import QUEUED as QUEUED
from .contract import RUNNING as RUNNING
from .contract import STATE_NAMES as STATE_NAMES
from .contract import JobError, JobState, ProviderName, Tier, Via
from .errors import EMPTY_INPUT, SKIPPED_LINES

if TYPE_CHECKING:  # in annotations only: `aiq status` reads these records without them
    from .inputs import BadLine
    from .usage import Usage


def k64(key: bytes) -> int:
    """The job's short unique id: the first 8 bytes of its key as a signed 64-bit integer."""
    return int(_K64.unpack_from(key)[0])


_K64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class Source:
    """An input file known to the store, with the output paths it exports to."""

    id: int
    path: str
    out_path: str
    dead_path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where a store's jobs go: its provider, base URL, key variable and the defaults its
    lines were enqueued with. Recorded by the first run, so ``aiq resume`` (and a cron line
    with no flags) goes on the same way; the key itself stays in the environment."""

    provider: ProviderName
    base_url: str
    api_key_env: str
    model: str | None = None
    max_tokens: int | None = None
    via: Via = "online"  # how its jobs were last sent: resume goes on the same way
    deadline: float | None = None  # --via auto's, in seconds since the epoch

    @property
    def where(self) -> str:
        """``openai at http://127.0.0.1:8000/v1``."""
        return f"{self.provider} at {self.base_url}"

    def same_place(self, other: Target) -> bool:
        """Whether jobs sent to ``other`` go where they would go to this one."""
        return self.provider == other.provider and _root(self.base_url) == _root(other.base_url)

    def as_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "base_url": self.base_url,
            "api_key_env": self.api_key_env,
            "model": self.model,
            "max_tokens": self.max_tokens,
            "via": self.via,
            "deadline": self.deadline,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Target:
        return cls(
            provider=d["provider"],
            base_url=d["base_url"],
            api_key_env=d["api_key_env"],
            model=d.get("model"),
            max_tokens=d.get("max_tokens"),
            via=d.get("via", "online"),
            deadline=d.get("deadline"),
        )


def _root(url: str) -> str:
    # Both providers send to {base}/v1/…, with or without a /v1 on the base URL.
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed job: what the worker sends."""

    id: int
    endpoint: str
    body: bytes
    attempts: int
    first_attempt_at: float | None
    model: str | None = None
    due_at: float = 0.0  # when it came due; 0: never put back (by a retry or a rate limit)
    priority: int = 0  # claimed before lower ones


@dataclass(slots=True)
class Outcome:
    """What became of one attempt; the worker builds it, the store records it in a batch."""

    job_id: int
    state: JobState  # DONE, QUEUED (retry later) or DEAD
    attempts: int
    started_at: float
    finished_at: float | None = None
    next_at: float = 0.0
    status_code: int | None = None
    error_type: JobError | None = None
    error_message: str | None = None
    request_id: str | None = None
    response: bytes | None = None
    # A reply's usage by kind; None: no reply, or (done) its usage was missing or unusable,
    # and its tokens are stored as NULL, unknown.
    usage: Usage | None = None
    latency_s: float | None = None
    model: str | None = None  # as the body named it; for cost per model
    cost_usd: float | None = None  # None: the model has no price, or the usage is unusable
    tier: Tier | None = None  # the tier a reply was billed at; None: no reply
    timed_out: bool = False  # no reply in time: the provider may still bill the call

    @property
    def tokens_in(self) -> int | None:
        return None if self.usage is None else self.usage.tokens_in

    @property
    def tokens_out(self) -> int | None:
        return None if self.usage is None else self.usage.tokens_out


@dataclass(slots=True, kw_only=True)
class EnqueueCounts:
    """What ``add`` did: lines new to the store, already known, re-pointed, invalid."""

    new: int = 0
    known: int = 0
    changed: int = 0
    invalid: int = 0
    jobs_added: int = 0  # distinct new requests that will be sent
    valid: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)  # the first KEEP_BAD_LINES
    # Valid lines of the file per default they took ({"model": 12, ...}; inputs.count_defaults),
    # when the lines came from read_requests.
    defaults: dict[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Whether the file held no line at all (blank lines aside)."""
        return not self.valid and not self.invalid

    @property
    def exit_code(self) -> int:
        """0, or errors.SKIPPED_LINES / EMPTY_INPUT: what this input asks a cron user to see."""
        if self.empty:
            return EMPTY_INPUT
        return SKIPPED_LINES if self.invalid else 0


@dataclass(slots=True)
class Carried:
    """One input file's lines that only its output files hold since a prune (aiq.retention),
    as custom_id hashes (items.ck): of pruned done jobs (in its results file), of pruned dead
    ones (its dead letters), and of forgotten jobs (in either)."""

    done: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    forgotten: set[int] = field(default_factory=set)


@dataclass(slots=True, kw_only=True)
class Pruned:
    """What ``prune`` did: jobs pruned by state, what was left as not exported yet, the bytes
    of requests, replies and lines it removed, and the file's size before and after."""

    done: int = 0
    dead: int = 0
    not_exported: int = 0  # old enough, but not (provably) in their files yet
    forgotten: bool = False
    freed_bytes: int = 0  # of requests, replies and input lines
    size_before: int = 0
    size_after: int = 0
    vacuumed: bool = False
    vacuum_skipped: str | None = None  # why the file was not shrunk
    sources_unexported: list[str] = field(default_factory=list)  # files with no current export


@dataclass(slots=True, kw_only=True)
class Replayed:
    """What ``replay-dead`` did: how many dead jobs it queued again, the error types the dead
    jobs had before, and why each custom_id asked for that was not replayed was not; with
    ``--set``, which fields changed in how many bodies (and with ``--dry-run``, would)."""

    replayed: int = 0
    dead_types: dict[str, int] = field(default_factory=dict)  # error type → dead jobs
    not_replayed: dict[str, str] = field(default_factory=dict)  # custom_id → "done", …
    dry_run: bool = False  # nothing was changed: ``replayed`` says how many would be
    sets: dict[str, Any] = field(default_factory=dict)  # --set: field → its new value
    changed: dict[str, int] = field(default_factory=dict)  # field → jobs whose value changes
    new_requests: int = 0  # distinct requests queued for the changed bodies
