"""Bad input through the real CLI: every bad line is reported with file, line and reason, and
the valid lines around it are still enqueued (and sent); a file aiq cannot use at all is one
`error:` line with exit 2."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from conftest import aiq_env, read_jsonl, run_aiq
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def _line(custom_id: str, prompt: str = "") -> bytes:
    return json.dumps({"custom_id": custom_id, "prompt": prompt or f"say {custom_id}"}).encode()


A, B, C = _line("a"), _line("b"), _line("c")


def _add(tmp_path: Path, data: bytes, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "in.jsonl").write_bytes(data)
    return run_aiq("add", "in.jsonl", "--model", "m", *extra, cwd=tmp_path)


def _queued(tmp_path: Path) -> int:
    """Jobs in the store, read straight from it (faster than one more `aiq status`)."""
    db = tmp_path / ".aiq" / "aiq.db"
    if not db.exists():
        return 0
    with closing(sqlite3.connect(db)) as con:
        ((n,),) = con.execute("SELECT count(*) FROM jobs WHERE state = 0")
    return int(n)


def _invalid(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The `invalid: FILE:LINE: reason` lines, with the directory taken off FILE."""
    return [
        line.removeprefix("invalid: ").rsplit("/", 1)[-1]
        for line in proc.stderr.splitlines()
        if line.startswith("invalid: ")
    ]


def _one_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: "), proc.stderr
    assert proc.stderr.count("error: ") == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


