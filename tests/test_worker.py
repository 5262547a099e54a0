"""The worker and OpenAIProvider over httpx.MockTransport, with a real SQLite store in tmp_path.

Every reply is scripted per prompt, so each test says exactly what the server does to which
job, and checks what the store holds afterwards (state, attempts, error, response), the
requests that reached the "server", and the worker's counters. Backoff is cut to
milliseconds and the limiter's sleep is recorded, so nothing here waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fakes import Recorder, TurnCounter

from aiq.contract import ErrorType, StateName
from aiq.enqueue import add_file
from aiq.inputs import Defaults
from aiq.limiter import RateLimiter
from aiq.loop_turns import PER_TURN
from aiq.providers.base import ProviderError
from aiq.providers.openai import OpenAIProvider
from aiq.records import DEAD, DONE, QUEUED, RUNNING, Job, Outcome, Source
from aiq.requestfile import read_requests
from aiq.run_records import Progress
from aiq.store import RESULT_COLUMNS, JobStore
from aiq.worker import RetryPolicy, Worker

KEY = "sk-test-worker"
BASE_URL = "http://api.test/v1"
FAST = RetryPolicy(max_attempts=3, base_s=0.001, cap_s=0.01)

Reply = httpx.Response | Exception
Script = Callable[[str, int], Reply]  # (prompt, how many times it was sent before) -> reply


def completion(prompt: str, *, tokens: tuple[int, int] = (7, 3)) -> httpx.Response:
    """A well-formed chat completion for ``prompt``."""
    body = {
        "id": f"chatcmpl-{prompt}",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"re: {prompt}"}}],
        "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]},
    }
    return httpx.Response(200, json=body, headers={"x-request-id": f"req-{prompt}"})


def error(status: int, message: str, *, code: str | None = None, **headers: str) -> httpx.Response:
    """An OpenAI-shaped error reply."""
    body = {"error": {"message": message, "type": "error", "param": None, "code": code}}
    return httpx.Response(status, json=body, headers=headers)


class Server(Recorder):
    """A MockTransport handler that answers each prompt as ``script`` says, and logs calls."""

    def __init__(self, script: Script) -> None:
        super().__init__(self._answer)
        self.script = script
        self.calls: Counter[str] = Counter()
        self.on_request: Callable[[], None] | None = None

    def _answer(self, request: httpx.Request) -> httpx.Response:
        prompt = orjson.loads(request.content)["messages"][-1]["content"]
        seen = self.calls[prompt]
        self.calls[prompt] += 1
        if self.on_request is not None:
            self.on_request()
        reply = self.script(prompt, seen)
        if isinstance(reply, Exception):
            raise reply
        return reply


class FakeClock:
    """The worker's time, moved only by its sleeps: the monotonic clock, the wall clock (a
    fixed distance ahead) and the sleep. A sleep yields once, so other tasks run, then moves
    the clock to its end if it is not there yet: sleeps side by side overlap, as they would."""

    START = 1000.0

    def __init__(self) -> None:
        self.now = self.START

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + 1_800_000_000.0

    @property
    def elapsed_s(self) -> float:
        return self.now - self.START

    async def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        until = self.now + seconds
        await asyncio.sleep(0)
        self.now = max(self.now, until)


@dataclass
class Run:
    """What a run left behind: per-prompt store rows, the worker, the server and the store."""

    rows: dict[str, dict[str, Any]]
    worker: Worker
    server: Server
    counts: dict[StateName, int]
    sleeps: list[float]


async def _rows(store: JobStore, source: Source) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for state in (QUEUED, RUNNING, DONE, DEAD):
        async for batch in store.result_rows(source, state=state):
            for row in batch:
                item = dict(zip(RESULT_COLUMNS, row, strict=True))
                item["state"] = state
                rows[item["custom_id"]] = item
    return rows


def run_worker(
    tmp_path: Path,
    prompts: list[str],
    script: Script,
    *,
    concurrency: int | None = 1,
    retry: RetryPolicy = FAST,
    configure: Callable[[Worker, Server], None] | None = None,
    on_sleep: Callable[[Worker], None] | None = None,
    clock: FakeClock | None = None,
) -> Run:
    """Enqueue one prompt line per prompt (custom_id = prompt), run a Worker to the end.

    The limiter's clock stands still and its sleep only records how long it was asked to
    wait (then calls ``on_sleep``), so pauses are checked without waiting them out. With
    ``clock``, the worker runs on it instead, and makes its own limiters and breakers.
    """
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"custom_id": p, "prompt": p}) + b"\n" for p in prompts))
    server = Server(script)
    sleeps: list[float] = []
    workers: list[Worker] = []

    async def record_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if on_sleep is not None:
            on_sleep(workers[0])

    async def scenario() -> Run:
        store = await JobStore.open(tmp_path / "aiq.db")
        try:
            source = await store.add_source(
                str(path), out_path=str(tmp_path / "out"), dead_path=str(tmp_path / "dead")
            )
            await add_file(store, source, read_requests(path, Defaults(model="m")))
            provider = OpenAIProvider(httpx.MockTransport(server), base_url=BASE_URL, api_key=KEY)
            if clock is None:
                limiter = RateLimiter(clock=lambda: 0.0, sleep=record_sleep)
                worker = Worker(
                    store, provider, concurrency=concurrency, limiter=limiter, retry=retry
                )
            else:
                worker = Worker(
                    store, provider, concurrency=concurrency, retry=retry,
                    clock=clock, wall=clock.wall, sleep=clock.sleep,
                )  # fmt: skip
            workers.append(worker)
            if configure is not None:
                configure(worker, server)
            await asyncio.wait_for(worker.run(), 10)
            counts = (await store.stats()).counts
            return Run(await _rows(store, source), worker, server, counts, sleeps)
        finally:
            await store.close()

    return asyncio.run(scenario())


def always(reply: Callable[[str], Reply]) -> Script:
    return lambda prompt, _seen: reply(prompt)


def first(replies: list[Callable[[str], Reply]]) -> Script:
    """The n-th send of a prompt gets ``replies[n]``; later sends get a completion."""
    return lambda p, seen: replies[seen](p) if seen < len(replies) else completion(p)


# -- success -------------------------------------------------------------------------------------
@pytest.mark.parametrize("concurrency", [None, 2_000], ids=["auto", "fixed"])
def test_no_more_senders_start_than_jobs_are_left(tmp_path: Path, concurrency: int | None) -> None:
    """Told only a tokens limit, auto's size is its bound (20,000 on a big machine) until a
    request's cost is known: 10 jobs get 10 sender tasks, not a task per slot of the bound
    (20,000 held the loop 0.1 s as the run began, and the first paced slot went that late).
    A fixed --concurrency larger than the batch, the same."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"prompt": f"p{i}"}) + b"\n" for i in range(10)))
    tasks: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        tasks.append(len(asyncio.all_tasks()))
        return completion(orjson.loads(request.content)["messages"][-1]["content"])

    async def scenario() -> Progress:
        store = await JobStore.open(tmp_path / "aiq.db")
        try:
            source = await store.add_source(str(path), out_path="o", dead_path="d")
            await add_file(store, source, read_requests(path, Defaults(model="m")))
            provider = OpenAIProvider(httpx.MockTransport(answer), base_url=BASE_URL, api_key=KEY)
            worker = Worker(
                store, provider, concurrency=concurrency, max_concurrency=5_000,
                limiter=RateLimiter(tpm=6_000_000), progress=Progress(total=10),
            )  # fmt: skip
            return await asyncio.wait_for(worker.run(), 10)
        finally:
            await store.close()

    assert asyncio.run(scenario()).done == 10
    assert max(tasks) <= 10 + 5, tasks  # the senders, the run's own and the store's (12 here)


