"""Another client's share of a minute's bucket, learned from its samples.

Two clients on one key draw on one bucket: the samples of a bucket emptier than our own
bookings explain show how much of its refill the other spends, fuller ones that it stopped.
:class:`OutsideShare` learns that as a rate, which :mod:`aiq.window_sync` takes from the
refill, so the model stops sending into a bucket it keeps finding empty.
"""

from __future__ import annotations

import math

# Another client's share of a bucket is learned this fast: a sample this many tokens emptier
# than the model said moves the share by one token a second (so a steady share is found in
# about this many seconds, the noise of a stale sample averaged over as long).
OUTSIDE_TAU_S = 1.0
_OUTSIDE_MAX = 0.9  # of the refill: some always left to find out that it stopped


class OutsideShare:
    """Of a bucket's refill, what another client on the key spends (per second): learned
    from samples of the bucket emptier than our own bookings explain (raised) or fuller
    (lowered: it stopped). Requests only: a token booking is an estimate, and Anthropic
    reserves max_tokens on arrival, so a token bucket is emptier than its model by design."""

    __slots__ = ("learns", "rate", "sampled_at")

    def __init__(self, learns: bool) -> None:
        self.learns = learns
        self.rate = 0.0
        self.sampled_at = -math.inf

    def learn(self, owed: float, expected: float, nominal: float) -> None:
        """The sample says the bucket owes ``owed``, the model said ``expected``."""
        # (A bucket full, or predicted so, hides what was spent: nothing to learn.)
        if owed >= 1 and expected >= 1 and self.sampled_at > -math.inf:
            # (Raised faster than lowered: a share guessed low sends into an empty bucket.)
            missing = owed - expected
            tau_s = OUTSIDE_TAU_S if missing > 0 else 2 * OUTSIDE_TAU_S
            rate = self.rate + missing / tau_s
            self.rate = min(_OUTSIDE_MAX * nominal, max(0.0, rate))

    def refused_empty(self, expected: float, nominal: float) -> None:
        """A 429 at an empty bucket: its request had a slot in the model, and the token it was
        booked on was spent by another client. An empty bucket reads no emptier however much
        is taken from it (a sample then matches the model), so 429s are all that show the
        share: one token each (it stayed 0 for 8 s beside a client at half the limit, a 429
        in every two requests, in 7 of 17 bench runs of g-other-client)."""
        self.learn(expected + 1.0, expected, nominal)
