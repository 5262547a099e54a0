"""What the machine allows a run in flight (aiq.machine): open files, memory, max_concurrency."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aiq.machine import (
    BYTES_PER_REQUEST,
    MEMORY_SHARE,
    RESERVED_FILES,
    concurrency_bound,
    memory_bytes,
)

GIB = 2**30


def test_the_open_files_limit_bounds_it_less_what_the_store_and_files_need() -> None:
    bound = concurrency_bound(None, open_files=1024, memory=64 * GIB)
    assert bound.senders == 1024 - RESERVED_FILES
    assert "open-files limit (1,024" in bound.reason


def test_memory_bounds_it_on_a_small_machine() -> None:
    bound = concurrency_bound(None, open_files=1_048_576, memory=GIB)
    assert bound.senders == int(GIB * MEMORY_SHARE / BYTES_PER_REQUEST)
    assert bound.reason == "memory (1.0 GiB)"


def test_max_concurrency_stays_a_cap_and_the_machine_still_bounds_it() -> None:
    assert concurrency_bound(256, open_files=20_000, memory=64 * GIB).reason == (
        "max_concurrency 256"
    )
    over = concurrency_bound(50_000, open_files=20_000, memory=64 * GIB)
    assert over.senders == 20_000 - RESERVED_FILES  # more than the machine allows: its bound
    # A tie names the user's setting: it is the one they can change in the config.
    assert concurrency_bound(936, open_files=1000, memory=None).reason == "max_concurrency 936"


def test_with_nothing_known_a_modest_default() -> None:
    assert concurrency_bound(None, open_files=None, memory=None).senders == 4096


def test_the_machine_says_how_much_memory_it_has() -> None:
    memory = memory_bytes()
    assert memory is None or memory > 64 * 2**20


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="no open-files limit on Windows")
def test_a_run_raises_its_soft_open_files_limit_to_the_hard_one() -> None:
    # In a child process: the soft limit lowered first, as many systems set it (1,024).
    code = (
        "import resource\n"
        "from aiq.machine import raise_open_files_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "now = raise_open_files_limit()\n"
        "print(now, *resource.getrlimit(resource.RLIMIT_NOFILE), hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    now, soft, hard_after, hard = (int(x) for x in out.stdout.split())
    assert hard_after == hard
    if hard != -1:  # RLIM_INFINITY: the kernel's own maximum instead
        assert now == soft == hard
