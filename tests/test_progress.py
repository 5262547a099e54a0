"""What a run shows while it works: the live panel, the plain lines, and which of the two."""

from __future__ import annotations

import asyncio
import io
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest
from conftest import aiq_cmd, aiq_env, write_prompts
from rich.console import Console

import aiq.dispatch
from aiq import runner
from aiq.config import Config
from aiq.progress import LiveProgress, PlainProgress, summary_line, wants_live_panel
from aiq.run_records import Progress

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")
BIG = Progress(
    total=1_000_000, done=123_456, dead=1_234, retries=12_345, in_flight=256,
    tokens_in=123_456_789, tokens_out=98_765_432, outage_s=42.0,
)  # fmt: skip


def last_frame(p: Progress, width: int) -> list[str]:
    """The panel's lines as a terminal ``width`` columns wide shows them after ``close()``."""
    buf = io.StringIO()
    live = LiveProgress(Console(file=buf, width=width, force_terminal=True))
    live(p)
    live.close()
    # Live redraws in place: the last frame is what follows the last cursor movement.
    frame = re.split(r"\x1b\[\d*[AK]|\r", buf.getvalue())[-1]
    return [line for line in ANSI.sub("", frame).splitlines() if line.strip()]


def test_at_80_columns_the_counts_are_one_line() -> None:
    p = Progress(total=100_000, done=12_345, dead=3, retries=12, in_flight=32,
                 tokens_in=1_234_567, tokens_out=3_456_789)  # fmt: skip
    console = Console(width=80, record=True, force_terminal=True)
    live = LiveProgress(console)
    live(p)
    live.close()
    lines = [line for line in console.export_text().splitlines() if line.strip()]
    assert len(lines) == 2, lines  # the bar, then every count on one row
    assert lines[0].startswith("aiq ") and "12%" in lines[0] and "in flight 32" in lines[0]
    assert lines[1] == "done 12,345/100,000 · dead 3 · retries 12 · tokens 1.2M in / 3.5M out"


@pytest.mark.parametrize("width", [80, 60, 40, 30, 20])
def test_no_line_wraps_on_narrow_terminals(width: int) -> None:
    lines = last_frame(BIG, width)
    assert len(lines) == 3, lines  # bar, counts, outage: each on one line, none wrapped
    assert all(len(line) <= width for line in lines)
    assert lines[1].startswith("done 123,456")
    assert lines[2].startswith("provider down")


def test_narrow_terminals_lose_tokens_first_then_retries() -> None:
    assert "tokens" in last_frame(BIG, 120)[1]
    at_60 = last_frame(BIG, 60)[1]
    assert "tokens" not in at_60 and "retries 12,345" in at_60 and "dead 1,234" in at_60
    at_40 = last_frame(BIG, 40)[1]
    assert "retries" not in at_40 and "dead 1,234" in at_40


def test_plain_line_percentage_counts_done_and_dead_as_finished() -> None:
    # As `aiq status` says it: "% finished", dead included; "done" is the done jobs alone.
    p = Progress(total=200, done=150, dead=50, retries=3, in_flight=0)
    line = summary_line(p)
    assert line.startswith("done 150/200 · dead 50 · 100% finished · ")
    assert summary_line(Progress(total=8, done=2, dead=0)).startswith("done 2/8 · dead 0 · 25%")
    assert "100% finished" in summary_line(Progress())  # an empty store has nothing left


def test_plain_lines_come_every_so_often() -> None:
    out = io.StringIO()
    show = PlainProgress(out, every_s=3600)
    show(Progress(total=4, done=1))
    show(Progress(total=4, done=2))  # within the hour: not printed
    assert out.getvalue().count("\n") == 1 and "done 1/4 · dead 0 · 25% finished" in out.getvalue()


def test_a_plain_line_says_at_once_when_the_provider_goes_down_and_comes_back() -> None:
    out = io.StringIO()
    show = PlainProgress(out, every_s=3600)
    show(Progress(total=4, done=1))
    show(Progress(total=4, done=1, outage_s=0.5, last_error="HTTP 503: down"))
    show(Progress(total=4, done=1, outage_s=2.0, last_error="HTTP 503: down"))  # not again
    show(Progress(total=4, done=2))  # back
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert "provider down" in lines[1] and "HTTP 503: down" in lines[1]
    assert "provider down" not in lines[2] and "done 2/4" in lines[2]


def test_no_color_keeps_the_live_panel_on_a_terminal() -> None:
    # NO_COLOR asks for no colour, not for no panel (no-color.org); rich drops the colour.
    assert wants_live_panel(True, {"NO_COLOR": "1", "TERM": "xterm-256color"})
    assert wants_live_panel(True, {})
    assert not wants_live_panel(False, {})  # piped, cron, CI: plain lines
    assert not wants_live_panel(True, {"TERM": "dumb"})  # no cursor movement there


def test_the_total_follows_jobs_added_during_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `aiq add` works beside a run and the run sends what it adds: done must not pass total.
    monkeypatch.setattr(aiq.dispatch, "_RECOUNT_EVERY_S", 0.05)
    first, more = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_prompts(first, [(f"a{i}", f"first {i}") for i in range(20)])
    write_prompts(more, [(f"b{i}", f"more {i}") for i in range(10)])
    cfg = Config(db=tmp_path / "aiq.db", provider="simulated", model="m", concurrency=2,
                 simulated_latency_s=0.02, simulated_error_rate=0)  # fmt: skip
    seen: list[tuple[int, int]] = []

    async def go() -> runner.RunSummary:
        run = asyncio.ensure_future(runner.run_batch(
            cfg, input_path=first, progress_interval_s=0.02,
            on_progress=lambda p: seen.append((p.done + p.dead, p.total)),
        ))  # fmt: skip
        while (not seen or seen[-1][0] < 5) and not run.done():
            await asyncio.sleep(0.01)
        assert not run.done(), run.result()
        await runner.add_file(cfg, more)
        return await run

    summary = asyncio.run(go())
    assert summary.stats.counts["done"] == 30  # the added jobs were sent by this run
    assert all(finished <= total for finished, total in seen), seen
    assert seen[0][1] == 20 and seen[-1] == (30, 30)


@pytest.mark.slow
def test_on_a_terminal_the_summary_comes_after_the_panels_last_frame(tmp_path: Path) -> None:
    write_prompts(tmp_path / "p.jsonl", [(f"p{i}", f"prompt {i}") for i in range(6)])
    (tmp_path / "aiq.yaml").write_text("simulated_latency_s: 0.05\nsimulated_error_rate: 0\n")
    leader, follower = pty.openpty()
    env = aiq_env(COLUMNS="80", LINES="24", TERM="xterm")
    env.pop("NO_COLOR")
    proc = subprocess.Popen(
        aiq_cmd("run", "p.jsonl", "--provider", "simulated"),
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([leader], [], [], 1)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    os.close(leader)
    assert proc.wait(timeout=10) == 0
    assert b"\x1b[" in out  # the live panel, not plain lines
    text = ANSI.sub("", out.decode())
    summary_at = text.index("results: ")
    assert text.rindex("in flight") < summary_at  # no frame drawn after the summary
    assert "done 6/6" in text[:summary_at]  # the last frame shows the run complete
