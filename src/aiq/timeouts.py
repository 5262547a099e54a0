"""How long to wait for a reply: a per-model timeout learned from the latencies seen.

One fixed timeout serves two opposite needs badly. Replies that take 50 ms make a 30 s hang
cost 30 s; a reasoning model or a long output takes minutes, and a timeout short enough for
the first case cuts it and sends it again, billed each time. So each model gets its own:

    timeout = max(FLOOR_S, MULTIPLE x p99 of its last WINDOW reply latencies)

once it has MIN_SAMPLES replies, and never above the ceiling (``--timeout``, 600 s by default,
as the official OpenAI and Anthropic SDKs wait). Before that the ceiling alone applies. Only
replies that came back are samples: a call cut short has no latency, and counting hangs as
samples would lift the percentile into the hangs it is meant to cut. But the calls still out
are weighed (OUT_SHARE): the first replies of a burst are its fastest, so while more than
one in twenty of the calls sent long enough ago (between 10 and 0.9 times that p99) is still
out, nothing is learned from them.

A job cut by the learned timeout gets ``ESCALATE`` times as long on its next attempt, and its
last attempt the whole ceiling, so a prompt that is merely slower than the rest (a long
output) still finishes, and a model that slows down for good is sampled at its new speed
and the timeout follows it. Pure: the caller measures time and sends; tests feed numbers.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

# Never cut sooner. It binds only where the p99 is under FLOOR_S / MULTIPLE (125 ms: an
# embeddings call, a local model's short reply), where a hang would otherwise cost a batch
# of a few seconds most of its time. It is above Linux's shortest TCP retransmit (200 ms) and
# the event-loop stalls of a loaded 2-core machine (0.25 s was tried: the suite's timing
# tests failed more often under CI's load, and a call cut spuriously may be billed twice).
FLOOR_S = 0.5
MULTIPLE = 4.0  # of the p99: a reply slower than 4x the slowest 1% is most likely never coming
PERCENTILE = 0.99
MIN_SAMPLES = 20  # replies before the p99 is trusted; until then the ceiling applies
WINDOW = 256  # the latest replies: a model that slows down is followed within a few hundred
ESCALATE = 4.0  # per cut of the same job
_EVERY = 16  # samples between recomputing the percentile (a sort of WINDOW values)
# A percentile p of the replies is trusted only if, of the calls sent between _SPAN x p and
# _NEAR x p ago, at most this share is still out (out so long, each is slower than p; a p99
# leaves about 1% of them out). The first replies of a burst are its fastest: of 300 sent at
# once taking 0.2-4 s, the first 20 gave a p99 of 0.6 s, and 148 of the 300 were cut at
# 2.4 s and sent again (billed twice: a call cut is still generated). One in twenty: a hang
# in a hundred calls is cut, a slow twentieth is not. (_NEAR: a burst's calls still out went
# a moment after the replies that set p, and have been out a moment less.)
OUT_SHARE = 0.05
_NEAR = 0.9
_SPAN = 10.0
_SENT = 100_000  # send times kept at most, per model


@dataclass(frozen=True, slots=True)
class TimeoutRule:
    """The numbers of the rule above; tests and callers may choose others."""

    floor_s: float = FLOOR_S
    multiple: float = MULTIPLE
    percentile: float = PERCENTILE
    min_samples: int = MIN_SAMPLES
    window: int = WINDOW
    escalate: float = ESCALATE


class _Latencies:
    """One model's recent reply latencies and the timeout they give."""

    __slots__ = ("_p", "_rule", "_samples", "_sent", "_since", "_slowest", "timeout_s")

    def __init__(self, rule: TimeoutRule) -> None:
        self._rule = rule
        self._samples: deque[float] = deque(maxlen=rule.window)
        self._sent: deque[float] = deque(maxlen=_SENT)  # when its recent calls went, in order
        self._since = 0  # samples since the timeout was last computed
        self._p: float | None = None  # the percentile last computed
        self._slowest = 0.0  # the window's slowest reply, as of then
        self.timeout_s: float | None = None  # None: too few samples, the ceiling applies

    def add(self, latency_s: float, now: float, out: Collection[float]) -> None:
        self._samples.append(latency_s)
        self._since += 1
        n = len(self._samples)
        p = self._p
        # Recomputed on every sample until the window is full, then every _EVERY samples.
        if n >= self._rule.min_samples and (n < self._rule.window or self._since >= _EVERY):
            self._since = 0
            ranked = sorted(self._samples)
            p = self._p = ranked[max(0, math.ceil(self._rule.percentile * n) - 1)]  # nearest
            self._slowest = ranked[-1]
            trusted = self._still_out(now, p, out) <= OUT_SHARE
        elif (
            self.timeout_s is None and p is not None and len(out) <= OUT_SHARE * self._went(now, p)
        ):
            # Between recomputations a p held back is checked again, cheaply: a burst's last
            # replies would otherwise leave it held back until _EVERY more came.
            trusted = True
        else:
            return
        self.timeout_s = max(self._rule.floor_s, self._rule.multiple * p) if trusted else None

    def look_again(self, now: float, out: Collection[float]) -> bool:
        """Whether the percentile held back (OUT_SHARE) is trusted now, with no new reply:
        the calls still out went over _SPAN x p ago, and are at most one in twenty of them
        and the window's replies. A few hangs, not a slower share of a burst (20 answered
        fast, 40 still out: the reply that comes next is the one to look again)."""
        p = self._p
        if self.timeout_s is not None or p is None or self._still_out(now, p, out) > OUT_SHARE:
            return False
        if len(out) > OUT_SHARE * (len(self._samples) + len(out)):
            return False
        self.timeout_s = max(self._rule.floor_s, self._rule.multiple * p)
        return True

    def sent(self, at: float) -> None:
        self._sent.append(at)

    def sent_after(self, at: float) -> int:
        """How many of the calls kept went after ``at``."""
        return len(self._sent) - bisect.bisect_right(self._sent, at)

    def _went(self, now: float, p: float) -> int:
        """How many calls went between _SPAN x ``p`` and _NEAR x ``p`` ago."""
        sent = self._sent
        # Kept as far back as the tail's rule looks (aiq.timed_calls: a p99 before a call
        # out for up to the timeout's floor), or a slow tail forgot what went round a hang.
        keep = now - max(_SPAN * p, self._rule.floor_s + 2 * p)
        while sent and sent[0] < keep:
            sent.popleft()
        return bisect.bisect_right(sent, now - _NEAR * p) - bisect.bisect_left(
            sent, now - _SPAN * p
        )

    def _still_out(self, now: float, p: float, out: Collection[float]) -> float:
        """The share still out of the calls sent between _SPAN x ``p`` and _NEAR x ``p``
        ago (0 when the caller keeps no send times)."""
        went = self._went(now, p)
        if not went:
            return 0.0
        since, until = now - _SPAN * p, now - _NEAR * p
        return sum(1 for at in out if since <= at <= until) / went


