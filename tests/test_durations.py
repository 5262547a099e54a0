"""Durations in messages: ``15 s``, ``1 min 30 s``, ``10 min``, never ``0.25 min``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq.durations import duration_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"), (0.04, "0 s"), (0.25, "0.2 s"), (0.3, "0.3 s"), (2, "2 s"), (2.5, "2.5 s"),
        (9.96, "10 s"), (15, "15 s"), (20, "20 s"), (59.4, "59 s"), (59.6, "1 min"),
        (60, "1 min"), (90, "1 min 30 s"), (600, "10 min"), (3599, "59 min 59 s"),
        (3600, "1 h"), (3720, "1 h 2 min"), (86400, "24 h"),
    ],
)  # fmt: skip
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


@given(st.floats(min_value=0, max_value=10**7, allow_nan=False))
def test_every_duration_reads_in_whole_units_of_s_min_or_h(seconds: float) -> None:
    parts = duration_text(seconds).split()
    assert len(parts) in (2, 4) and parts[1::2] in (
        ["s"],
        ["min"],
        ["h"],
        ["min", "s"],
        ["h", "min"],
    )
    assert all(float(n) >= 0 for n in parts[::2])
