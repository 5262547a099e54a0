"""Benchmark: CPU per request of the provider path alone, two or more aiq trees in one process.

``OpenAIProvider.send`` over ``AiohttpTransport`` (build the request, aiohttp, read the reply,
parse it and its rate-limit headers) against ``bench/cpu.py``'s padded server in a process of
its own: 2 KB prompts and replies, 300 connections, 50 ms latency. Each tree is copied in as a
package of its own (``aiq_<label>``: aiq's imports are all relative) and the trees take turns,
batch by batch, so the machine's load hits them alike; whole runs of ``bench/cpu.py`` vary
±10% between runs on a shared VM, more than a change of a few percent. Reported: the main
thread's CPU µs per request, median and min over the batches.

    .venv/bin/python bench/provider_ab.py base=/tmp/base/src new=src
"""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REQUESTS, CONNECTIONS, BATCHES = 1500, 300, 12


async def measure(port: int, trees: dict[str, Any]) -> dict[str, list[float]]:
    filler = "the quick brown fox jumps over the lazy dog " * 50

    def body(i: int) -> bytes:
        message = {"role": "user", "content": (f"p {i}: " + filler)[:2048]}
        return json.dumps({"model": "gpt-4o-mini", "messages": [message]}).encode()

    bodies = [body(i) for i in range(REQUESTS)]
    providers = {}
    for label, (openai, transport_module) in trees.items():
        transport = transport_module.AiohttpTransport(max_connections=CONNECTIONS)
        base_url = f"http://127.0.0.1:{port}/v1"
        providers[label] = (
            transport,
            openai.OpenAIProvider(transport, base_url=base_url, api_key="sk-bench-0123456789"),
        )

    async def batch(provider: Any) -> None:
        queue = list(range(REQUESTS))

        async def sender() -> None:
            while queue:
                reply = await provider.send("/v1/chat/completions", bodies[queue.pop()])
                assert reply.status_code == 200 and reply.limits is not None

        await asyncio.gather(*(sender() for _ in range(CONNECTIONS)))

    for _, provider in providers.values():
        await batch(provider)  # warm-up: connections opened
    times: dict[str, list[float]] = {label: [] for label in providers}
    order = list(providers.items())
    for n in range(BATCHES):
        for label, (_, provider) in order if n % 2 == 0 else order[::-1]:
            began = time.thread_time()
            await batch(provider)
            times[label].append((time.thread_time() - began) / REQUESTS * 1e6)
    for transport, _ in providers.values():
        await transport.aclose()
    return times


def main() -> None:
    labelled = dict(arg.split("=", 1) for arg in sys.argv[1:])
    if not labelled:
        raise SystemExit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        sys.path.insert(0, tmp)
        for label, src in labelled.items():
            shutil.copytree(Path(src) / "aiq", Path(tmp) / f"aiq_{label}")
            trees[label] = (
                importlib.import_module(f"aiq_{label}.providers.openai"),
                importlib.import_module(f"aiq_{label}.transport"),
            )
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "cpu.py"), "--serve", "--rpm", "6000000",
             "--latency", "0.05", "--reply-bytes", "2048", "--server-mode", "per-second"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None and server.stdin is not None
        port = int(server.stdout.readline().split()[1])
        try:
            times = asyncio.run(measure(port, trees))
        finally:
            server.stdin.close()
            server.wait()
    for label, values in times.items():
        row: dict[str, object] = {"tree": label, "src": labelled[label]}
        row["median_us_per_req"] = round(statistics.median(values))
        row["min_us_per_req"] = round(min(values))
        row["batches"] = [round(v) for v in values]
        print(json.dumps(row))


if __name__ == "__main__":
    main()
