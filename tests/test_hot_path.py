"""What keeps aiq's CPU low at 500 requests/s (bench/README.md, "CPU at 500 requests/s") changes
nothing else: ``Post`` builds the request ``httpx.Request(content=...)`` builds, a reply read
straight from its stream is the one httpx's decoders give, and the GC threshold is the aiq
process's alone."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.providers.base import Post
from aiq.providers.openai import OpenAIProvider
from aiq.transport import AiohttpTransport

_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=3000),
    headers=st.dictionaries(
        st.sampled_from(["host", "Content-Length", "transfer-encoding"]) | _TOKEN,
        _VALUE,
        max_size=6,
    ),
    host=st.sampled_from(["127.0.0.1:8000", "api.openai.com", "[::1]:9", "h"]),
    path=st.sampled_from(["/v1/chat/completions", "/v1/messages", "/x%20y"]),
)
def test_post_builds_the_request_httpx_builds(
    body: bytes, headers: dict[str, str], host: str, path: str
) -> None:
    url = httpx.URL(f"http://{host}{path}")
    extensions = {"timeout": {"connect": 1.0, "read": 2.0, "write": 2.0, "pool": None}}
    theirs = httpx.Request("POST", url, headers=headers, content=body, extensions=extensions)
    ours = Post(url, httpx.Headers(headers), extensions).request(body)
    assert (ours.method, ours.url, ours.content) == (theirs.method, theirs.url, theirs.content)
    assert ours.headers.raw == theirs.headers.raw  # names, values, case and order
    assert ours.extensions == theirs.extensions


async def _recording_server(
    reply: bytes,
) -> tuple[asyncio.Server, list[tuple[bytes, dict[bytes, bytes], bytes]]]:
    """A keep-alive HTTP/1.1 server that answers every request with ``reply`` and records
    each request's line, headers and body as they came over the wire."""
    seen: list[tuple[bytes, dict[bytes, bytes], bytes]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            line, *fields = head[:-4].split(b"\r\n")
            headers = {k.lower(): v.strip() for k, v in (f.split(b":", 1) for f in fields)}
            body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
            seen.append((line, headers, body))
            writer.write(reply)
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


@pytest.mark.parametrize("encoding", ["gzip", None])
def test_provider_over_aiohttp_sends_the_request_and_decodes_the_reply(
    encoding: str | None,
) -> None:
    payload = orjson.dumps({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3}})
    sent = gzip.compress(payload) if encoding else payload
    named = f"Content-Encoding: {encoding}\r\n".encode() if encoding else b""
    reply = b"HTTP/1.1 200 OK\r\n%sx-request-id: req-7\r\nContent-Length: %d\r\n\r\n%s" % (
        named,
        len(sent),
        sent,
    )

    async def main() -> tuple[list, list[bytes]]:
        server, seen = await _recording_server(reply)
        port = server.sockets[0].getsockname()[1]
        transport = AiohttpTransport(max_connections=2)
        provider = OpenAIProvider(
            transport, base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test-0123456789"
        )
        bodies = [b'{"model":"m","messages":[]}', "é".encode() * 1500]
        try:
            got = [(await provider.send("/v1/chat/completions", b)).body for b in bodies]
        finally:
            await transport.aclose()
            server.close()
            await server.wait_closed()
        return seen, got

    seen, got = asyncio.run(main())
    assert got == [payload, payload]  # decoded if encoded, byte for byte either way
    for (line, headers, body), sent in zip(
        seen, [b'{"model":"m","messages":[]}', "é".encode() * 1500], strict=True
    ):
        assert line == b"POST /v1/chat/completions HTTP/1.1"
        assert body == sent
        assert headers[b"content-length"] == str(len(sent)).encode()
        assert headers[b"host"] == seen[0][1][b"host"] and headers[b"host"].startswith(
            b"127.0.0.1:"
        )
        assert headers[b"authorization"] == b"Bearer sk-test-0123456789"
        assert headers[b"content-type"] == b"application/json"
        assert headers[b"accept-encoding"] == b"gzip, deflate"


@pytest.mark.slow
def test_the_aiq_process_collects_garbage_less_often_and_the_library_leaves_gc_alone() -> None:
    """``aiq`` raises the GC's first threshold (cli.main); importing aiq changes nothing."""
    script = (
        "import atexit, gc, sys\n"
        "before = gc.get_threshold()\n"
        "import aiq, aiq.cli, aiq.runner\n"
        "print(gc.get_threshold() == before, flush=True)\n"
        "atexit.register(lambda: print(gc.get_threshold(), flush=True))\n"
        "sys.argv = ['aiq', '--version']\n"
        "aiq.cli.main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    lines = proc.stdout.split()
    assert lines[0] == "True", proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("(50000, 10, 10)"), proc.stdout + proc.stderr
