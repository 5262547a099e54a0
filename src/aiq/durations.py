"""Durations as messages write them: ``15 s``, ``1 min 30 s``, ``10 min``, ``2 h 5 min``.

``duration_text`` is for sentences (errors, outage lines), where ``0.25 min`` reads as a
riddle; tables, the live panel and status use the compact ``3m05s`` of ``fmt_duration``.
Dependency-free, as :mod:`aiq.text` is, so every layer can use both.
"""

from __future__ import annotations

__all__ = ["duration_text", "fmt_duration"]


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
