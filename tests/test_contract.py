"""The typed contract (aiq.contract): its runtime tuples match its Literal types, and what
every layer produces stays inside them."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiq import contract
from aiq.config import Config
from aiq.errors import UsageError
from aiq.providers.base import classify_status
from aiq.settings import SETTINGS
from aiq.stops import CONTENT_FILTER, TRUNCATED


def test_state_names_follow_the_states() -> None:
    states = (contract.QUEUED, contract.RUNNING, contract.DONE, contract.DEAD)
    assert states == get_args(contract.JobState) == (0, 1, 2, 3)
    assert [contract.STATE_NAMES[s] for s in states] == ["queued", "running", "done", "dead"]


def test_stop_kinds_are_the_stops_constants() -> None:
    assert get_args(contract.StopKind) == (TRUNCATED, CONTENT_FILTER)


@given(
    st.integers(100, 999),
    st.sampled_from(["", "maximum context length", "credit balance is too low", "x"]),
    st.sampled_from([None, "insufficient_quota", "billing_error", "project_spend_limit_exceeded"]),
)
def test_every_classified_status_is_an_error_type(
    status: int, message: str, code: str | None
) -> None:
    error_type, _, _ = classify_status(status, message, code)
    assert error_type in get_args(contract.ErrorType)


@pytest.mark.parametrize(
    ("setting", "choices"),
    [("provider", contract.PROVIDER_NAMES), ("order", contract.ORDERS),
     ("on_truncated", contract.ON_TRUNCATED)],
)  # fmt: skip
def test_settings_take_exactly_the_contracts_choices(
    setting: str, choices: tuple[str, ...]
) -> None:
    check, allowed = SETTINGS[setting]
    assert allowed == " | ".join(choices)
    assert [check(c) for c in choices] == list(choices)
    with pytest.raises(ValueError, match="is unknown"):
        check("other")
    with pytest.raises(UsageError, match=f"{setting}: 'other' is unknown; use {choices[0]}"):
        Config(**{setting: "other"})  # type: ignore[arg-type]  # (a wrong value on purpose)
