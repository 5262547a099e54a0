"""``--deadline`` and the rule ``--via auto`` follows: batch first, online once it must.

A deadline is a time (ISO 8601 / RFC 3339: ``2026-12-02T06:00``, ``2026-12-02T06:00:00Z``;
a clock time ``06:00`` is the next one to come; local time unless it names an offset) or a
duration from now (``6h``, ``90m``, ``1h30m``, ``45s``). The store keeps it as seconds since
the epoch, so ``aiq resume`` (cron) works to the same deadline.

The switch: batch is half the price, but gives no promise of time short of its 24 h window.
So a run waits on its batches only while what remains could still be finished online in the
time left. It switches when::

    remaining / online_rate * MARGIN + allowance >= time_left

``MARGIN`` (1.25) covers an online rate that is a ceiling, not a promise (retries, 429s, a
slower model than the rate allows); the allowance covers cancelling the open batches, which
must end before their unfinished jobs can go online (OpenAI allows itself up to 10 minutes):
5 minutes, or a tenth of the time the run had to its deadline when that is shorter, so a
deadline an hour away is not spent on the allowance alone. The online rate is the configured
requests per minute of the model (``model_limits``, else ``rpm``); from a tokens-per-minute
limit alone, at ``TOKENS_PER_REQUEST`` a request; with neither, an assumed 60 a minute (a
conservative figure: the lowest tier of either provider allows more), said in the line.

Pure: time comes in as arguments, so every figure is tested without a clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import time as clock_time

from .durations import fmt_duration

__all__ = ["Outlook", "deadline_text", "online_rate", "parse_deadline"]

MARGIN = 1.25
ALLOWANCE_S = 300.0  # the most the allowance for cancelling is...
ALLOWANCE_SHARE = 0.1  # ...or this share of the time the run had, when less
ASSUMED_RPM = 60  # with no limit configured
TOKENS_PER_REQUEST = 1000  # to turn a tokens-per-minute limit alone into requests
MOST_S = 366 * 86400  # a deadline further off is a slip (a batch's window is 24 h)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.IGNORECASE)
_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
ACCEPTED = (
    "a time (2026-12-02T06:00, 06:00, 2026-12-02T06:00:00+01:00; local time unless it "
    "names an offset) or a duration from now (6h, 90m, 1h30m)"
)


def parse_duration(text: str) -> float | None:
    """Seconds in ``6h``, ``90m``, ``1h30m``, ``45s``, ``2d``; None if ``text`` is not one."""
    text = text.strip()
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            return None
        total += float(match[1]) * _UNITS_S[match[2].lower()]
        pos = match.end()
    return total if text and pos == len(text) else None


def parse_deadline(text: str, *, now: float) -> float:
    """The deadline ``text`` names, in seconds since the epoch. ValueError (quoting it) for
    text that is neither a time nor a duration, or a time not after ``now``."""
    seconds = parse_duration(text)
    if seconds is not None and seconds <= 0:
        raise ValueError(f"{text!r} is no time from now")
    at = now + seconds if seconds is not None else _parse_time(text.strip(), now)
    if at is None:
        raise ValueError(f"{text!r} is not a time or a duration")
    if at <= now:
        shown = datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")
        raise ValueError(f"{text!r} is in the past ({shown})")
    if at - now > MOST_S:
        raise ValueError(f"{text!r} is more than a year away")
    return at


def _parse_time(text: str, now: float) -> float | None:
    """A date and time (local unless it names an offset), or a clock time: the next one."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is not None and ("T" in text.upper() or " " in text or "-" in text):
        return (when if when.tzinfo else when.astimezone()).timestamp()
    try:
        clock = clock_time.fromisoformat(text)
    except ValueError:
        return None
    today = datetime.fromtimestamp(now).astimezone()
    at = datetime.combine(today.date(), clock, tzinfo=clock.tzinfo or today.tzinfo)
    if at.timestamp() <= now:
        at += timedelta(days=1)
    return at.timestamp()


def deadline_text(at: float, *, now: float) -> str:
    """``06:00`` (local), ``06:00:30``, with the date when it is not within a day."""
    when = datetime.fromtimestamp(at).astimezone()
    shown = when.strftime("%H:%M" if when.second == 0 else "%H:%M:%S")
    if abs(at - now) >= 86400:
        shown = when.strftime("%Y-%m-%d ") + shown
    return shown


def online_rate(
    rpm: int | None, tpm: int | None, model_limits: dict[str, tuple[int | None, int | None]],
    model: str | None,
) -> tuple[float, bool]:  # fmt: skip
    """Requests per minute online for ``model``, and whether it is configured (not assumed)."""
    rpm, tpm = model_limits.get(model or "", (rpm, tpm))
    if rpm:
        return float(rpm), True
    if tpm:
        return max(1.0, tpm / TOKENS_PER_REQUEST), True
    return float(ASSUMED_RPM), False


def allowance_s(span_s: float) -> float:
    """The time kept for cancelling, for a run that had ``span_s`` to its deadline."""
    return min(ALLOWANCE_S, ALLOWANCE_SHARE * max(0.0, span_s))


@dataclass(frozen=True, slots=True, kw_only=True)
class Outlook:
    """Where a run stands against its deadline at one look."""

    deadline: float
    now: float
    remaining: int  # jobs not finished: queued, and in open batches not done yet
    rpm: float  # online requests per minute
    rate_known: bool  # configured (else assumed)
    allowance_s: float

    @property
    def time_left_s(self) -> float:
        return self.deadline - self.now

    @property
    def online_s(self) -> float:
        """What the remaining jobs would take online at the rate."""
        return self.remaining / self.rpm * 60.0

    @property
    def needed_s(self) -> float:
        """What the switch must leave: the online time with the margin, and the allowance."""
        return self.online_s * MARGIN + self.allowance_s if self.remaining else 0.0

    @property
    def switch(self) -> bool:
        """Whether to cancel the open batches and finish online now."""
        return self.remaining > 0 and self.needed_s >= self.time_left_s

    @property
    def look_again_s(self) -> float:
        """The longest to wait before the next look: when the switch falls due if nothing
        finishes meanwhile."""
        return max(0.0, self.time_left_s - self.needed_s)

    def line(self, *, open_batches: int) -> str:
        """The decision, in one progress line."""
        rate = f"{self.rpm:,.0f}/min" + ("" if self.rate_known else " (assumed: no --rpm)")
        head = (
            f"deadline {deadline_text(self.deadline, now=self.now)} in "
            f"{fmt_duration(max(0.0, self.time_left_s))}: {self.remaining:,} left would take "
            f"{fmt_duration(self.online_s)} online at {rate}"
        )
        if not self.switch:
            then = fmt_duration(self.look_again_s)
            return f"{head}: batch first, online in {then} unless the batches get ahead"
        if open_batches:
            n = "1 open batch" if open_batches == 1 else f"{open_batches:,} open batches"
            return f"{head}: cancelling {n}, finishing online"
        return f"{head}: finishing online"