class Timeouts:
    """Per-model timeouts under ``ceiling_s``: fed each reply's latency, asked before each call."""

    def __init__(self, *, ceiling_s: float, rule: TimeoutRule = TimeoutRule()) -> None:
        if ceiling_s <= 0:
            raise ValueError(f"ceiling_s must be positive, not {ceiling_s}")
        self.ceiling_s = ceiling_s
        self.rule = rule
        self._models: dict[str | None, _Latencies] = {}

    def observe(
        self,
        model: str | None,
        latency_s: float,
        *,
        now: float = 0.0,
        out: Collection[float] = (),
    ) -> None:
        """A call to ``model`` got its reply after ``latency_s``. Successful replies only: a
        429 or a 500 comes back at once, and would make the generations look fast. ``out``:
        when the model's calls still out were sent (as :meth:`sending` was told), on the
        clock ``now`` reads (OUT_SHARE)."""
        self._model(model).add(latency_s, now, out)

    def look_again(self, model: str | None, *, now: float, out: Collection[float]) -> bool:
        """With no new reply, whether ``model``'s timeout, held back by the calls out
        (OUT_SHARE), is trusted now (``now`` and ``out`` as for :meth:`observe`)."""
        m = self._models.get(model)
        return m is not None and m.look_again(now, out)

    def sending(self, model: str | None, at: float) -> None:
        """A call to ``model`` goes at ``at`` (the clock ``observe``'s ``now`` reads)."""
        self._model(model).sent(at)

    def _model(self, model: str | None) -> _Latencies:
        m = self._models.get(model)
        if m is None:
            m = self._models[model] = _Latencies(self.rule)
        return m

    def learned_s(self, model: str | None) -> float | None:
        """The timeout the latencies give ``model``, under the ceiling; None before enough."""
        m = self._models.get(model)
        if m is None or m.timeout_s is None:
            return None
        return min(m.timeout_s, self.ceiling_s)

    def percentile_s(self, model: str | None) -> float | None:
        """The p99 of ``model``'s replies behind its learned timeout; None before one is."""
        m = self._models.get(model)
        return None if m is None or m.timeout_s is None else m._p

    def slowest_s(self, model: str | None) -> float | None:
        """The slowest of ``model``'s recent replies, as of its p99; None before one is."""
        m = self._models.get(model)
        return None if m is None or m.timeout_s is None else m._slowest

    def sent_after(self, model: str | None, at: float) -> int:
        """How many calls to ``model`` went after ``at``, of those kept: from the last
        reply's time back the longer of _SPAN x its p99 and the floor plus twice the p99
        (every one, before a timeout is learned)."""
        m = self._models.get(model)
        return 0 if m is None else m.sent_after(at)

    def timeout_s(self, model: str | None, *, cuts: int = 0, last: bool = False) -> float | None:
        """How long the next call may take before aiq cuts it, or None: only the ceiling
        applies (the transport's read timeout). ``cuts`` is how often this job was already
        cut by a learned timeout; ``last``, whether this is the job's last attempt."""
        learned = self.learned_s(model)
        if learned is None or last:
            return None
        t = learned * self.rule.escalate ** min(cuts, 32)
        return t if t < self.ceiling_s else None