# Each file, with how many valid lines it holds and the reasons expected per bad line number.
CASES: dict[str, tuple[bytes, int, dict[int, str]]] = {
    "bom": (b"\xef\xbb\xbf" + A + b"\n" + B + b"\n", 2, {}),
    "crlf": (A + b"\r\n" + B + b"\r\n" + C + b"\r\n", 3, {}),
    "bom-and-crlf": (b"\xef\xbb\xbf" + A + b"\r\n" + B + b"\r\n", 2, {}),
    "last-line-without-newline": (A + b"\n" + B, 2, {}),
    "truncated-last-line": (
        A + b"\n" + B + b"\n" + C[:12],
        2,
        {
            3: "not valid JSON: unexpected end of data at column 13 (the last line, with no "
            "newline: cut short?)"
        },
    ),
    "last-line-without-newline-and-no-prompt": (
        A + b"\n" + b'{"custom_id": "x", "promt": "typo"}',
        1,
        {2: "no 'messages', 'prompt' or 'body': not a chat, prompt or Batch API line"},
    ),
    "invalid-utf8": (
        A + b"\n" + _line("b", "caf\xe9").replace(b"\\u00e9", b"\xe9") + b"\n" + C + b"\n",
        2,
        {2: "not valid JSON: not UTF-8 (byte 0xe9 at byte 34); save it as UTF-8"},
    ),
    "not-objects": (
        A + b'\n[1, 2]\n"x"\n3\nnull\ntrue\n' + C + b"\n",
        2,
        {
            2: "expected a JSON object, got an array",
            3: "expected a JSON object, got a string",
            4: "expected a JSON object, got a number",
            5: "expected a JSON object, got null",
            6: "expected a JSON object, got a boolean",
        },
    ),
    "nan-and-infinity": (
        A
        + b"\n"
        + b'{"custom_id": "n", "prompt": "x", "temperature": NaN}\n'
        + b'{"custom_id": "i", "prompt": "x", "temperature": Infinity}\n'
        + b'{"custom_id": "j", "prompt": "x", "temperature": -Infinity}\n'
        + C
        + b"\n",
        2,
        {
            2: "not valid JSON: NaN (column 50) is not a JSON number; write null or a number",
            3: "not valid JSON: Infinity (column 50) is not a JSON number; write null or a number",
            4: "not valid JSON: -Infinity (column 50) is not a JSON number; write null or a number",
        },
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_add_reports_each_bad_line_and_enqueues_the_rest(tmp_path: Path, case: str) -> None:
    data, valid, bad = CASES[case]

    proc = _add(tmp_path, data)

    assert proc.returncode == (6 if bad else 0), proc.stderr  # 6: lines were skipped
    assert f"{valid} new, 0 known, 0 changed, {len(bad)} invalid" in proc.stdout
    assert _invalid(proc) == [f"in.jsonl:{n}: {why}" for n, why in bad.items()]
    assert _queued(tmp_path) == valid


def test_run_sends_exactly_the_valid_lines_of_a_messy_file(
    tmp_path: Path, server: FakeServer
) -> None:
    # A BOM, CRLF line ends, and one of each bad line: the good ones go out as they were.
    good = {f"g{i}": f"question {i}, untouched" for i in range(4)}
    lines = [
        b"\xef\xbb\xbf" + _line("g0", good["g0"]),
        b"[1, 2]",
        _line("g1", good["g1"]),
        b'{"custom_id": "x", "prompt": "\xff"}',
        _line("g2", good["g2"]),
        b'{"custom_id": "y", "prompt": "x", "temperature": NaN}',
        _line("g3", good["g3"]),
        b'{"custom_id": "z", "pro',
    ]
    (tmp_path / "messy.jsonl").write_bytes(b"\r\n".join(lines))

    proc = run_aiq("run", "messy.jsonl", "--base-url", server.base_url, "--model", "m",
                   "-q", cwd=tmp_path)  # fmt: skip

    assert proc.returncode == 6, proc.stderr  # finished, but lines were skipped
    assert "4 new, 0 known, 0 changed, 4 invalid" in proc.stdout
    assert [line.split(": ")[0] for line in _invalid(proc)] == [
        "messy.jsonl:2", "messy.jsonl:4", "messy.jsonl:6", "messy.jsonl:8",
    ]  # fmt: skip
    results = read_jsonl(tmp_path / "messy.results.jsonl")
    assert sorted(r["custom_id"] for r in results) == sorted(good)
    assert sorted(r.prompt for r in server.requests) == sorted(good.values())


def test_strict_refuses_the_whole_file(tmp_path: Path) -> None:
    proc = _add(tmp_path, A + b"\n[1]\n" + B + b"\n", "--strict")
    _one_error(proc, "in.jsonl: 1 invalid line; nothing was enqueued (--strict)",
               "in.jsonl:2: expected a JSON object, got an array")  # fmt: skip
    assert _queued(tmp_path) == 0


# -- files aiq cannot use at all -------------------------------------------------------------


@pytest.mark.parametrize("command", ["add", "run"])
def test_missing_file_and_directory(tmp_path: Path, command: str) -> None:
    (tmp_path / "prompts").mkdir()
    args = ["--provider", "simulated"] if command == "run" else []
    proc = run_aiq(command, "nope.jsonl", "--model", "m", *args, cwd=tmp_path)
    _one_error(proc, "nope.jsonl: no such file")
    proc = run_aiq(command, "prompts", "--model", "m", *args, cwd=tmp_path)
    _one_error(proc, "prompts: is a directory; give a JSONL file")


def _csv(path: Path) -> None:
    path.write_text("custom_id,prompt\na1,what is 2+2?\na2,name a colour\n")


def _binary(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 64 + b"\x00\xff" * 1000)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_csv, "data.bin:1: not valid JSON: unexpected character, expected a JSON value at "
               "column 1"),
        (_binary, "data.bin:2: not valid JSON: not UTF-8 (byte 0x80"),
    ],
    ids=["csv", "binary"],
)  # fmt: skip
@pytest.mark.parametrize("command", ["add", "run"])
def test_a_file_that_is_not_jsonl_at_all(
    tmp_path: Path, server: FakeServer, make: object, reason: str, command: str
) -> None:
    make(tmp_path / "data.bin")  # type: ignore[operator]
    args = ["--base-url", server.base_url] if command == "run" else []

    proc = run_aiq(command, "data.bin", "--model", "m", *args, cwd=tmp_path)

    _one_error(proc, "error: data.bin: no valid line in", "is it a JSONL file", reason)
    assert len(proc.stderr) < 2000  # a few examples, not a screenful per line
    assert server.requests == []
    assert _queued(tmp_path) == 0


# -- very long lines -------------------------------------------------------------------------


# The real CLI, reporting its peak memory as it exits. VmHWM is of this program's own memory:
# getrusage's ru_maxrss would count the forking test process's as well.
_MEASURED = """
import atexit, sys
from aiq.cli import main

def report():
    peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    sys.stderr.write("peak " + peak.split()[1] + " kB\\n")

atexit.register(report)
sys.argv[0] = "aiq"
main()
"""


