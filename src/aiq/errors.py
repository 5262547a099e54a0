"""The one exception tree users see.

Every error aiq expects carries the process exit code of DESIGN.md and a message that says
what to do next; the CLI prints it as one ``error: …`` line. Anything else is a bug.

    AiqError                 exit 2 unless a subclass says otherwise
    ├── UsageError           2  bad flag, config or environment
    ├── InputError           2  a bad input file or line (names file, line, field)
    ├── StoreError           2  the database cannot be opened or written
    ├── OutputError          2  a results, dead-letter, metrics or log file cannot be written
    ├── StoreLocked          3  another run holds the store
    ├── FatalProviderError   4  auth, quota, unknown model, unreachable endpoint
    └── LimitReached         5  a limit the user set stopped the run (resumable)

Two more codes say a command finished but its input needs a look (no exception: the work was
done): SKIPPED_LINES 6, input lines were invalid and skipped; EMPTY_INPUT 7, the input file
held no line at all (a cron job whose generator failed).
"""

from __future__ import annotations


class AiqError(Exception):
    """Base of every error aiq expects; ``exit_code`` is what the CLI exits with.

    ``summary`` is what a run did before it stopped on this error (a fatal provider error
    ends a run that sent jobs), for the CLI to show; None for errors raised before a run. (An
    ``aiq.run_records.RunSummary``, typed ``object`` here: errors.py is the bottom of the
    import tree, and the summary's exit codes come from here.)
    """

    exit_code: int = 2

    def __init__(self, *args: object, summary: object | None = None) -> None:
        super().__init__(*args)
        self.summary = summary


class UsageError(AiqError):
    """A flag, config value or environment setting is wrong."""


class InputError(AiqError):
    """An input file cannot be read, or (with ``--strict``) holds invalid lines."""


class StoreError(AiqError):
    """The job store cannot be opened, migrated or written."""


class OutputError(AiqError):
    """A file aiq writes beside the store (results, dead letters, metrics, log) cannot be."""


class StoreLocked(AiqError):
    """Another ``aiq run`` or ``aiq resume`` holds the store."""

    exit_code = 3


class FatalProviderError(AiqError):
    """The provider refuses every request (auth, quota, model, endpoint): stop the run."""

    exit_code = 4


class LimitReached(AiqError):
    """The run stopped at a limit the user set; ``aiq resume`` continues."""

    exit_code = 5


class Interrupted(AiqError):
    """SIGINT/SIGTERM stopped the run after draining; ``aiq resume`` continues."""

    exit_code = 130


SKIPPED_LINES = 6  # finished, but invalid input lines were skipped (never sent, in no output)
EMPTY_INPUT = 7  # finished, but the input file held no line
