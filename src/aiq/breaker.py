"""A circuit breaker: when the provider is down, wait for it instead of failing the queue.

Closed, every call goes. When most recent calls failed the way a down provider fails (server
errors, timeouts, refused or reset connections), it opens: one probe at a time goes, at
growing intervals, and the first probe the provider answers (anything but such a failure)
closes it. Jobs are not charged attempts for failures while it is open, so an outage
dead-letters nothing; ``max_outage_s`` bounds how long a run waits for the provider.

That is for a provider that answered and went away. An endpoint that has not answered once
(every call refused, its host unknown, or no connection within the connect timeout) is more
likely a wrong URL or a server not started than an outage: :meth:`CircuitBreaker.never_reached`
says when to stop waiting for it, within seconds. Time comes from the injected clock.

A run keeps one breaker per endpoint and model (:class:`Breakers`): behind one base URL a
gateway may serve a model whose deployment is down while the others answer, and one broken
model must not be taken for the provider going down. Only when every model's breaker is open
is the provider down; until then a broken model's failures are its jobs' own (they use up
their attempts and dead-letter). Whether the endpoint is reachable at all stays endpoint-wide.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

# An endpoint that never answered is given up on after this many calls failed to connect, over
# at least this long: a few retries ride out a server that is a second from listening, or a
# blip of the network, and a wrong URL still fails in seconds, not after --max-outage.
UNREACHABLE_CALLS = 3
UNREACHABLE_S = 2.0


class Reachability:
    """Whether any call has reached the endpoint, and when to give up on one none has."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.reached = False  # whether any call has reached the endpoint
        self._unreachable_calls = 0
        self._first_unreachable_at = 0.0

    def record(self, *, unreachable: bool, took_s: float = 0.0) -> None:
        """A call that never reached the endpoint after trying for ``took_s``, or one that did."""
        if not unreachable:
            self.reached = True
            return
        # From when it was sent: a connect timeout has tried for its whole length.
        sent_at = self._clock() - took_s
        if not self._unreachable_calls or sent_at < self._first_unreachable_at:
            self._first_unreachable_at = sent_at
        self._unreachable_calls += 1

    def never_reached(self) -> bool:
        """Whether to give up: :data:`UNREACHABLE_CALLS` calls failed to connect, the first
        sent :data:`UNREACHABLE_S` or more ago, and none reached the endpoint."""
        return (
            not self.reached
            and self._unreachable_calls >= UNREACHABLE_CALLS
            and self._clock() - self._first_unreachable_at >= UNREACHABLE_S
        )


