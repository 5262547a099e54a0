"""--deadline as written (a time or a duration) and the rule --via auto switches by."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiq.config import Config
from aiq.deadline import (
    ASSUMED_RPM,
    MOST_S,
    Outlook,
    allowance_s,
    online_rate,
    parse_deadline,
    parse_duration,
)
from aiq.errors import UsageError

NOW = 1_800_000_000.0  # 2027-01-15, a fixed "now"
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from("smhdSMHD")), min_size=1))
def test_a_duration_is_the_sum_of_its_parts(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{u}" for n, u in parts)
    total = sum(n * UNITS[u.lower()] for n, u in parts)
    assert parse_duration(text) == total
    if not total:
        with pytest.raises(ValueError, match="no time from now"):
            parse_deadline(text, now=NOW)
    elif total > MOST_S:
        with pytest.raises(ValueError, match="is more than a year away"):
            parse_deadline(text, now=NOW)
    else:
        assert parse_deadline(text, now=NOW) == NOW + total


@settings(max_examples=40)  # each a few date parses: keep it well under a second
@given(st.text(alphabet="0123456789:-+TZ smhd.x", max_size=12))
def test_any_text_is_a_deadline_after_now_or_a_value_error_quoting_it(text: str) -> None:
    try:
        at = parse_deadline(text, now=NOW)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert at > NOW


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6h", 6 * 3600), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("1.5h", 5400),
     (" 2d ", 2 * 86400)],
)  # fmt: skip
def test_durations_as_the_issue_writes_them(text: str, seconds: float) -> None:
    assert parse_deadline(text, now=NOW) == NOW + seconds


@pytest.mark.parametrize("text", ["", "6", "h", "1h30", "6 h", "-5m", "tomorrow", "25:00"])
def test_text_that_is_neither_a_time_nor_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a time or a duration"):
        parse_deadline(text, now=NOW)


def test_times_with_and_without_an_offset() -> None:
    now = time.time()
    later = datetime.now().replace(microsecond=0) + timedelta(hours=3)
    assert parse_deadline(later.isoformat(), now=now) == later.timestamp()  # local
    in_utc = later.astimezone(UTC)
    assert parse_deadline(in_utc.isoformat(), now=now) == later.timestamp()  # +00:00
    zulu = in_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert parse_deadline(zulu, now=now) == later.timestamp()
    plus_one = in_utc.astimezone(timezone(timedelta(hours=1))).isoformat()
    assert parse_deadline(plus_one, now=now) == later.timestamp()


def test_a_clock_time_is_the_next_one_to_come() -> None:
    now = datetime.now().replace(microsecond=0)
    soon, past = now + timedelta(minutes=5), now - timedelta(minutes=5)
    at = parse_deadline(soon.strftime("%H:%M:%S"), now=now.timestamp())
    assert 0 < at - now.timestamp() <= 301  # today (or across midnight: still 5 min)
    at = parse_deadline(past.strftime("%H:%M:%S"), now=now.timestamp())
    assert abs(at - now.timestamp() - (86400 - 300)) <= 3600  # tomorrow (give or take DST)


def test_a_time_in_the_past_is_refused_saying_so() -> None:
    with pytest.raises(ValueError, match=r"'2020-01-01T06:00' is in the past \(2020-01-01"):
        parse_deadline("2020-01-01T06:00", now=NOW)


def test_the_flag_and_the_file_name_the_setting_and_the_value() -> None:
    with pytest.raises(UsageError, match=r"--deadline: 'soon' is not a time or a duration; use"):
        Config.resolve(flags={"deadline": "soon"}, env={})
    with pytest.raises(UsageError, match="--deadline: '2020-01-01' is in the past"):
        Config.resolve(flags={"deadline": "2020-01-01"}, env={})
    before = time.time()
    config = Config.resolve(flags={"deadline": "90m", "via": "auto"}, env={})
    assert config.deadline is not None and 0 <= config.deadline - before - 5400 < 5
    assert config.target.deadline == config.deadline  # recorded with the via
    assert Config(deadline=config.deadline).deadline == config.deadline  # as the store keeps it
    with pytest.raises(UsageError, match="360 is not a time or a duration"):
        Config(deadline=360)  # YAML 1.1 reads an unquoted 06:00 as 360


def test_the_online_rate_is_the_models_then_the_runs_then_assumed() -> None:
    assert online_rate(300, None, {}, "m") == (300.0, True)
    assert online_rate(300, None, {"m": (50, None)}, "m") == (50.0, True)
    assert online_rate(None, 200_000, {}, "m") == (200.0, True)  # at 1,000 tokens a request
    assert online_rate(None, None, {}, "m") == (float(ASSUMED_RPM), False)


def test_the_allowance_is_five_minutes_or_a_tenth_of_the_time() -> None:
    assert allowance_s(6 * 3600) == 300 and allowance_s(600) == 60 and allowance_s(-1) == 0


def _outlook(remaining: int, time_left_s: float, rpm: float = 60) -> Outlook:
    return Outlook(
        deadline=NOW + time_left_s, now=NOW, remaining=remaining, rpm=rpm, rate_known=True,
        allowance_s=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("remaining", "time_left_s", "switch"),
    [
        (0, 1, False),  # nothing left: nothing to switch for
        (100, 100 * 1.25 + 60 + 1, False),  # just in time still: wait on the batch
        (100, 100 * 1.25 + 60, True),  # the last moment online still makes it
        (100, 10, True),  # too late for either: online is the faster
        (1, 3600, False),
    ],
)
def test_the_switch_comes_when_online_would_only_just_make_it(
    remaining: int, time_left_s: float, switch: bool
) -> None:
    outlook = _outlook(remaining, time_left_s)
    assert outlook.switch is switch
    assert outlook.look_again_s == (0 if switch else time_left_s - outlook.needed_s)


def test_the_decision_is_one_line_with_its_figures() -> None:
    line = _outlook(40_000, 2 * 3600 + 600, rpm=300).line(open_batches=3)
    assert line.endswith(
        "in 2h10m: 40,000 left would take 2h13m online at 300/min: cancelling 3 open "
        "batches, finishing online"
    )
    assert line.startswith("deadline ")
    wait = _outlook(10, 3600).line(open_batches=1)
    assert "batch first, online in 58m48s unless the batches get ahead" in wait
    assumed = Outlook(
        deadline=NOW + 10, now=NOW, remaining=20, rpm=60, rate_known=False, allowance_s=0
    )
    assert "at 60/min (assumed: no --rpm): finishing online" in assumed.line(open_batches=0)
