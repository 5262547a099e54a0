"""What ``aiq check`` reports: a Finding per check, and the exit code they add up to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import FatalProviderError, UsageError

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of ``aiq check``. A failure of the provider (key refused, model missing,
    endpoint down) exits 4; of the config, environment or store, 2 (DESIGN.md)."""

    status: str  # OK, WARN or FAIL
    subject: str
    message: str
    fix: str | None = None
    provider: bool = False  # the provider's side, not the config's or the machine's

    def __str__(self) -> str:
        fix = f"  → {self.fix}" if self.fix and self.status != OK else ""
        return f"{self.status:<4} {self.subject}: {self.message}{fix}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "subject": self.subject,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(frozen=True, slots=True)
class CheckReport:
    """Every finding, in order, and the exit code they add up to."""

    findings: list[Finding]

    @property
    def exit_code(self) -> int:
        failed = [f for f in self.findings if f.status == FAIL]
        if any(not f.provider for f in failed):
            return UsageError.exit_code
        return FatalProviderError.exit_code if failed else 0