class CircuitBreaker:
    """Decides whether a call may go now; fed with the outcome of every call."""

    def __init__(
        self,
        *,
        window: int = 20,
        min_calls: int = 10,
        threshold: float = 0.8,
        probe_base_s: float = 1.0,
        probe_cap_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recent: deque[bool] = deque(maxlen=window)  # True: an outage-like failure
        self._bad = 0  # how many of _recent are True (a running sum: this runs every call)
        self._min_calls = min_calls
        self._threshold = threshold
        self._probe_base_s = probe_base_s
        self._probe_cap_s = probe_cap_s
        self._clock = clock
        self.opened_at: float | None = None
        self._probes = 0  # failed probes since it opened
        self._next_probe_at = 0.0
        self._probing = False
        self._reach = Reachability(clock)

    @property
    def reached(self) -> bool:
        """Whether any call recorded here has reached the endpoint."""
        return self._reach.reached

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def outage_s(self) -> float:
        """How long it has been open (0 when closed)."""
        return 0.0 if self.opened_at is None else self._clock() - self.opened_at

    def admit(self) -> float:
        """0 if a call may go now (when open, it is the probe); else seconds to wait first."""
        if self.opened_at is None:
            return 0.0
        if self._probing:
            return min(1.0, self._probe_cap_s)  # look again soon: the probe may come back
        wait = self._next_probe_at - self._clock()
        if wait > 0:
            return wait
        self._probing = True
        return 0.0

    def cancel_probe(self) -> None:
        """The probe ``admit()`` let out was not sent after all: another may go."""
        self._probing = False

    def never_reached(self) -> bool:
        """Whether to give up on an endpoint no call has reached: :data:`UNREACHABLE_CALLS`
        calls failed to connect, the first sent :data:`UNREACHABLE_S` or more ago, and none
        did."""
        return self._reach.never_reached()

    def record(
        self,
        outage_like: bool,
        *,
        probe: bool = False,
        unreachable: bool = False,
        took_s: float = 0.0,
    ) -> None:
        """The outcome of a call: ``outage_like`` if it failed as a down provider fails;
        ``probe`` if it was the call ``admit()`` let out while open (the caller knows: it is
        the one that saw ``is_open`` when admitted); ``unreachable`` if it never reached the
        endpoint (refused, unknown host, connect timeout), after trying for ``took_s``."""
        self._reach.record(unreachable=unreachable, took_s=took_s)
        if self.opened_at is not None:
            if not outage_like:  # the provider answered (the probe, or a call from before)
                self._close()
                return
            if not probe:
                # A call sent before it opened failed too: only the probe's answer counts,
                # or a second probe would go out while the first is still in flight.
                return
            self._probing = False
            self._probes += 1
            # Waits of base, 2 base, 4 base … from the opening on; the exponent is bounded
            # because 2.0 ** 1024 overflows, which a long enough outage would reach.
            delay = self._probe_base_s * 2.0 ** min(self._probes, 64)
            self._next_probe_at = self._clock() + min(self._probe_cap_s, delay)
            return
        recent = self._recent
        if len(recent) == recent.maxlen:
            self._bad -= recent[0]  # about to drop off the window
        recent.append(outage_like)
        self._bad += outage_like
        if len(recent) >= self._min_calls and self._bad >= self._threshold * len(recent):
            self.opened_at = self._clock()
            self._probes = 0
            self._next_probe_at = self.opened_at + self._probe_base_s

    def _close(self) -> None:
        self.opened_at = None
        self._probing = False
        self._recent.clear()
        self._bad = 0


class Breakers:
    """One :class:`CircuitBreaker` per key (the worker's is endpoint and model), made on first
    use with the same settings, and the endpoint's :class:`Reachability`.

    The provider is down (:attr:`all_down`) when every breaker that has seen a call reach the
    endpoint is open, or, before any did, when one is: a breaker that is closed and reached
    says its model answers, so a failure of another model is that model's own. A call that
    never reached the endpoint (refused, no such host) says nothing of any model: it counts
    against every breaker, so they open together as an unreachable endpoint is endpoint-wide.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, **settings: Any) -> None:
        """``settings``: :class:`CircuitBreaker`'s, for each breaker made."""
        self._clock = clock
        self._settings = settings
        self._by_key: dict[Hashable, CircuitBreaker] = {}
        self._open = 0  # how many are open: the worker looks on every call, nearly always 0
        self.reach = Reachability(clock)

    def get(self, key: Hashable) -> CircuitBreaker:
        """The breaker of ``key`` (made closed on first use)."""
        b = self._by_key.get(key)
        if b is None:
            b = self._by_key[key] = CircuitBreaker(clock=self._clock, **self._settings)
        return b

    @property
    def any_open(self) -> bool:
        return self._open > 0

    @property
    def all_down(self) -> bool:
        """Whether the provider is down: some breaker is open and none that reached the
        endpoint is closed."""
        return self._open > 0 and all(b.is_open or not b.reached for b in self._by_key.values())

    def outage_s(self) -> float:
        """How long the provider has been down (0 when it is not): since the last of the open
        breakers opened, as only then did every model fail."""
        if not self.all_down:
            return 0.0
        return min(b.outage_s() for b in self._by_key.values() if b.is_open)

    def never_reached(self) -> bool:
        """Whether to give up on an endpoint no call has reached (:class:`Reachability`)."""
        return self.reach.never_reached()

    def record(
        self,
        key: Hashable,
        outage_like: bool,
        *,
        probe: bool = False,
        unreachable: bool = False,
        took_s: float = 0.0,
    ) -> None:
        """The outcome of a call of ``key``'s (see :meth:`CircuitBreaker.record`)."""
        self.reach.record(unreachable=unreachable, took_s=took_s)
        mine = self.get(key)
        was_open = mine.is_open
        mine.record(outage_like, probe=probe, unreachable=unreachable, took_s=took_s)
        self._open += mine.is_open - was_open
        if unreachable:
            for k, b in self._by_key.items():
                if k != key:  # not a probe of theirs: it changes an open one not at all
                    was_open = b.is_open
                    b.record(True, unreachable=True, took_s=took_s)
                    self._open += b.is_open - was_open

    def broken(self, key: Hashable) -> bool:
        """Whether ``key``'s breaker is open while the provider is up: its model fails alone."""
        b = self._by_key.get(key)
        return b is not None and b.is_open and not self.all_down