def test_200_is_recorded_as_sent_and_counted(tmp_path: Path) -> None:
    run = run_worker(tmp_path, ["a", "b", "c"], always(completion), concurrency=2)

    assert run.counts == {"queued": 0, "running": 0, "done": 3, "dead": 0}
    row = run.rows["a"]
    assert row["state"] == DONE and row["attempts"] == 1 and row["status_code"] == 200
    assert row["request_id"] == "req-a"
    assert orjson.loads(row["response"])["choices"][0]["message"]["content"] == "re: a"
    assert row["error_type"] is None and row["finished_at"] >= row["first_attempt_at"]
    p = run.worker.progress
    assert (p.done, p.done_now, p.dead, p.retries, p.in_flight) == (3, 3, 0, 0, 0)
    assert (p.tokens_in, p.tokens_out) == (21, 9)
    assert run.worker.fatal is None


def test_request_carries_url_headers_body_and_timeouts(tmp_path: Path) -> None:
    run = run_worker(tmp_path, ["a"], always(completion))

    (request,) = run.server.requests
    assert request.method == "POST"
    assert str(request.url) == "http://api.test/v1/chat/completions"  # no "/v1/v1"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert orjson.loads(request.content) == {
        "model": "m",
        "messages": [{"role": "user", "content": "a"}],
    }
    assert request.extensions["timeout"] == {
        "connect": 10.0,
        "read": 120.0,
        "write": 120.0,
        "pool": None,
    }


