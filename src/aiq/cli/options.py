"""The options several commands take, declared once (typer reads them from the annotations)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..contract import PROVIDER_NAMES

DbOpt = Annotated[
    Path | None, typer.Option("--db", help="Store path (default: .aiq/aiq.db, or $AIQ_DB).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML config (default: aiq.yaml if present).")
]
TracebackOpt = Annotated[bool, typer.Option("--traceback", help="Show tracebacks for errors.")]
OutOpt = Annotated[
    str | None, typer.Option("--out", help="Results file (default: <input>.results.jsonl).")
]
DeadOpt = Annotated[
    str | None, typer.Option("--dead", help="Dead letters (default: <input>.dead.jsonl).")
]
ProviderOpt = Annotated[
    str | None, typer.Option("--provider", help=f"{' | '.join(PROVIDER_NAMES)}.")
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="API base URL (default: $OPENAI_BASE_URL, or $ANTHROPIC_BASE_URL for anthropic).",
    ),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Model for lines naming none.")]
PriorityOpt = Annotated[
    int | None,
    typer.Option(
        "--priority",
        help="Priority of the file's lines that name none (default 0); higher is sent first.",
    ),
]
ConcurrencyOpt = Annotated[
    str | None,
    typer.Option(
        "--concurrency", help="Requests in flight: a number, or auto (sized to the rate limits)."
    ),
]
MaxOutageOpt = Annotated[
    float | None,
    typer.Option(
        "--max-outage", help="Seconds to wait for a provider that is down, then exit 4 (resumable)."
    ),
]
RpmOpt = Annotated[int | None, typer.Option("--rpm", help="Requests per minute limit.")]
TpmOpt = Annotated[int | None, typer.Option("--tpm", help="Tokens per minute limit.")]
AttemptsOpt = Annotated[
    int | None, typer.Option("--max-attempts", help="Failed attempts before a job is dead.")
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        help="Longest a call may take, seconds (default 600); shorter per model once its "
        "replies show how long they take.",
    ),
]
OrderOpt = Annotated[
    str | None, typer.Option("--order", help="Results order: done (finish time) | input.")
]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Refuse the whole file if any line is invalid.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final summary.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")]
MaxRuntimeOpt = Annotated[
    float | None,
    typer.Option("--max-runtime", help="Stop claiming after SECONDS, drain, exit 5 (resumable)."),
]
MetricsOpt = Annotated[
    str | None,
    typer.Option("--metrics-file", help="Write Prometheus metrics here (textfile collector)."),
]
LogFileOpt = Annotated[
    Path | None, typer.Option("--log-file", help="Append timestamped progress and summary here.")
]
LogFormatOpt = Annotated[
    str,
    typer.Option(
        "--log-format",
        help="text | json: JSON lines, one an attempt, to --log-file or stderr (default: text).",
        show_default=False,
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run", help="Validate and forecast requests, tokens, cost and ETA; send nothing."
    ),
]
MaxCostOpt = Annotated[
    float | None,
    typer.Option(
        "--max-cost", help="Stop claiming before the store's spend would pass USD; exit 5."
    ),
]
RerouteOpt = Annotated[
    bool,
    typer.Option(
        "--reroute",
        help="Send the store's unfinished jobs to this provider or base URL, not the recorded one.",
    ),
]
OnTruncatedOpt = Annotated[
    str | None,
    typer.Option(
        "--on-truncated",
        help="A reply cut off at max_tokens: keep it as a result (default) | dead-letter it.",
    ),
]
WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        help="Wait up to SECONDS for another run to release the store (default: 0, fail at once).",
        show_default=False,  # as every other option: in the help text, in parentheses
    ),
]
ViaOpt = Annotated[
    str | None,
    typer.Option(
        "--via",
        help="How jobs are sent: online (one call each, the default) | flex (online at "
        "OpenAI's flex tier: half price, slower) | batch (the provider's batch engine: half "
        "price, results within 24 h) | auto (batch; online once --deadline needs it). Kept "
        "by the store for resume.",
    ),
]
DeadlineOpt = Annotated[
    str | None,
    typer.Option(
        "--deadline",
        help="With --via auto: when the jobs must be done, a time (06:00, 2026-12-02T06:00, "
        "local unless it names an offset) or a duration (6h, 90m, 1h30m). Batch first, "
        "online once the batches could no longer make it. Kept by the store for resume.",
    ),
]
DetachOpt = Annotated[
    bool,
    typer.Option(
        "--detach",
        help="With --via batch: submit the batches and exit 0; a later resume collects them.",
    ),
]
