"""Bad environments: each gives one clear `error:` line, exit 2, and loses nothing.

Real `aiq` subprocesses on real files. Two conditions need help to arise in a test:

- A read-only directory: root ignores permissions, so under root the subprocess runs through
  ``setpriv`` without the capabilities that bypass them (as any other user would be).
- A full disk: the subprocess runs the real CLI with SQLite's ``max_page_count`` lowered on
  the store's connection once it is open (``_LIMITED``). SQLite then fails the write that
  would grow the database with SQLITE_FULL, "database or disk is full": the very error a
  full disk (ENOSPC) gives, through the same code in aiq. Where the tests may mount a
  filesystem (root), a real one fills up as well: a small tmpfs, filled mid-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import aiq_cmd, aiq_env, read_jsonl, run_aiq, start_aiq, write_prompts
from fakeserver import FakeServer

from aiq.files import AtomicFile

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time

# The real CLI, its store opened with room for only argv[1] more pages.
_LIMITED = """
import sys
import aiq.store
from aiq.cli import main

extra_pages = int(sys.argv.pop(1))
real_open = aiq.store.JobStore.open.__func__

async def open_with_little_room(cls, path, **options):
    store = await real_open(cls, path, **options)
    if not options.get("readonly"):
        ((pages,),) = await store._db.execute_fetchall("PRAGMA page_count")
        await store._db.execute(f"PRAGMA max_page_count = {pages + extra_pages}")
    return store