# -- retries -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "pause_s"),
    [({"retry-after": "0.002"}, 0.002), ({"retry-after-ms": "3"}, 0.003)],
    ids=["retry-after", "retry-after-ms"],
)
def test_429_pauses_every_sender_and_costs_no_attempt(
    tmp_path: Path, headers: dict[str, str], pause_s: float
) -> None:
    def script(prompt: str, seen: int) -> Reply:
        if prompt == "a" and seen == 0:
            return error(429, "Rate limit reached", code="rate_limit_exceeded", **headers)
        return completion(prompt)

    run = run_worker(tmp_path, ["a", "b", "c"], script)

    assert run.counts["done"] == 3
    assert run.rows["a"]["attempts"] == 1  # the 429 was not counted against the job
    assert run.server.calls == {"a": 2, "b": 1, "c": 1}
    # The clock stands still, so every send after the 429 waits out the server's pause.
    assert run.sleeps == [pytest.approx(pause_s)] * 3
    assert run.worker.progress.retries == 1


def test_429_without_a_delay_still_pauses_for_the_backoff(tmp_path: Path) -> None:
    script = first([lambda p: error(429, "Too many requests")])
    run = run_worker(tmp_path, ["a"], script)

    assert run.rows["a"]["state"] == DONE and run.rows["a"]["attempts"] == 1
    assert len(run.sleeps) == 1 and 0 <= run.sleeps[0] <= FAST.base_s


def test_500_then_200_is_done_on_the_second_attempt(tmp_path: Path) -> None:
    script = first([lambda p: error(500, "The server had an error")])
    run = run_worker(tmp_path, ["a", "b"], script)

    assert run.counts["done"] == 2
    assert run.rows["a"]["attempts"] == 2 and run.rows["a"]["state"] == DONE
    assert run.server.calls == {"a": 2, "b": 2}
    assert run.worker.progress.retries == 2


@pytest.mark.parametrize(
    "reply",
    [
        lambda p: httpx.Response(200, content=b"<html>gateway</html>"),
        lambda p: httpx.Response(200, json={"id": "x", "object": "chat.completion"}),
        lambda p: httpx.Response(200, json=["not", "an", "object"]),
    ],
    ids=["not-json", "no-choices", "not-an-object"],
)
def test_malformed_200_is_retried(tmp_path: Path, reply: Callable[[str], Reply]) -> None:
    run = run_worker(tmp_path, ["a"], first([reply]))

    assert run.rows["a"]["state"] == DONE and run.rows["a"]["attempts"] == 2
    assert orjson.loads(run.rows["a"]["response"])["choices"]


@pytest.mark.parametrize(
    ("exc", "attempts"),
    [
        # Refused before the endpoint ever answered: not the job's fault, so no attempt.
        (httpx.ConnectError("connection refused"), 1),
        (httpx.RemoteProtocolError("server disconnected"), 2),
        (httpx.ReadTimeout("timed out"), 2),
    ],
    ids=["refused", "hang-up", "timeout"],
)
def test_transport_errors_are_retried(tmp_path: Path, exc: Exception, attempts: int) -> None:
    run = run_worker(tmp_path, ["a"], first([lambda p: exc]))

    assert run.rows["a"]["state"] == DONE and run.rows["a"]["attempts"] == attempts


