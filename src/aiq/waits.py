"""What a run says about its limits and what it waits for, in words for the progress lines.

A run that sends nothing for a while looks stuck: ``in flight 0`` and an ETA counting up. It
is usually waiting for something it chose to wait for, and says which:

- the rate limit: ``waiting for the rate limit (1,200/min, learned) until 14:03:07``;
- a 429's pause: ``waiting: the provider asked for a pause (429) until 14:03:07``;
- a backoff: ``waiting for a backoff: retries not due yet, the next at 14:03:07 (12 s)``;

and the limits in force, per model, given (configured) or learned (from the provider's
headers, which win when lower): ``limit 1,200/min learned``. An outage is said by the
progress's own outage note. Pure: the worker hands in what its limiters and store say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from .durations import duration_text

# A slot this far off, or any while nothing is in flight, is a wait worth saying: nearer
# ones are the even pace between requests.
NOTICEABLE_S = 1.0
_SHOWN_MODELS = 3


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """One model's limits now, and how long its limiter would hold the next request."""

    model: str | None
    rpm: float | None = None
    tpm: float | None = None
    rpm_learned: bool = False
    tpm_learned: bool = False
    wait_s: float = 0.0  # until the next request could go
    paused_s: float = 0.0  # left of a pause a 429 asked for


def _number(n: float) -> str:
    if n >= 100_000:
        return f"{n / 1e6:.3g}M" if n >= 1_000_000 else f"{n / 1e3:.0f}k"
    return f"{n:,.0f}" if n >= 10 or n == int(n) else f"{n:.2g}"


def _parts(m: ModelLimits) -> list[tuple[str, str]]:
    parts = []
    if m.rpm:
        parts.append((f"{_number(m.rpm)}/min", "learned" if m.rpm_learned else "given"))
    if m.tpm:
        parts.append((f"{_number(m.tpm)} tokens/min", "learned" if m.tpm_learned else "given"))
    return parts


def _described(m: ModelLimits, sep: str) -> str:
    """``1,200/min{sep}learned``, or each with its own word when they differ."""
    parts = _parts(m)
    if not parts:
        return "no limit known"
    if len({tag for _, tag in parts}) == 1:
        return ", ".join(n for n, _ in parts) + sep + parts[0][1]
    return ", ".join(f"{n} {tag}" for n, tag in parts)


def limits_text(models: Sequence[ModelLimits]) -> str | None:
    """``limit 1,200/min learned``; with several models, each named; None: no limit known."""
    known = [m for m in models if m.rpm or m.tpm]
    if not known:
        return None
    if len(known) == 1 and len(models) == 1:
        return f"limit {_described(known[0], ' ')}"
    shown = [f"{m.model or '(none)'} {_described(m, ' ')}" for m in known[:_SHOWN_MODELS]]
    more = f"; +{len(known) - _SHOWN_MODELS} more" if len(known) > _SHOWN_MODELS else ""
    return "limits " + "; ".join(shown) + more


def waiting_text(
    models: Sequence[ModelLimits],
    *,
    now: float,
    in_flight: int,
    retry_in_s: float | None = None,
) -> str | None:
    """What the run is waiting for now, or None (sending, or nothing to say).

    ``now`` is the wall clock, for the "until"; ``retry_in_s`` is when the next job not due
    yet comes due, when no job is claimed (else None).
    """
    paused = max(models, key=lambda m: m.paused_s, default=None)
    if paused is not None and paused.paused_s > 0:
        return (
            f"waiting: the provider asked for a pause (429) until {_clock(now + paused.paused_s)}"
        )
    slowest = max(models, key=lambda m: m.wait_s, default=None)
    if slowest is not None and (
        slowest.wait_s >= NOTICEABLE_S or (slowest.wait_s > 0 and not in_flight)
    ):
        which = f"{slowest.model}: " if len(models) > 1 and slowest.model else ""
        until = (
            f"until {_clock(now + slowest.wait_s)}"
            if slowest.wait_s < _FAR_S
            else "until one request sent alone gets through"
        )
        return f"waiting for the rate limit ({which}{_described(slowest, ', ')}) {until}"
    if not in_flight and retry_in_s is not None and retry_in_s > 0:
        return (
            f"waiting for a backoff: retries not due yet, the next at "
            f"{_clock(now + retry_in_s)} ({duration_text(retry_in_s)})"
        )
    return None


# A wait longer than this has no time to show: a probe is out (a limit learned from 429s).
_FAR_S = 10 * 365 * 86400.0


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S")
