"""Words and figures as aiq's messages write them: counts with their noun, dollars, quoted
provider errors.

Dependency-free, so the engine (a worker's error messages), the library (runner, replay) and
the views (report, progress) can all say things the same way without importing each other.
Durations are in :mod:`aiq.durations`.
"""

from __future__ import annotations

__all__ = ["plural", "quoted", "size_text", "usd"]


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 request``, ``2,000 requests``: a count and its noun, agreeing (``nouns`` when the
    plural is not the noun and an s)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {nouns or noun + 's'}"


def usd(value: float | None) -> str:
    """``$1,234.56``; more decimals under a dollar, where cents would hide a test batch."""
    if value is None:
        return "?"
    if value == 0:
        return "$0"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}" if abs(value) >= 0.01 else f"${value:.6f}"


def quoted(message: str, limit: int = 300) -> str:
    """A provider's error for a sentence of aiq's: cut to ``limit`` characters, without its
    full stop."""
    if not message:
        return "no error recorded"
    message = message.rstrip(". ")  # it goes inside a sentence
    return message if len(message) <= limit else message[: limit - 1] + "…"


def size_text(n_bytes: int) -> str:
    """``512 B``, ``12.3 KB``, ``4.5 MB``, ``1.2 GB`` (powers of 1,000, as disks are sold)."""
    if n_bytes < 1000:
        return f"{n_bytes} B"
    size = n_bytes / 1000
    for unit in ("KB", "MB"):
        if size < 999.95:
            return f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