def test_refused_after_the_endpoint_answered_costs_an_attempt(tmp_path: Path) -> None:
    def script(prompt: str, seen: int) -> Reply:
        if prompt == "b" and seen == 0:
            return httpx.ConnectError("connection refused")
        return completion(prompt)

    run = run_worker(tmp_path, ["a", "b"], script)  # one sender: "a" is answered first

    assert run.rows["b"]["state"] == DONE and run.rows["b"]["attempts"] == 2


def test_max_attempts_exhausted_is_dead_with_the_last_error(tmp_path: Path) -> None:
    run = run_worker(tmp_path, ["a", "b"], lambda p, seen: error(503, f"overloaded {seen}"))

    assert run.counts == {"queued": 0, "running": 0, "done": 0, "dead": 2}
    row = run.rows["a"]
    assert row["attempts"] == FAST.max_attempts
    assert (row["error_type"], row["status_code"]) == ("server", 503)
    assert row["error_message"] == f"HTTP 503: overloaded {FAST.max_attempts - 1}"
    assert run.server.calls == {"a": 3, "b": 3}
    p = run.worker.progress
    assert (p.dead, p.dead_now, p.retries) == (2, 2, 4)


# -- time: the worker's clock -------------------------------------------------------------------


def test_an_outage_is_waited_out_on_the_workers_clock_to_max_outage(tmp_path: Path) -> None:
    """Ten minutes of a provider answering 500 to everything, in no time: the breakers, the
    wait for the provider and the give-up at --max-outage all run on the injected clock."""
    clock = FakeClock()
    retry = RetryPolicy(max_attempts=3, base_s=0.001, cap_s=0.01, max_outage_s=600.0)
    prompts = [f"p{i}" for i in range(30)]
    loop_started = time.monotonic()
    run = run_worker(
        tmp_path, prompts, always(lambda _p: error(500, "down")), concurrency=4, retry=retry,
        clock=clock,
    )  # fmt: skip

    assert time.monotonic() - loop_started < 5.0  # 600 s on the clock
    assert run.worker.fatal is not None and run.worker.fatal.error_type == "outage"
    assert "failed every call for over 10 min (--max-outage)" in run.worker.fatal.message
    assert clock.elapsed_s > 600.0 and run.worker.progress.outage_s > 600.0
    assert run.counts["dead"] == 0 and run.counts["queued"] == len(prompts)
    assert max(r["attempts"] for r in run.rows.values()) == 1  # only those before it opened


def test_a_429s_pause_is_waited_on_the_workers_clock(tmp_path: Path) -> None:
    """A 429 asking for 30 s: the limiters the worker makes wait it out on its clock."""
    clock = FakeClock()

    def slow_down(prompt: str, seen: int) -> Reply:
        if prompt == "a" and not seen:
            return error(429, "Slow down", **{"retry-after": "30"})
        return completion(prompt)

    run = run_worker(tmp_path, ["a", "b"], slow_down, concurrency=1, clock=clock)

    assert run.counts["done"] == 2
    assert run.rows["a"]["attempts"] == 1  # the 429 cost none
    assert run.server.calls == {"a": 2, "b": 1}
    # The pause, and the retry's "plus up to 10%" (its backoff is waited on the clock too).
    assert 30.0 <= clock.elapsed_s < 35.0


# -- permanent and fatal errors ------------------------------------------------------------------


def test_400_is_dead_at_once_with_the_servers_message(tmp_path: Path) -> None:
    def script(prompt: str, seen: int) -> Reply:
        if prompt == "bad":
            return error(400, "Invalid 'messages[0].content': too long.")
        return completion(prompt)

    run = run_worker(tmp_path, ["ok", "bad"], script)

    row = run.rows["bad"]
    assert (row["state"], row["attempts"], row["status_code"]) == (DEAD, 1, 400)
    assert row["error_type"] == "invalid_request"
    assert row["error_message"] == "HTTP 400: Invalid 'messages[0].content': too long."
    assert run.server.calls["bad"] == 1
    assert run.rows["ok"]["state"] == DONE


