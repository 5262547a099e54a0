"""The API key is written nowhere: not the store (-wal and -shm too), results, dead letters,
log, metrics, stdout or stderr, even when the provider quotes it back in an error. And every
file aiq writes that holds prompts or replies is owner-only (0600).

Two servers on 127.0.0.1: the fake OpenAI server (401 for a wrong key, permanent 400s, flaky
500s), and ``QuotingGateway``, which answers the way some providers and proxies do: a 401 that
names the key it got (as OpenAI's own does: "Incorrect API key provided: sk-…"), and errors that
echo the whole request, headers and all, back in their message.
"""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from conftest import API_KEY, aiq_env, read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer, chat_reply, prompt_of
from fakeserver import anthropic as fake_anthropic
from localserver import LocalServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

WRONG_KEY = "sk-wrong-9f8e7d6c5b4a-also-secret"
# The key and the parts of it a redaction might leave behind.
_SECRETS = [API_KEY, WRONG_KEY, API_KEY.removeprefix("sk-"), WRONG_KEY.removeprefix("sk-")]


def _leaks(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [s for s in _SECRETS if s.encode() in data]


def _assert_no_key_anywhere(root: Path, procs: list[subprocess.CompletedProcess[str]]) -> None:
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "aiq.db" for p in files)
    for path in files:
        assert not _leaks(path.read_bytes()), path
    for proc in procs:
        assert not _leaks(proc.stdout + proc.stderr), proc.stdout + proc.stderr


def _prompts(n: int, *, every: int, marker: str, tag: str) -> list[tuple[str, str]]:
    return [
        (f"{tag}{i}", f"{marker} question {tag}{i}" if i % every == 1 else f"question {tag}{i}")
        for i in range(n)
    ]


def _outputs_args(tmp_path: Path) -> list[str]:
    (tmp_path / "metrics").mkdir(exist_ok=True)  # a metrics file's directory must exist
    # Retries still happen, and their errors are recorded; only the waits between are short.
    (tmp_path / "aiq.yaml").write_text("backoff_base_s: 0.01\nbackoff_cap_s: 0.05\n")
    return [
        "--log-file", str(tmp_path / "logs" / "aiq.log"),
        "--metrics-file", str(tmp_path / "metrics" / "aiq.prom"),
    ]  # fmt: skip


def test_key_is_written_nowhere_with_the_fake_server(tmp_path: Path, server: FakeServer) -> None:
    server.transient_rate = 0.2  # retries, whose errors are recorded too
    server.latency_s = 0.01
    write_prompts(
        tmp_path / "batch.jsonl", _prompts(120, every=10, marker="FAIL_PERMANENT", tag="p")
    )
    args = ["--base-url", server.base_url, "--concurrency", "4", *_outputs_args(tmp_path)]
    procs = []

    # Killed mid-run, so a -wal and -shm are left behind to search as well.
    killed = start_aiq("run", "batch.jsonl", "--model", "m", *args, cwd=tmp_path)
    deadline = time.monotonic() + 30
    while len(server.requests) < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert (tmp_path / ".aiq" / "aiq.db-wal").exists()
    _assert_no_key_anywhere(tmp_path, [])

    procs.append(run_aiq("resume", *args, cwd=tmp_path))
    assert procs[-1].returncode == 1, procs[-1].stderr  # done, with dead letters
    assert read_jsonl(tmp_path / "batch.dead.jsonl")

    # A wrong key: the run stops at once, says which variable to fix, and does not quote it.
    procs.append(run_aiq("replay-dead", cwd=tmp_path))
    wrong = aiq_env(OPENAI_API_KEY=WRONG_KEY)
    procs.append(run_aiq("resume", *args, cwd=tmp_path, env=wrong))
    assert procs[-1].returncode == 4, procs[-1].stderr
    assert "OPENAI_API_KEY" in procs[-1].stderr
    procs += [run_aiq("status", cwd=tmp_path), run_aiq("export", cwd=tmp_path)]

    _assert_no_key_anywhere(tmp_path, procs)


# -- a provider that quotes the key back ---------------------------------------------------


