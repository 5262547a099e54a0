"""The fake server as a process, for benchmarks: ``python tests/fakeserver --port 0 --latency 0``
(or ``python -m fakeserver`` with ``tests`` on the path) prints ``READY <port>`` once it listens
and serves until killed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from . import modes
from .faults import _DRAWN
from .server import FakeServer


def main(argv: list[str] | None = None) -> None:
    """Serve until killed; print ``READY <port>`` on stdout once listening."""
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible server on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--transient-rate", type=float, default=0.0)
    parser.add_argument("--require-key", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rpm", type=int, default=None, help="requests per minute")
    parser.add_argument("--tpm", type=int, default=None, help="tokens per minute")
    parser.add_argument(
        "--limit-window", type=float, default=60.0, help="seconds; 1 enforces per second"
    )
    parser.add_argument(
        "--limit-mode",
        choices=sorted(modes.MODES),
        default=None,
        help="count --rpm/--tpm as this provider does (tests/modes.py)",
    )
    parser.add_argument("--rpd", type=int, default=None, help="requests per day (groq)")
    parser.add_argument("--slots", type=int, default=None, help="served at once (headerless)")
    rates = ["reject_rate", *(knob for kind, knob in _DRAWN if kind != "transient")]
    for knob in rates:
        parser.add_argument("--" + knob.replace("_", "-"), type=float, default=0.0)
    parser.add_argument("--hang", type=float, default=30.0, help="seconds a hang lasts")
    parser.add_argument(
        "--batch-processing",
        type=float,
        default=0.0,
        help="seconds a batch (OpenAI or Anthropic) takes to complete",
    )
    args = parser.parse_args(argv)
    mode = None
    if args.limit_mode is not None:
        mode = modes.build(
            args.limit_mode, rpm=args.rpm, tpm=args.tpm, rpd=args.rpd, slots=args.slots
        )
        args.rpm = args.tpm = None
    server = FakeServer(
        port=args.port,
        latency_s=args.latency,
        transient_rate=args.transient_rate,
        require_key=args.require_key,
        seed=args.seed,
        rpm=args.rpm,
        tpm=args.tpm,
        limit_window_s=args.limit_window,
        hang_s=args.hang,
        limit_mode=mode,
        record=False,  # a benchmark sends millions of requests; nobody reads the log
        **{knob: getattr(args, knob) for knob in rates},
    )
    server.batches.processing_s = args.batch_processing
    server.message_batches.processing_s = args.batch_processing

    def ready(port: int) -> None:
        print(f"READY {port}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a person stops it
        asyncio.run(server.serve(on_ready=ready))