def test_401_stops_the_run_and_leaves_every_job_queued(tmp_path: Path) -> None:
    run = run_worker(
        tmp_path, ["a", "b", "c", "d"], always(lambda p: error(401, "Incorrect API key"))
    )

    assert run.worker.fatal is not None and run.worker.fatal.error_type == "auth"
    assert "OPENAI_API_KEY" in run.worker.fatal.message  # says what to fix
    assert run.counts == {"queued": 4, "running": 0, "done": 0, "dead": 0}
    assert all(row["attempts"] == 0 for row in run.rows.values())
    assert sum(run.server.calls.values()) == 1  # one sender: nothing sent after the 401
    assert run.worker.progress.retries == 0


def test_fatal_error_drains_the_requests_in_flight(tmp_path: Path) -> None:
    """With many senders, what was already sent is recorded; nothing is dead-lettered."""

    def script(prompt: str, seen: int) -> Reply:
        return error(404, "The model `m` does not exist") if prompt == "p3" else completion(prompt)

    run = run_worker(tmp_path, [f"p{i}" for i in range(40)], script, concurrency=8)

    assert run.worker.fatal is not None and run.worker.fatal.error_type == "not_found"
    assert run.counts["dead"] == 0 and run.counts["running"] == 0
    assert run.counts["done"] == sum(run.server.calls.values()) - 1
    assert run.rows["p3"]["state"] == QUEUED and run.rows["p3"]["attempts"] == 0


def test_stop_releases_claimed_jobs_that_were_not_sent(tmp_path: Path) -> None:
    def configure(worker: Worker, server: Server) -> None:
        def stop_after_three() -> None:
            if len(server.requests) == 3:
                worker.stop()

        server.on_request = stop_after_three

    run = run_worker(
        tmp_path,
        [f"p{i}" for i in range(50)],
        always(completion),
        concurrency=2,
        configure=configure,
    )

    sent = sum(run.server.calls.values())
    assert 3 <= sent <= 4  # the other sender may have had one in flight
    assert run.counts == {"queued": 50 - sent, "running": 0, "done": sent, "dead": 0}
    assert run.worker.progress.done_now == sent
    assert all(row["attempts"] == 0 for row in run.rows.values() if row["state"] == QUEUED)


def test_stop_during_a_429_pause_sends_nothing_more(tmp_path: Path) -> None:
    """A sender held by the limiter when the run stops gives its job back unsent."""

    def script(prompt: str, seen: int) -> Reply:
        return error(429, "Slow down", **{"retry-after-ms": "5"})

    # The limiter's sleep stops the worker, as a signal arriving mid-pause would.
    run = run_worker(tmp_path, ["a", "b"], script, on_sleep=lambda worker: worker.stop())

    assert sum(run.server.calls.values()) == 1
    assert run.counts == {"queued": 2, "running": 0, "done": 0, "dead": 0}
    assert all(row["attempts"] == 0 for row in run.rows.values())


