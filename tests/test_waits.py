"""Why a run waits (aiq.waits): the words for the limits in force and for each kind of wait,
the panel and plain lines that show them, and a real run held by its rate limit saying so."""

from __future__ import annotations

import io
import re
from datetime import datetime
from pathlib import Path

import pytest
from conftest import API_KEY, run_aiq, write_prompts
from fakeserver import FakeServer
from rich.console import Console

from aiq.limiter import RateLimiter
from aiq.limiters import Limiters
from aiq.progress import LiveProgress, summary_line
from aiq.run_records import Progress
from aiq.waits import ModelLimits, limits_text, waiting_text

NOW = 1_800_000_000.0


def at(seconds: float) -> str:
    return datetime.fromtimestamp(NOW + seconds).strftime("%H:%M:%S")


def test_limits_given_or_learned() -> None:
    assert limits_text([ModelLimits("m", rpm=1200, rpm_learned=True)]) == "limit 1,200/min learned"
    assert limits_text([ModelLimits("m", rpm=60)]) == "limit 60/min given"
    both = ModelLimits("m", rpm=500, tpm=2_000_000, tpm_learned=True)
    assert limits_text([both]) == "limit 500/min given, 2M tokens/min learned"
    assert limits_text([ModelLimits("m", rpm=500, tpm=30_000)]) == (
        "limit 500/min, 30,000 tokens/min given"
    )
    assert limits_text([ModelLimits("m")]) is None  # none known: nothing to say
    several = [ModelLimits("a", rpm=10), ModelLimits("b", tpm=450_000, tpm_learned=True)]
    assert limits_text(several) == "limits a 10/min given; b 450k tokens/min learned"
    many = [ModelLimits(f"m{i}", rpm=10) for i in range(5)]
    assert limits_text(many) is not None and limits_text(many).endswith("; +2 more")  # type: ignore[union-attr]


def test_waiting_for_the_rate_limit_until_its_next_slot() -> None:
    m = ModelLimits("m", rpm=1200, rpm_learned=True, wait_s=12.0)
    assert waiting_text([m], now=NOW, in_flight=3) == (
        f"waiting for the rate limit (1,200/min, learned) until {at(12)}"
    )
    # An even pace's next slot a moment away is no wait worth saying while requests go...
    near = ModelLimits("m", rpm=1200, wait_s=0.05)
    assert waiting_text([near], now=NOW, in_flight=3) is None
    # ... but it is the reason when nothing is in flight.
    assert waiting_text([near], now=NOW, in_flight=0) == (
        f"waiting for the rate limit (1,200/min, given) until {at(0.05)}"
    )
    two = [ModelLimits("a", rpm=10, wait_s=5), ModelLimits("b", rpm=5, wait_s=9)]
    assert waiting_text(two, now=NOW, in_flight=0) == (
        f"waiting for the rate limit (b: 5/min, given) until {at(9)}"
    )


def test_waiting_for_a_pause_and_for_a_backoff() -> None:
    paused = ModelLimits("m", wait_s=30, paused_s=30)
    assert waiting_text([paused], now=NOW, in_flight=0) == (
        f"waiting: the provider asked for a pause (429) until {at(30)}"
    )
    idle = ModelLimits("m")
    assert waiting_text([idle], now=NOW, in_flight=0, retry_in_s=12) == (
        f"waiting for a backoff: retries not due yet, the next at {at(12)} (12 s)"
    )
    assert waiting_text([idle], now=NOW, in_flight=2, retry_in_s=12) is None  # still sending
    assert waiting_text([idle], now=NOW, in_flight=0) is None


def test_the_limiter_says_when_its_next_booked_request_goes() -> None:
    clock = [100.0]
    limiter = RateLimiter(rpm=60, headroom=1.0, clock=lambda: clock[0])
    assert limiter.wait_s() == 0.0
    for _ in range(3):  # three senders waiting: slots at 100, 101, 102
        limiter._book(limiter.ticket_now() or _ticket(limiter), clock[0])
    clock[0] = 100.5
    assert limiter.wait_s() == pytest.approx(0.5)  # the next booked one, not the last
    clock[0] = 102.5
    assert limiter.wait_s() == pytest.approx(0.5)  # none booked later: when one could go
    limiter.pause(20)
    assert limiter.paused_s() == pytest.approx(20)
    assert Limiters(rpm=60).configured("x") == (60, None)
    per_model = Limiters(rpm=60, per_model={"x": (5, None)})
    assert per_model.configured("x") == (5, None) and per_model.in_use() == {}


def _ticket(limiter: RateLimiter):  # type: ignore[no-untyped-def]
    from aiq.limiter import Ticket

    return Ticket(0, 0, limiter)


WAITING = Progress(
    total=100, done=10, in_flight=0, limits="limit 1,200/min learned",
    waiting="waiting for the rate limit (1,200/min, learned) until 14:03:07",
)  # fmt: skip


def test_the_plain_line_says_why_it_waits() -> None:
    line = summary_line(WAITING)
    assert "in flight 0 · waiting for the rate limit (1,200/min, learned) until 14:03:07" in line
    assert line.endswith("· limit 1,200/min learned")
    assert "waiting" not in summary_line(Progress(total=1))


def test_the_panel_says_why_it_waits_on_a_line_of_its_own() -> None:
    buf = io.StringIO()
    live = LiveProgress(Console(file=buf, width=120, force_terminal=True))
    live(WAITING)
    live.close()
    frame = re.split(r"\x1b\[\d*[AK]|\r", buf.getvalue())[-1]
    lines = [ln for ln in re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", frame).splitlines() if ln.strip()]
    assert lines[1].endswith("· limit 1,200/min learned"), lines
    assert lines[2] == "waiting for the rate limit (1,200/min, learned) until 14:03:07"
    narrow = io.StringIO()
    live = LiveProgress(Console(file=narrow, width=50, force_terminal=True))
    live(WAITING)
    live.close()
    assert "limit 1,200" not in narrow.getvalue().split("\r")[-1]  # left out before the counts


# Learned, the first reply tells the limit and the next request goes at once: a third waits.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "said", "lines"), [(("--rpm", "20"), "given", 2), ((), "learned", 3)]
)
def test_a_run_held_by_its_rate_limit_says_so(
    tmp_path: Path, flag: tuple[str, ...], said: str, lines: int
) -> None:
    write_prompts(tmp_path / "b.jsonl", [(f"c{i}", f"q{i}") for i in range(lines)])
    with FakeServer(require_key=API_KEY, rpm=20) as server:
        proc = run_aiq(
            "run", "b.jsonl", "--base-url", server.base_url, "--model", "m",
            "--concurrency", "1", *flag, cwd=tmp_path,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    first = next(ln for ln in proc.stderr.splitlines() if " done " in ln)
    assert f"in flight 0 · waiting for the rate limit (20/min, {said}) until " in first, first
    assert first.endswith(f"limit 20/min {said}"), first