aiq.store.JobStore.open = classmethod(open_with_little_room)
sys.argv[0] = "aiq"
main()
"""


def _one_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single `error:` line of a failed command, checked for exit 2 and ``needles``."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _prompts(n: int, tag: str = "p") -> list[tuple[str, str]]:
    return [(f"{tag}{i}", f"question {tag}{i}: what is {i} squared? " * 8) for i in range(n)]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _counts(cwd: Path, db: str) -> dict[str, int]:
    proc = run_aiq("status", "--json", "--db", db, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    counts: dict[str, int] = json.loads(proc.stdout)["counts"]
    return counts


def _without_root_powers(cmd: list[str]) -> list[str]:
    """``cmd`` as a process that file permissions apply to, even when the tests run as root."""
    if os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permissions cannot be made to apply")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner", *cmd]


def _run_restricted(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = _without_root_powers(aiq_cmd(*args))
    return subprocess.run(cmd, cwd=cwd, env=aiq_env(), capture_output=True, text=True, timeout=60)


# -- where the store goes ----------------------------------------------------------------


_ADD = ["add", "in.jsonl", "--model", "m"]
_RUN = ["run", "in.jsonl", "--provider", "simulated", "--model", "m"]
_RESUME = ["resume", "--provider", "simulated"]
# The simulated provider without its demo's latency (0.5 s a call) and transient errors (5%,
# each a backoff of up to a second): where a test's point is the store, not the provider.
_INSTANT = "simulated_latency_s: 0\nsimulated_error_rate: 0\n"


@pytest.mark.parametrize("args", [_ADD, _RUN], ids=["add", "run"])
def test_store_in_a_read_only_directory(tmp_path: Path, args: list[str]) -> None:
    write_prompts(tmp_path / "in.jsonl", _prompts(3))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        proc = _run_restricted(*args, "--db", "locked/aiq.db", cwd=tmp_path)
    finally:
        locked.chmod(0o755)
    _one_error(proc, "locked/aiq.db", "Permission denied", "writable", "--db")
    assert list(locked.iterdir()) == []


def test_existing_store_made_read_only_keeps_its_jobs(tmp_path: Path) -> None:
    (tmp_path / "aiq.yaml").write_text(_INSTANT)
    # A dead job, so that replay-dead has something to write.
    write_prompts(tmp_path / "dead.jsonl", [("d", "FAIL_PERMANENT")])
    ran = run_aiq("run", "dead.jsonl", "--provider", "simulated", "-q", cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr
    write_prompts(tmp_path / "in.jsonl", _prompts(5))
    assert run_aiq("add", "in.jsonl", "--model", "m", cwd=tmp_path).returncode == 0
    db = tmp_path / ".aiq" / "aiq.db"
    before = _digest(db)
    db.chmod(0o444)
    try:
        for args in (_RESUME, ["replay-dead"]):
            proc = _run_restricted(*args, cwd=tmp_path)
            _one_error(proc, ".aiq/aiq.db", "readonly database", "make them writable")
    finally:
        db.chmod(0o600)
    assert _digest(db) == before
    proc = run_aiq("resume", "--provider", "simulated", "-q", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # done, but for the dead one
    assert _counts(tmp_path, ".aiq/aiq.db")["done"] == 5


def test_status_and_export_read_a_store_in_a_directory_aiq_may_not_write(
    tmp_path: Path,
) -> None:
    """A read-only mount, another user's store: SQLite cannot make its -shm file there."""
    write_prompts(tmp_path / "in.jsonl", _prompts(4))
    assert run_aiq("add", "in.jsonl", "--model", "m", cwd=tmp_path).returncode == 0
    store_dir = tmp_path / ".aiq"
    before = _digest(store_dir / "aiq.db")
    store_dir.chmod(0o555)
    try:
        status = _run_restricted("status", "--json", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["counts"]["queued"] == 4
        export = _run_restricted("export", cwd=tmp_path)
        assert export.returncode == 0, export.stderr
        # Writing is still refused, with the one error line.
        _one_error(_run_restricted(*_RESUME, cwd=tmp_path), ".aiq/aiq.db", "make .aiq writable")
    finally:
        store_dir.chmod(0o755)
    assert _digest(store_dir / "aiq.db") == before
    assert sorted(os.listdir(store_dir)) == ["aiq.db"]  # no -wal or -shm left behind


def test_missing_directories_of_a_store_path_are_an_error(tmp_path: Path) -> None:
    # A missing directory is more often a typo than a wish: a new store there would send,
    # and bill, everything again. Only aiq's own .aiq directory is made.
    write_prompts(tmp_path / "in.jsonl", _prompts(3))
    proc = run_aiq("add", "in.jsonl", "--model", "m", "--db", "runs/june/aiq.db", cwd=tmp_path)
    _one_error(proc, "runs/june/aiq.db: directory runs/june does not exist")
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs" / "june").mkdir(parents=True)
    proc = run_aiq("add", "in.jsonl", "--model", "m", "--db", "runs/june/aiq.db", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _counts(tmp_path, "runs/june/aiq.db")["queued"] == 3
    proc = run_aiq("add", "in.jsonl", "--model", "m", "--db", "elsewhere/.aiq/aiq.db",
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr  # .aiq is made, but not the directories above it
    # Commands that carry on with a store never make one: a mistyped path is an error, not
    # an empty store that "finishes" nothing with exit 0.
    for args in (["status"], ["export"], _RESUME, ["replay-dead"]):
        proc = run_aiq(*args, "--db", "runs/juen/aiq.db", cwd=tmp_path)
        _one_error(proc, "runs/juen/aiq.db: no store here yet", "aiq run FILE")
    assert not (tmp_path / "runs" / "juen").exists()


def test_a_directory_given_as_the_store(tmp_path: Path) -> None:
    write_prompts(tmp_path / "in.jsonl", _prompts(2))
    (tmp_path / "state").mkdir()
    for args in (_ADD, ["status"]):
        proc = run_aiq(*args, "--db", "state", cwd=tmp_path)
        _one_error(proc, "state: is a directory", "state/aiq.db")
    assert list((tmp_path / "state").iterdir()) == []


# -- what is in the store's place -----------------------------------------------------------


def _text_file(path: Path) -> None:
    path.write_text("custom_id,prompt\na1,hello\n")


def _corrupted_store(path: Path) -> None:
    """A real aiq store whose pages after the header were overwritten."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL)")
    db.execute("CREATE TABLE filler (x BLOB)")
    db.executemany("INSERT INTO filler VALUES (?)", [(os.urandom(500),) for _ in range(100)])
    db.commit()
    db.close()
    with path.open("r+b") as f:
        f.seek(100)  # the 100-byte header stays: SQLite takes it for a database
        f.write(b"\xa5" * 3 * 4096)


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (_text_file, ["file is not a database", "not an aiq store"]),
        (_corrupted_store, ["malformed", "damaged", "restore a backup"]),
    ],
    ids=["text-file", "corrupted-sqlite"],
)
@pytest.mark.parametrize("args", [_ADD, _RUN, _RESUME, ["status"], ["export"]], ids=lambda a: a[0])
def test_unusable_store_file_is_reported_and_left_alone(
    tmp_path: Path, make: object, needles: list[str], args: list[str]
) -> None:
    write_prompts(tmp_path / "in.jsonl", _prompts(2))
    db = tmp_path / "bad.db"
    make(db)  # type: ignore[operator]
    before = _digest(db)
    proc = run_aiq(*args, "--db", "bad.db", cwd=tmp_path)
    _one_error(proc, "bad.db: ", *needles)
    assert _digest(db) == before


def test_store_damaged_past_its_schema_is_reported_and_left_alone(tmp_path: Path) -> None:
    # It opens, and fails only when the damaged pages are read (what it wrote before that,
    # it may keep: the file is not left byte for byte as it was).
    write_prompts(tmp_path / "in.jsonl", _prompts(300))
    assert run_aiq(*_ADD, cwd=tmp_path).returncode == 0
    db = tmp_path / ".aiq" / "aiq.db"
    with db.open("r+b") as f:
        f.seek(-10 * 4096, os.SEEK_END)
        f.write(b"\xa5" * 10 * 4096)
    # A fixed 32 in flight and no latency: the run reaches the damaged pages at once, where
    # auto would first find the simulated provider's capacity, one request at a time at first.
    (tmp_path / "aiq.yaml").write_text(_INSTANT)
    for args in (_RUN, _RESUME):
        proc = run_aiq(*args, "--concurrency", "32", cwd=tmp_path)
        _one_error(proc, ".aiq/aiq.db: ", "the store is damaged")


def test_store_written_by_a_newer_aiq_is_refused_untouched(tmp_path: Path) -> None:
    write_prompts(tmp_path / "in.jsonl", _prompts(3))
    assert run_aiq("add", "in.jsonl", "--model", "m", cwd=tmp_path).returncode == 0
    db = tmp_path / ".aiq" / "aiq.db"
    with sqlite3.connect(db) as con:
        con.execute("INSERT INTO migrations VALUES ('9999_from_the_future', 0)")
    con.close()
    before = _digest(db)
    for args in (_RUN, ["status"]):
        proc = run_aiq(*args, cwd=tmp_path)
        _one_error(proc, "newer aiq", "9999_from_the_future", "upgrade aiq")
    assert _digest(db) == before


# -- a full disk ----------------------------------------------------------------------------


def _run_limited(extra_pages: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", _LIMITED, str(extra_pages), *args]
    return subprocess.run(cmd, cwd=cwd, env=aiq_env(), capture_output=True, text=True, timeout=60)


def test_disk_full_mid_run_stops_keeps_what_was_recorded_and_resume_finishes(
    tmp_path: Path, server: FakeServer
) -> None:
    prompts = _prompts(300)
    write_prompts(tmp_path / "in.jsonl", prompts)
    args = ["--base-url", server.base_url, "--concurrency", "8"]
    assert run_aiq("add", "in.jsonl", "--model", "m", cwd=tmp_path).returncode == 0

    # Room for about a hundred replies: the disk fills up a third of the way in.
    full = _run_limited(30, "resume", *args, "-q", cwd=tmp_path)

    _one_error(full, ".aiq/aiq.db", "database or disk is full", "free some space", "aiq resume")
    counts = _counts(tmp_path, ".aiq/aiq.db")
    assert 0 < counts["done"] < 300, counts
    exported = run_aiq("export", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    recorded = {r["custom_id"] for r in read_jsonl(tmp_path / "in.results.jsonl")}
    assert len(recorded) == counts["done"]

    resumed = run_aiq("resume", *args, "-q", cwd=tmp_path)

    assert resumed.returncode == 0, resumed.stderr
    results = read_jsonl(tmp_path / "in.results.jsonl")
    assert sorted(r["custom_id"] for r in results) == sorted(cid for cid, _ in prompts)
    texts = dict(prompts)
    for custom_id in recorded:  # what was recorded before the disk filled is not sent again
        assert server.count_for(texts[custom_id]) == 1, custom_id


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 16 MiB filesystem (tmpfs) at ``tmp_path/disk``; skips where none can be mounted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(disk)]
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def _fill(disk: Path, name: str) -> Path:
    """Fill ``disk`` to its last byte; returns the file that holds the space."""
    filler = disk / name
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):  # then smaller writes for what bigger ones left
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def test_a_really_full_disk_mid_run(tmp_path: Path, small_disk: Path, server: FakeServer) -> None:
    prompts = _prompts(400)
    write_prompts(tmp_path / "in.jsonl", prompts)
    db = str(small_disk / "aiq.db")
    assert run_aiq("add", "in.jsonl", "--model", "m", "--db", db, cwd=tmp_path).returncode == 0
    server.latency_s = 0.01
    args = ["--db", db, "--base-url", server.base_url, "--concurrency", "4", "-q"]
    proc = start_aiq("resume", *args, cwd=tmp_path, capture=True)
    deadline = time.monotonic() + 30
    while len(server.requests) < 100 and time.monotonic() < deadline:
        time.sleep(0.01)

    filler = _fill(small_disk, "filler")
    out, err = proc.communicate(timeout=60)

    full = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    _one_error(full, "aiq.db: database or disk is full", "free some space", "aiq resume")
    assert run_aiq("export", "--db", db, cwd=tmp_path).returncode == 0  # outputs: not full
    recorded = {r["custom_id"] for r in read_jsonl(tmp_path / "in.results.jsonl")}
    assert 0 < len(recorded) < 400
    # Closing the store may have freed some space: none at all left now, not even for the note
    # in the lock file.
    refilled = _fill(small_disk, "filler2")
    still_full = run_aiq("resume", *args, cwd=tmp_path)
    _one_error(still_full, "aiq.db: database or disk is full", "free some space")
    out_path = small_disk / "results.jsonl"
    export = run_aiq("export", "--db", db, "--out", str(out_path), cwd=tmp_path)
    _one_error(export, "results.jsonl: cannot write it (No space left on device)")
    assert not out_path.exists() and not list(small_disk.glob("results.jsonl.tmp-*"))
    filler.unlink()
    refilled.unlink()
    resumed = run_aiq("resume", *args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    results = read_jsonl(tmp_path / "in.results.jsonl")
    assert sorted(r["custom_id"] for r in results) == sorted(cid for cid, _ in prompts)
    texts = dict(prompts)
    assert all(server.count_for(texts[cid]) == 1 for cid in recorded)


# -- files beside the store ---------------------------------------------------------------------


def test_a_log_file_gets_its_directory_a_metrics_file_needs_one(tmp_path: Path) -> None:
    # A textfile collector reads one directory: a metrics file made anywhere else is lost.
    write_prompts(tmp_path / "in.jsonl", _prompts(3))
    args = ["--log-file", "logs/aiq.log", "--metrics-file", "metrics/aiq.prom", "-q"]
    _one_error(run_aiq(*_RUN, *args, cwd=tmp_path), "metrics/aiq.prom", "does not exist")
    (tmp_path / "metrics").mkdir()
    proc = run_aiq(*_RUN, *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "finished 3" in (tmp_path / "logs" / "aiq.log").read_text()
    assert "aiq_jobs" in (tmp_path / "metrics" / "aiq.prom").read_text()


def test_results_in_a_read_only_directory_lose_nothing(tmp_path: Path) -> None:
    write_prompts(tmp_path / "in.jsonl", _prompts(4))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        proc = _run_restricted(*_RUN, "--out", "locked/results.jsonl", "-q", cwd=tmp_path)
    finally:
        locked.chmod(0o755)
    _one_error(proc, "locked/results.jsonl: cannot write it (Permission denied)", "nothing is lost")
    assert list(locked.iterdir()) == []
    assert _counts(tmp_path, ".aiq/aiq.db")["done"] == 4  # every reply is in the store
    exported = run_aiq("export", "--out", "locked/results.jsonl", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert len(read_jsonl(locked / "results.jsonl")) == 4


def test_a_metrics_file_that_fails_mid_run_stops_it_cleanly_and_resume_finishes(
    tmp_path: Path,
) -> None:
    """The run stops with one error line, in-flight requests recorded, none left running."""
    # 4 in flight at 50 ms a reply: at most 80/s, so 480 lines outlast the 5 s write by a
    # second even at full speed, and resume, at 16 in flight, finishes the rest in moments.
    prompts = [(f"m{i}", f"metrics prompt {i}") for i in range(480)]
    write_prompts(tmp_path / "m.jsonl", prompts)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    with FakeServer(latency_s=0.05) as server:
        args = ["--base-url", server.base_url]
        proc = start_aiq("run", "m.jsonl", "--model", "m", *args, "--concurrency", "4",
                         "--metrics-file", metrics_dir / "aiq.prom", cwd=tmp_path,
                         capture=True)  # fmt: skip
        time.sleep(1.5)  # the first write has happened; the next is due at 5 s
        shutil.rmtree(metrics_dir)
        metrics_dir.write_text("a file where the directory was")  # no directory can be made
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2, stderr
        assert stderr.count("error:") == 1 and "Traceback" not in stderr
        status = json.loads(run_aiq("status", "--json", cwd=tmp_path).stdout)
        assert status["counts"]["running"] == 0  # drained: nothing left claimed
        assert 0 < status["counts"]["done"] < len(prompts)
        done = run_aiq("resume", *args, "--concurrency", "16", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    results = read_jsonl(tmp_path / "m.results.jsonl")
    assert sorted(r["custom_id"] for r in results) == sorted(c for c, _ in prompts)
    sent = [r.prompt for r in server.requests]
    assert len(sent) == len(set(sent)) == len(prompts)  # nothing sent twice


def _done_store(tmp_path: Path, n: int) -> None:
    """``n`` done jobs from p.jsonl, run on the simulated provider (no latency, no faults)."""
    write_prompts(tmp_path / "p.jsonl", _prompts(n))
    (tmp_path / "aiq.yaml").write_text("provider: simulated\n" + _INSTANT)
    proc = run_aiq("run", "p.jsonl", "--concurrency", "64", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_an_export_killed_mid_write_leaves_no_file_behind(tmp_path: Path) -> None:
    # kill -9 (or a reboot) mid-export leaves <file>.tmp-<pid>, as large as the results; the
    # next export removes it. Another process's, still alive, is left alone.
    _done_store(tmp_path, 50)
    before = (tmp_path / "p.results.jsonl").read_bytes()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    orphan = tmp_path / f"p.results.jsonl.tmp-{int(dead.stdout)}"
    in_use = tmp_path / f"p.results.jsonl.tmp-{os.getpid()}"
    orphan.write_bytes(b"half an export")
    in_use.write_bytes(b"another export, going on")

    assert run_aiq("export", cwd=tmp_path).returncode == 0

    assert not orphan.exists() and in_use.exists()
    assert (tmp_path / "p.results.jsonl").read_bytes() == before


def test_a_signal_as_the_temporary_file_opens_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python runs a signal handler as the call it landed in returns: SIGTERM's SystemExit can
    # come out of os.open itself, the file made and no descriptor handed back yet.
    real_open = os.open

    def signalled_as_it_returns(path: str, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, *args, **kwargs)
        if ".tmp-" not in path:
            return fd
        os.close(fd)
        raise SystemExit(130)

    monkeypatch.setattr(os, "open", signalled_as_it_returns)
    with pytest.raises(SystemExit), AtomicFile(str(tmp_path / "p.results.jsonl")):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_real_sigterm_while_the_temporary_file_opens_leaves_none_and_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real signal, sent to this process as the file is made: it is held until the file
    # and its handle both exist, then handled inside __enter__, which removes both. (Between
    # the two, no __exit__ would have run: a CI run under load kept a .tmp- file that way.)
    real_open = os.open
    opened: list[int] = []

    def signalled(path: str, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, *args, **kwargs)
        if ".tmp-" in path:
            opened.append(fd)
            os.kill(os.getpid(), signal.SIGTERM)
        return fd

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(130)

    previous = signal.signal(signal.SIGTERM, terminated)
    # Another thread, as aiq has (aiosqlite's): the kernel may hand it the signal, whose
    # handler then runs in the main thread all the same (a mask on this one held nothing).
    done = threading.Event()
    other = threading.Thread(target=done.wait)
    other.start()
    try:
        monkeypatch.setattr(os, "open", signalled)
        with pytest.raises(SystemExit), AtomicFile(str(tmp_path / "p.results.jsonl")):
            raise AssertionError("the signal comes out of __enter__, not the body")
        monkeypatch.undo()
    finally:
        signal.signal(signal.SIGTERM, previous)
        done.set()
        other.join()
    assert list(tmp_path.iterdir()) == []
    # Its descriptor closed. (Not by counting /proc/self/fd: other threads of a loaded suite
    # open and close their own meanwhile. A number reused since is another file's.)
    (fd,) = opened
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")  # ("... (deleted)" if open, unlinked)
    except FileNotFoundError:
        target = ""  # closed
    assert ".tmp-" not in target, target


def test_a_signal_ends_the_process_even_when_its_unwinding_waits() -> None:
    """SIGTERM raises SystemExit where it lands; if something that unwinding waits for never
    ends (here a thread the interpreter joins at exit), the process still exits with 130
    within the grace (cli.entry._GRACE_S, shortened here), not at the wait's end."""
    code = (
        "import signal, threading, time\n"
        "from aiq.cli import entry\n"
        "entry._GRACE_S = 0.3\n"
        "signal.signal(signal.SIGTERM, entry._terminated)\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()  # joined at exit\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=aiq_env(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=20) == 130
    finally:
        proc.kill()
        proc.stdout.close()
    assert time.monotonic() - began < 10


def test_sigterm_mid_export_exits_130_and_keeps_the_old_files(tmp_path: Path) -> None:
    # SIGTERM (cron, systemd) used to kill an export outright, leaving its temporary file.
    _done_store(tmp_path, 5_000)  # an export of ~3 MB: 0.1 s or more of writing to land in
    results = tmp_path / "p.results.jsonl"
    before = results.read_bytes()
    for _ in range(5):  # the signal must land while the file is being written: retry if not
        proc = start_aiq("export", cwd=tmp_path)
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("p.results.jsonl.tmp-*")) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        if code != 0:  # 0: it finished before the signal landed
            break
    else:
        pytest.skip("every export finished before the signal landed")
    assert code == 130  # interrupted by a signal, whichever (DESIGN.md's exit codes)
    assert list(tmp_path.glob("*.tmp-*")) == []
    assert results.read_bytes() == before