def test_a_deferred_job_keeps_its_attempts_and_error_and_a_new_run_brings_it_forward(
    tmp_path: Path,
) -> None:
    """What the store does with a job the limiter put off: back to queued until its slot, as
    it was; a retry's backoff, by contrast, is kept by ``undefer``."""
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"custom_id": p, "prompt": p}) + b"\n" for p in "abc"))
    t = 1_000_000.0

    def retry(job_id: int, attempts: int, next_at: float) -> Outcome:
        return Outcome(job_id, QUEUED, attempts, started_at=t, next_at=next_at,
                       status_code=500, error_type="server", error_message="HTTP 500")  # fmt: skip

    async def scenario() -> dict[str, tuple[Any, ...]]:
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            source = await store.add_source(str(path), out_path="o", dead_path="d")
            await add_file(store, source, read_requests(path, Defaults(model="m")))
            a, b, c = await store.claim(3, now=t)
            await store.record([retry(a.id, 1, t + 30), retry(c.id, 1, t + 1)])
            assert [j.id for j in await store.claim(3, now=t + 2)] == [c.id]
            await store.record([], deferred=[(t + 3600, b.id), (t + 3600, c.id)])
            # Only the retry comes due; it fails again, with a backoff past the next run.
            assert [j.id for j in await store.claim(3, now=t + 100)] == [a.id]
            await store.claim(0, now=t + 100, record=[retry(a.id, 2, t + 5000)])
            assert await store.undefer(now=t + 200) == 2
            again = await store.claim(3, now=t + 200)
            assert sorted((j.id, j.attempts) for j in again) == [(b.id, 0), (c.id, 1)]
            rows = await store._db.execute_fetchall(
                "SELECT id, state, attempts, next_at, error_type, deferred FROM jobs"
            )
            return {"abc"[i]: tuple(r) for i, r in enumerate(sorted(rows))}

    rows = asyncio.run(scenario())
    assert rows["a"][1:] == (QUEUED, 2, t + 5000, "server", 0)  # its backoff kept
    assert rows["b"][1:] == (RUNNING, 0, t + 200, None, 0)
    assert rows["c"][1:] == (RUNNING, 1, t + 200, "server", 0)  # its last error kept


def test_jobs_put_back_come_before_untried_ones_once_due(tmp_path: Path) -> None:
    """Ordered by next_at alone, a deferred job would wait behind every untried one."""
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"custom_id": p, "prompt": p}) + b"\n" for p in "abc"))
    t = 1_000_000.0

    async def scenario() -> list[list[str]]:
        async with await JobStore.open(tmp_path / "aiq.db") as store:
            source = await store.add_source(str(path), out_path="o", dead_path="d")
            await add_file(store, source, read_requests(path, Defaults(model="m")))

            async def claim(n: int, now: float) -> list[str]:
                jobs = await store.claim(n, now=now)
                return [orjson.loads(j.body)["messages"][0]["content"] for j in jobs]

            assert await claim(1, t) == ["a"]
            ((a_id,),) = await store._db.execute_fetchall("SELECT id FROM jobs WHERE state = 1")
            await store.record([], deferred=[(t + 10, a_id)])
            return [await claim(1, t + 5), await claim(1, t + 20), await claim(5, t + 20)]

    assert asyncio.run(scenario()) == [["b"], ["a"], ["c"]]


def test_the_send_queue_puts_jobs_back_from_waiting_first() -> None:
    from aiq.dispatch import _JobQueue

    queue = _JobQueue()
    for i, due_at in ((1, 0.0), (2, 0.0), (3, 123.0), (4, 0.0)):
        queue.put_nowait(Job(i, "/v1/chat/completions", b"{}", 0, None, "m", due_at))
    queue.put_nowait(None)
    got = [queue.get_nowait() for _ in range(5)]
    assert [j.id if j else None for j in got] == [3, 1, 2, 4, None]


# -- the provider on its own ---------------------------------------------------------------------


def _send(
    handler: Callable[[httpx.Request], httpx.Response],
    endpoint: str = "/v1/chat/completions",
    *,
    base_url: str = BASE_URL,
) -> Coroutine[Any, Any, Any]:
    """One ``send`` of an empty body through a keyless provider over ``handler``."""
    provider = OpenAIProvider(httpx.MockTransport(handler), base_url=base_url, api_key=None)
    return provider.send(endpoint, b"{}")


@pytest.mark.parametrize(
    ("headers", "expected_s"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"llm_provider-retry-after": "60"}, 60.0),  # LiteLLM router: its only hint
        ({}, None),
    ],
)
def test_provider_reads_the_servers_delay(headers: dict[str, str], expected_s: float) -> None:
    with pytest.raises(ProviderError) as info:
        asyncio.run(_send(lambda r: error(429, "slow down", **headers)))
    err = info.value
    assert (err.error_type, err.retryable, err.fatal) == ("rate_limit", True, False)
    assert err.retry_after_s == expected_s


