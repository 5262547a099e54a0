"""Durations as messages write them: ``15 s``, ``1 min 30 s``, ``10 min``, ``2 h 5 min``.

``duration_text`` is for sentences (errors, outage lines), where ``0.25 min`` reads as a
riddle; tables, the live panel and status use the compact ``3m05s`` of ``fmt_duration``.
Dependency-free, as :mod:`aiq.text` is, so every layer can use both.
"""

from __future__ import annotations

__all__ = ["duration_text", "fmt_duration", "parse_age"]


def duration_text(seconds: float) -> str:
    """``seconds`` in the largest two units that say it: ``0.5 s``, ``15 s``, ``1 min 30 s``,
    ``10 min``, ``1 h 2 min``. Under 10 s to a tenth of a second, above to the second (the
    seconds are left out of hours)."""
    if seconds < 10:
        return f"{max(0.0, round(seconds, 1)):g} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        minutes, rest = divmod(s, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(round(s / 60), 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def fmt_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``, or ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds in an age as ``aiq prune`` takes it: a number and a unit, ``45s``, ``90m``,
    ``12h``, ``30d``, ``2w``. ValueError, saying what is taken, for anything else: a bare
    number would leave the reader to guess its unit, and a retention of 30 s for an intended
    30 days removes nearly everything."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    try:
        value = float(number) if unit in _UNITS_S else -1.0
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(
            f"{text!r} is not an age: give a number and a unit, like 30d, 12h, 90m, 2w"
        )
    return value * _UNITS_S[unit]
