"""What the output bucket holds for requests out (aiq.held_output): Anthropic takes a
request's whole max_tokens on arrival and gives back the rest with its reply."""

from __future__ import annotations

import pytest

from aiq.booking_log import BookingLog
from aiq.held_output import HeldOutput


def test_a_request_arriving_meets_what_those_sent_within_a_latency_hold() -> None:
    log, held = BookingLog(60.0), HeldOutput()
    first = log.add(0.0, 200.0)
    held.booked(first, 400.0)  # max_tokens 600, booked at its estimate of 200
    held.went(first)
    held.ended(first, 2.0)  # answered 2 s after it went: the latency learned
    assert held.latency_s == 2.0 and held.out == 0.0
    a, b, c = log.add(10.0, 200.0), log.add(11.0, 200.0), log.add(13.5, 200.0)
    for entry in (a, b, c):
        held.booked(entry, 400.0)
    held.went(a)
    # At 11.5, a (sent at 10, answered about 12) and b (sent at 11) are out; c is not yet.
    assert held.at(11.5) == 800.0
    # At 13.5 both were answered a latency after they went: only c, going then, holds.
    assert held.at(13.5) == 400.0
    # At 12.5, b: a's reply is due by then, c not booked before it.
    assert held.at(12.5) == 400.0
    # What is out now is the least held, however far ahead the request asks.
    assert held.at(100.0) == 400.0


def test_taken_back_bookings_and_answers_hold_nothing() -> None:
    log, held = BookingLog(60.0), HeldOutput()
    out, ahead = log.add(0.0, 100.0), log.add(5.0, 100.0)
    held.booked(out, 500.0)
    held.booked(ahead, 500.0)
    held.went(out)
    held.taken_back(1.0)  # the slot at 5 s is booked again
    assert held.extra(ahead) == 0.0 and held.at(1.0) == 500.0
    held.ended(out)  # a 429, or no reply: no latency learned
    assert held.at(1.0) == 0.0 and held.latency_s == 0.0


def test_the_latency_eases_down_and_jumps_up() -> None:
    log, held = BookingLog(60.0), HeldOutput()
    for at, reply_s in ((0.0, 4.0), (10.0, 1.0), (20.0, 6.0)):
        entry = log.add(at, 1.0)
        held.booked(entry, 1.0)
        held.ended(entry, at + reply_s)
        if reply_s == 1.0:
            assert held.latency_s == pytest.approx(4.0 - 0.2 * 3.0)
    assert held.latency_s == 6.0