def test_provider_urls_headers_and_gzip() -> None:
    payload = orjson.dumps({"object": "list", "data": [], "usage": {"prompt_tokens": 4}})
    headers = {"content-encoding": "gzip", "x-request-id": "req-9"}
    handler = Recorder(httpx.Response(200, content=gzip.compress(payload), headers=headers))
    seen = handler.requests

    async def main() -> Any:
        return await _send(handler, "/v1/embeddings", base_url="http://host:8000/")

    reply = asyncio.run(main())
    assert str(seen[0].url) == "http://host:8000/v1/embeddings"  # base without /v1 keeps it
    assert "authorization" not in seen[0].headers  # no key, no header
    assert reply.body == payload  # decoded, as the store keeps it
    assert (reply.request_id, reply.tokens_in, reply.tokens_out) == ("req-9", 4, 0)


def test_provider_classifies_fatal_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.UnsupportedProtocol("Request URL has an unsupported protocol 'ftp://'.")

    handlers: dict[str, Callable[[httpx.Request], httpx.Response]] = {
        "key": lambda r: error(401, "Incorrect API key provided", code="invalid_api_key"),
        "model": lambda r: error(404, "The model `x` does not exist", code="model_not_found"),
        "quota": lambda r: error(429, "You exceeded your current quota", code="insufficient_quota"),
        "base-url": refuse,
    }

    async def main() -> dict[str, tuple[ErrorType, bool, bool]]:
        out = {}
        for name, handler in handlers.items():
            with pytest.raises(ProviderError) as info:
                await _send(handler)
            out[name] = (info.value.error_type, info.value.retryable, info.value.fatal)
        return out

    assert asyncio.run(main()) == {
        "key": ("auth", False, True),
        "model": ("not_found", False, True),
        "quota": ("quota", False, True),
        "base-url": ("connection", False, True),
    }


def test_progress_counts_only_what_the_store_committed(tmp_path: Path) -> None:
    """Counters are bumped after the commit: a run's figures equal the store's."""

    def script(prompt: str, seen: int) -> Reply:
        if prompt.endswith("7"):
            return error(400, "no")
        # A third fail once (not most: that would look like an outage to the breaker).
        return completion(prompt) if seen or int(prompt[1:]) % 3 else error(502, "bad gateway")

    run = run_worker(tmp_path, [f"p{i}" for i in range(30)], script, concurrency=4)
    p: Progress = run.worker.progress
    assert (p.done, p.dead) == (run.counts["done"], run.counts["dead"]) == (27, 3)
    assert p.retries == 9  # p0, p3, ... p24 (p27 is dead at once)


def test_auto_starts_sender_tasks_as_its_size_needs_them_not_the_whole_bound(
    tmp_path: Path,
) -> None:
    # The bound may be what the machine allows (thousands): a task per possible sender from
    # the start would cost memory for nothing. With no limit known, auto starts at one.
    most_tasks = 0

    def script(prompt: str, _seen: int) -> Reply:
        nonlocal most_tasks
        most_tasks = max(most_tasks, len(asyncio.all_tasks()))
        return completion(prompt)

    run = run_worker(tmp_path, [f"p{i}" for i in range(40)], script, concurrency=None)
    assert run.counts["done"] == 40
    assert most_tasks < 100  # of a bound of 256 (the Worker's default max_concurrency)


def test_a_herd_of_senders_reaches_the_server_a_share_per_loop_turn(tmp_path: Path) -> None:
    # A thousand senders handed their jobs at once (one claim) would all build their
    # requests in one turn of the loop, which reads no socket meanwhile (aiq.loop_turns).
    per_turn: Counter[int] = Counter()
    counter: TurnCounter | None = None

    def script(prompt: str, _seen: int) -> Reply:
        assert counter is not None
        per_turn[counter.turn] += 1
        return completion(prompt)

    def configure(_worker: Worker, _server: Server) -> None:
        nonlocal counter
        counter = TurnCounter()

    run = run_worker(
        tmp_path, [f"p{i}" for i in range(1_000)], script, concurrency=1_000, configure=configure
    )
    assert run.counts["done"] == 1_000
    assert max(per_turn.values()) <= PER_TURN
    assert len(per_turn) >= 1_000 // PER_TURN
