"""Benchmark: which HTTP stack should sit under aiq's providers?

Starts ``tests/fakeserver`` (latency 0) as a subprocess, then measures requests/s for:

  (a) a bare aiohttp ClientSession loop: the ceiling for anything built on aiohttp
  (b) httpx + the ``httpx-aiohttp`` transport
  (c) plain httpx (httpcore pool)
  (d) httpx + ``aiq.transport.AiohttpTransport`` via ``make_client``: what aiq ships

and two rows that explain (d) rather than compete with it:

  (d0) the same transport called directly, no ``httpx.AsyncClient``: splits (d)'s cost into
       "transport" and "httpx client layer"
  (d1) (d) with the URL passed as a pre-parsed ``httpx.URL`` instead of a str: what a provider
       saves by parsing its endpoint URL once

Each run sends N POST /v1/chat/completions (unique ~180-byte bodies, an Authorization header, the
reply read whole) from C concurrent coroutines over C connections, after a warm-up that opens the
connections. Stacks are interleaved across repetitions so drift hits all alike. With two or more
cores the server is pinned to one core and this process to another.

Besides req/s it reports the client's CPU time per request, which is steadier than wall-clock
rates on a shared VM, and how busy the server's core was (well below 100%: it is not the limit).

    .venv/bin/python bench/http_stack.py [--requests 4000] [--connections 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing aiq

from aiq.transport import AiohttpTransport, make_client  # noqa: E402

HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
WARMUP = 256

Send = Callable[[bytes], Awaitable[bytes]]
Row = tuple[float, float, float]  # req/s, client CPU us per request, server core busy fraction


def bodies(n: int) -> list[bytes]:
    return [
        orjson.dumps(
            {
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "You are a terse assistant."},
                    {"role": "user", "content": f"Summarise item {i} of the benchmark batch."},
                ],
                "max_tokens": 64,
            }
        )
        for i in range(n)
    ]


Rate = tuple[float, float]  # (requests per wall second, client CPU microseconds per request)


async def drive(send: Send, payloads: list[bytes], connections: int) -> Rate:
    """Send every payload from ``connections`` coroutines; return its :data:`Rate`."""
    queue = iter(payloads)

    async def worker() -> None:
        for body in queue:  # a shared iterator: each payload is taken exactly once
            await send(body)

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(connections)))
    n = len(payloads)
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n * 1e6


async def run_aiohttp(url: str, payloads: list[bytes], connections: int) -> Rate:
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def send(body: bytes) -> bytes:
            async with session.post(url, data=body, headers=HEADERS) as resp:
                return await resp.read()

        await drive(send, payloads[:WARMUP], connections)
        return await drive(send, payloads[WARMUP:], connections)


async def run_httpx(client: httpx.AsyncClient, url: str, payloads: list[bytes], c: int) -> Rate:
    async with client:

        async def send(body: bytes) -> bytes:
            resp = await client.post(url, content=body, headers=HEADERS)
            return resp.content

        await drive(send, payloads[:WARMUP], c)
        return await drive(send, payloads[WARMUP:], c)


async def run_httpx_aiohttp(url: str, payloads: list[bytes], connections: int) -> Rate:
    from httpx_aiohttp import HttpxAiohttpClient

    client = HttpxAiohttpClient(limits=httpx.Limits(max_connections=connections))
    return await run_httpx(client, url, payloads, connections)


async def run_plain_httpx(url: str, payloads: list[bytes], connections: int) -> Rate:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return await run_httpx(httpx.AsyncClient(limits=limits), url, payloads, connections)


async def run_aiq(url: str, payloads: list[bytes], connections: int) -> Rate:
    client = make_client(max_connections=connections, connect_timeout_s=10, read_timeout_s=60)
    return await run_httpx(client, url, payloads, connections)


async def run_aiq_parsed_url(url: str, payloads: list[bytes], connections: int) -> Rate:
    client = make_client(max_connections=connections, connect_timeout_s=10, read_timeout_s=60)
    parsed = httpx.URL(url)
    async with client:

        async def send(body: bytes) -> bytes:
            resp = await client.post(parsed, content=body, headers=HEADERS)
            return resp.content

        await drive(send, payloads[:WARMUP], connections)
        return await drive(send, payloads[WARMUP:], connections)


async def run_aiq_transport_only(url: str, payloads: list[bytes], connections: int) -> Rate:
    transport = AiohttpTransport(max_connections=connections)
    extensions = {"timeout": {"connect": 10.0, "read": 60.0, "write": 60.0, "pool": None}}

    async def send(body: bytes) -> bytes:
        request = httpx.Request("POST", url, content=body, headers=HEADERS, extensions=extensions)
        resp = await transport.handle_async_request(request)
        return await resp.aread()

    try:
        await drive(send, payloads[:WARMUP], connections)
        return await drive(send, payloads[WARMUP:], connections)
    finally:
        await transport.aclose()


STACKS: dict[str, tuple[str, Callable[[str, list[bytes], int], Coroutine[Any, Any, Rate]]]] = {
    "a": ("bare aiohttp ClientSession loop", run_aiohttp),
    "b": ("httpx + httpx-aiohttp", run_httpx_aiohttp),
    "c": ("plain httpx", run_plain_httpx),
    "d": ("httpx + aiq AiohttpTransport (make_client)", run_aiq),
    "d0": ("aiq AiohttpTransport alone, no AsyncClient", run_aiq_transport_only),
    "d1": ("(d) with a pre-parsed httpx.URL", run_aiq_parsed_url),
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (Linux), to show whether the server saturated."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(cpu: int | None) -> tuple[subprocess.Popen[str], int]:
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "fakeserver"), "--port", "0", "--latency", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    if not line.startswith("READY "):
        server.kill()
        raise SystemExit(f"fake server did not start: {line!r}")
    if cpu is not None:
        os.sched_setaffinity(server.pid, {cpu})
    return server, int(line.split()[1])


def measure(args: argparse.Namespace, url: str, server_pid: int) -> dict[str, list[Row]]:
    """Run every chosen stack ``args.repeat`` times, interleaved; rows per stack."""
    payloads = bodies(WARMUP + args.requests)
    rows: dict[str, list[Row]] = {key: [] for key in args.stacks.split(",")}
    for rep in range(args.repeat):
        for key, runs in rows.items():
            wall, server_cpu = time.perf_counter(), cpu_seconds(server_pid)
            rate, cpu_us = asyncio.run(STACKS[key][1](url, payloads, args.connections))
            busy = (cpu_seconds(server_pid) - server_cpu) / (time.perf_counter() - wall)
            runs.append((rate, cpu_us, busy))
            print(
                f"  rep {rep + 1} {key:>2}: {rate:6.0f} req/s, {cpu_us:5.0f} us client CPU/req, "
                f"server core {busy:4.0%} busy",
                file=sys.stderr,
                flush=True,
            )
    return rows


def table(rows: dict[str, list[Row]]) -> str:
    """A markdown table of medians; ratios are against (a), the bare aiohttp loop."""
    med = {
        key: [statistics.median(col) for col in zip(*runs, strict=True)]
        for key, runs in rows.items()
    }
    bare = med.get("a")
    lines = [
        "| stack | req/s median | req/s min-max | vs (a) | client CPU us/req | server core busy |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, runs in rows.items():
        rate, cpu_us, busy = med[key]
        rates = [r[0] for r in runs]
        ratio = f"{rate / bare[0]:.2f}x" if bare else "-"
        lines.append(
            f"| ({key}) {STACKS[key][0]} | {rate:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} "
            f"| {ratio} | {cpu_us:.0f} | {busy:.0%} |"
        )
    return "\n".join(lines)


# -- which exception each stack raises -------------------------------------------------------

FAILURES: dict[str, bytes | None] = {
    "connection refused": None,
    "server hangs up before replying": b"",
    "garbage status line": b"HELLO\r\n\r\n",
    "body shorter than Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc",
    "no reply within the read timeout": b"SLEEP",
}
ERROR_CLIENTS: dict[str, Callable[[], httpx.AsyncClient]] = {
    "b": lambda: _httpx_aiohttp_client(timeout=httpx.Timeout(2.0, read=0.2)),
    "c": lambda: httpx.AsyncClient(timeout=httpx.Timeout(2.0, read=0.2)),
    "d": lambda: make_client(max_connections=4, connect_timeout_s=2.0, read_timeout_s=0.2),
}


def _httpx_aiohttp_client(**kwargs: Any) -> httpx.AsyncClient:
    from httpx_aiohttp import HttpxAiohttpClient

    return HttpxAiohttpClient(**kwargs)


async def _outcome(make: Callable[[], httpx.AsyncClient], reply: bytes | None) -> str:
    """The exception class (or status) a POST gets from a server that answers ``reply``."""
    handlers: list[asyncio.Task[Any]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        await reader.readuntil(b"\r\n\r\n")
        if reply == b"SLEEP":
            await reader.read()  # until the client gives up and hangs up
        elif reply is not None:
            writer.write(reply)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    if reply is None:  # nobody listens on a port just released
        server.close()
        await server.wait_closed()
    try:
        async with make() as client:
            resp = await client.post(f"http://127.0.0.1:{port}/v1/x", content=b"{}")
            return f"HTTP {resp.status_code}"
    except Exception as exc:
        return f"{type(exc).__module__.split('.')[0]}.{type(exc).__name__}"
    finally:
        server.close()
        await server.wait_closed()
        # Let the handlers see the hang-up and finish, rather than be cancelled by asyncio.run.
        await asyncio.wait_for(asyncio.gather(*handlers, return_exceptions=True), 5)


def error_table() -> str:
    """A markdown table: for each failure, the exception each stack raises."""
    header = " | ".join(f"({key}) {STACKS[key][0]}" for key in ERROR_CLIENTS)
    lines = [f"| failure | {header} |", "|---" * (len(ERROR_CLIENTS) + 1) + "|"]
    for name, reply in FAILURES.items():
        cells = [asyncio.run(_outcome(make, reply)) for make in ERROR_CLIENTS.values()]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stacks", default=",".join(STACKS), help="comma-separated, e.g. a,d")
    args = parser.parse_args()

    if importlib.util.find_spec("httpx_aiohttp") is None:  # a bench-only package
        print("httpx-aiohttp is not installed: skipping (b)", file=sys.stderr)
        args.stacks = ",".join(k for k in args.stacks.split(",") if k != "b")
        ERROR_CLIENTS.pop("b")
    # SIGTERM would skip the finally below and orphan the server; make it an ordinary exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cpus = sorted(os.sched_getaffinity(0))
    pin = len(cpus) >= 2
    server, port = start_server(cpus[1] if pin else None)
    if pin:
        os.sched_setaffinity(0, {cpus[0]})
    print(
        f"{args.requests} requests, {args.connections} connections, {args.repeat} repetitions, "
        f"python {sys.version.split()[0]}, httpx {httpx.__version__}, aiohttp {aiohttp.__version__}"
        f", {'client and server pinned to one core each' if pin else 'unpinned'}",
        flush=True,
    )
    try:
        rows = measure(args, f"http://127.0.0.1:{port}/v1/chat/completions", server.pid)
    finally:
        server.terminate()
        server.wait()
    print()
    print(table(rows))
    print()
    print(error_table())


if __name__ == "__main__":
    main()