class QuotingGateway(LocalServer):
    """An OpenAI-compatible server whose errors quote what it was sent, key included.

    - a key other than ``API_KEY``: 401 "Incorrect API key provided: <the key>"
    - a prompt with ``ECHO400``: 400 whose message is the request's headers and body
    - a prompt with ``ECHO500``: 500, the same (retried, then dead-lettered)
    - a prompt with ``ECHO200``: 200 whose body is not JSON but the echoed request
    - anything else: a normal chat completion
    """

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw)
        anthropic = request.path == fake_anthropic.PATH
        error = _anthropic_error if anthropic else _openai_error
        if anthropic:
            key = request.headers.get("x-api-key", "")
        else:
            key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if key != API_KEY:
            return error(401, f"Incorrect API key provided: {key}.")
        echo = f"you sent {dict(request.headers)} with {raw.decode()}"
        prompt = prompt_of(request.path, body)
        if "ECHO400" in prompt:
            return error(400, f"Invalid request: {echo}")
        if "ECHO500" in prompt:
            return error(500, f"Upstream failed: {echo}")
        if "ECHO200" in prompt:
            return web.Response(status=200, text=echo)
        if anthropic:
            return web.json_response(fake_anthropic.message_reply(body, prompt, "ok", 1, 1))
        return web.json_response(chat_reply(body, prompt))


def _openai_error(status: int, message: str) -> web.Response:
    code = "invalid_api_key" if status == 401 else None
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return web.json_response(body, status=status)


def _anthropic_error(status: int, message: str) -> web.Response:
    return web.json_response(fake_anthropic.error_body(status, message), status=status)


@pytest.fixture
def gateway() -> Iterator[QuotingGateway]:
    with QuotingGateway() as g:
        yield g


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_key_quoted_back_by_the_provider_is_written_nowhere(
    tmp_path: Path, gateway: QuotingGateway, provider: str
) -> None:
    prompts = [
        *_prompts(12, every=4, marker="ECHO400", tag="a"),
        *_prompts(12, every=4, marker="ECHO500", tag="b"),
        *_prompts(12, every=4, marker="ECHO200", tag="c"),
    ]
    write_prompts(tmp_path / "batch.jsonl", prompts)
    args = ["--base-url", gateway.base_url, "--provider", provider, "--max-attempts", "2",
            *_outputs_args(tmp_path)]  # fmt: skip
    key_env = f"{provider.upper()}_API_KEY"

    ran = run_aiq("run", "batch.jsonl", "--model", "m", *args, cwd=tmp_path, env=_env(key_env))

    assert ran.returncode == 1, ran.stderr
    dead = read_jsonl(tmp_path / "batch.dead.jsonl")
    assert {d["error"]["status_code"] for d in dead} == {400, 500, 200}
    # The quoted request is still there, so the message helps; only the key is gone.
    assert all("you sent" in d["error"]["message"] for d in dead), dead
    replayed = run_aiq("replay-dead", cwd=tmp_path)
    wrong = run_aiq("resume", *args, cwd=tmp_path, env=_env(key_env, WRONG_KEY))
    assert wrong.returncode == 4, wrong.stderr
    assert "Incorrect API key provided" in wrong.stderr and key_env in wrong.stderr
    status = run_aiq("status", cwd=tmp_path)

    _assert_no_key_anywhere(tmp_path, [ran, replayed, wrong, status])


def _env(key_env: str, key: str = API_KEY) -> dict[str, str]:
    env = aiq_env(**{key_env: key})
    env.pop("ANTHROPIC_BASE_URL", None)
    return env


# -- owner-only files ------------------------------------------------------------------------


def test_files_holding_prompts_or_replies_are_owner_only(
    tmp_path: Path, server: FakeServer
) -> None:
    write_prompts(
        tmp_path / "batch.jsonl", _prompts(60, every=10, marker="FAIL_PERMANENT", tag="p")
    )
    server.latency_s = 0.02
    args = ["--base-url", server.base_url, "--model", "m", "--concurrency", "4",
            "--out", "out/results.jsonl", "--dead", "out/dead.jsonl"]  # fmt: skip
    proc = start_aiq("run", "batch.jsonl", *args, cwd=tmp_path)
    db = tmp_path / ".aiq" / "aiq.db"
    wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
    deadline = time.monotonic() + 30
    while not (len(server.requests) > 10 and wal.exists()) and time.monotonic() < deadline:
        time.sleep(0.01)
    modes = {p.name: _mode(p) for p in (db, wal, shm)}  # while the run holds them open
    assert proc.wait(timeout=60) == 1
    modes |= {p.name: _mode(p) for p in (tmp_path / "out").iterdir()}

    assert modes == dict.fromkeys(
        ["aiq.db", "aiq.db-wal", "aiq.db-shm", "results.jsonl", "dead.jsonl"], 0o600
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