def _run_measured(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``aiq ARGS``; returns the completed process (its report taken off stderr) and its
    peak memory in MB."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux's /proc to measure memory")
    cmd = [sys.executable, "-c", _MEASURED, *args]
    proc = subprocess.run(cmd, cwd=cwd, env=aiq_env(), capture_output=True, text=True, timeout=60)
    rest, _, report = proc.stderr.rstrip("\n").rpartition("\n")
    if not report.startswith("peak "):
        rest, report = proc.stderr, "peak 0 kB"
    proc.stderr = rest + "\n" if rest else ""
    return proc, int(report.split()[1]) / 1024


def test_a_20_mb_prompt_is_accepted_without_blowing_memory(tmp_path: Path) -> None:
    big = _line("big", "lorem ipsum dolor " * 1_100_000)  # 20 MB
    (tmp_path / "in.jsonl").write_bytes(A + b"\n" + big + b"\n" + B + b"\n")

    proc, peak_mb = _run_measured("add", "in.jsonl", "--model", "m", cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert "3 new, 0 known, 0 changed, 0 invalid" in proc.stdout
    # ~60 MB to start with, ~200 in all: reading a line takes about seven times its size.
    assert peak_mb < 300, peak_mb


def test_a_line_over_64_mib_is_reported_unread_and_the_rest_enqueued(tmp_path: Path) -> None:
    huge = b'{"custom_id": "huge", "prompt": "' + b"x" * (70 << 20) + b'"}'
    (tmp_path / "in.jsonl").write_bytes(A + b"\n" + huge + b"\n" + B + b"\n" + C)

    proc, peak_mb = _run_measured("add", "in.jsonl", "--model", "m", cwd=tmp_path)

    assert proc.returncode == 6, proc.stderr
    assert "3 new, 0 known, 0 changed, 1 invalid" in proc.stdout
    assert _invalid(proc) == [
        "in.jsonl:2: longer than 64 MiB: not read (too large for one request; is this a "
        "JSONL file, one request per line?)"
    ]
    # ~60 MB to start with, ~120 in all: at most 64 MiB of the line is held, never copied.
    assert peak_mb < 170, peak_mb
    again = run_aiq("add", "in.jsonl", "--model", "m", cwd=tmp_path)
    assert "0 new, 3 known, 0 changed, 1 invalid" in again.stdout, again.stderr


def test_many_bad_lines_are_counted_in_full_and_kept_with_reasons_only_in_part(
    tmp_path: Path,
) -> None:
    # A reason per line was kept for every invalid line: a CSV of a million rows took 625 MB
    # to refuse. Now the first KEEP_BAD_LINES keep their reasons; all are counted, also when a
    # re-add skips the lines it has read before and reports them from the store.
    bad = b"".join(b"%d,not json\n" % i for i in range(1_500))
    data = A + b"\n" + bad + B + b"\n"

    first = _add(tmp_path, data)
    again = _add(tmp_path, data)

    for proc in (first, again):
        assert proc.returncode == 6, proc.stderr
        assert "1,500 invalid" in proc.stdout
        assert "in.jsonl:2: not valid JSON" in proc.stderr
        assert "invalid: … and 1,450 more" in proc.stderr
    assert "2 new, 0 known" in first.stdout and "0 new, 2 known" in again.stdout
    with closing(sqlite3.connect(tmp_path / ".aiq" / "aiq.db")) as con:
        ((stored,),) = con.execute("SELECT bad FROM prefixes")
    kept = json.loads(stored)
    assert kept["invalid"] == 1_500 and len(kept["lines"]) == 1_000


def test_a_prefix_stored_by_an_earlier_aiq_still_counts_its_bad_lines(tmp_path: Path) -> None:
    data = A + b"\n" + b"{oops\n" + B + b"\n"
    assert _add(tmp_path, data).returncode == 6
    # Before KEEP_BAD_LINES, the prefix kept a plain list of every invalid line.
    with closing(sqlite3.connect(tmp_path / ".aiq" / "aiq.db")) as con, con:
        con.execute("UPDATE prefixes SET bad = ?", (json.dumps([[2, "not valid JSON"]]),))

    again = _add(tmp_path, data)

    assert again.returncode == 6, again.stderr
    assert "0 new, 2 known, 0 changed, 1 invalid" in again.stdout
    assert "in.jsonl:2: not valid JSON" in again.stderr
