"""Input and output token limits apart (Anthropic's ITPM and OTPM), each its own Budget.

Anthropic limits the input tokens and the output tokens of a model per minute separately, and
counts each its own way (its rate-limits page, docs.anthropic.com/en/api/rate-limits;
../shared/PROVIDERS.md):

- **ITPM** counts ``input_tokens + cache_creation_input_tokens``; cache reads are free
  (except on Claude Haiku 3.5). A request is booked at its prompt estimate times the ratio
  learned from replies of counted input to estimate (so a prompt-cached batch learns that
  most of its prompt is free), and settled at what the reply says was counted.
- **OTPM** counts the tokens generated. Anthropic "estimates" it from ``max_tokens`` at the
  start of a request and adjusts it to the real figure at the end, so what a minute allows is
  the output really generated: a request is booked at the mean output of the replies so far
  (capped by its ``max_tokens``), not at ``max_tokens``, and settled at its ``output_tokens``.

Neither budget sends what the provider's bucket holds at once: a sharp rise in usage is what
Anthropic's *acceleration limits* refuse ("ramp up your traffic gradually"), and every
request arriving together reserves its whole ``max_tokens`` of output. So both are paced,
and a large limit (:data:`RAMP_FROM_PER_MINUTE` or more) is ramped up from the run's first
request: :class:`Ramp`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

from .booking_log import Booking
from .budget import WINDOW_S, Budget
from .held_output import HeldOutput
from .ramp import RAMP_FROM_PER_MINUTE, RAMP_S, RAMP_START_SHARE, Ramp
from .ratelimit_headers import RateLimitInfo, Window
from .window_sync import REBOOK_EVERY_S

__all__ = [
    "NO_SPLIT",
    "RAMP_FROM_PER_MINUTE",
    "RAMP_S",
    "RAMP_START_SHARE",
    "Ramp",
    "SplitCost",
    "SplitTokens",
]

# Slots booked ahead further than the pace puts them, when a sample says they fit now (booked
# under an older, tighter one), are booked again: looked at most this often.
_STALE_CHECK_S = 1.0
# ...and only when they would go this much sooner.
_STALE_BY_S = 5.0
# Slots booked ahead at an estimate this many times what replies now show are booked again
# too (a prompt cache, warm after its first replies, counts a tenth of the prompt or less).
_STALE_ESTIMATE = 2.0
# ...and for the output, this many times the mean: replies vary (100 to 600 tokens), and a
# mean lifted by one long reply put every slot booked ahead a long way apart (8 senders: 18 s
# of slots at 296 where the replies went on at 100-200; the bucket stayed full, 0.85 of the
# OTPM used). The least share of OTPM used in 200 random batches (3 seeds): 0.84-0.89 at 2,
# 0.99-1.09 at 1.5 (bench/README "Session 32"); at 1.25 one batch of 200 got a 429.
_STALE_OUTPUT = 1.5
# Anthropic rounds the token ``remaining`` it reports (to the thousand); its ``reset`` says when
# the bucket is full again, which gives the level more closely, within this of ``remaining``.
_ROUNDING = 1000


class SplitCost(NamedTuple):
    """What one request is booked at: ``input`` and ``output`` tokens; ``reserve`` is the
    output the provider holds for it on arrival (its ``max_tokens``), which must fit then."""

    input: float
    output: float
    reserve: float


NO_SPLIT = SplitCost(0.0, 0.0, 0.0)


def _unrounded(window: Window) -> Window:
    """``window`` with the level its reset implies for a bucket (``limit`` refilled over a
    minute, full at the reset) in place of the rounded ``remaining``, when within rounding of
    it: 7,000 reported of 8,000 may be 7,999, a sixth of a minute's worth more; the reset
    says which, and a sample that agrees shows a bucket (:meth:`Budget.sync`)."""
    limit, remaining, reset = window.limit, window.remaining, window.reset_s
    if not limit or remaining is None or reset is None:
        return window
    level = limit - reset * limit / WINDOW_S
    if remaining - 1 <= level < remaining + _ROUNDING:
        return Window(limit, max(remaining, math.floor(level)), reset)
    return window


# A reply's weight in the means once past the first few: they follow fast, as a prompt cache
# turns the counted input from all of the prompt to a tenth or less after the first replies,
# and slots are spaced at the estimate's pace (``_spaced``), so one lagging behind replies
# that got shorter holds the run back (0.2 for the output: 0.84 of OTPM on average in 30
# random batches of the property test's kind; 0.5: 0.98).
_INPUT_WEIGHT = 0.5
_OUTPUT_WEIGHT = 0.5


class _Mean:
    """A mean of recent figures: a plain mean first, then a moving average."""

    __slots__ = ("samples", "value", "weight")

    def __init__(self, value: float, weight: float) -> None:
        self.value = value
        self.weight = weight
        self.samples = 0

    def update(self, figure: float) -> None:
        self.samples += 1
        self.value += max(self.weight, 1.0 / self.samples) * (figure - self.value)


class SplitTokens:
    """The input and output token budgets of one model, learned from the provider's headers.

    ``started_at`` is when the run's first request was booked: a ramp starts there.
    """

    def __init__(self, *, headroom: float, started_at: float) -> None:
        self._headroom = headroom
        self._started_at = started_at
        self.input: Budget | None = None
        self.output: Budget | None = None
        self._ramps: dict[str, Ramp] = {}
        self._input_ratio = _Mean(1.0, _INPUT_WEIGHT)  # counted input over the estimate
        self._counted = _Mean(0.0, _INPUT_WEIGHT)  # counted input tokens a reply
        self._output = _Mean(0.0, _OUTPUT_WEIGHT)  # output tokens a reply
        # Output booked and not answered yet, with what the provider holds for it beyond its
        # estimate while it is out (its max_tokens reserved on arrival, given back at the end).
        self._holds = HeldOutput()
        # What the last request booked in each budget cost, and needed to fit on arrival.
        self._last: dict[int, tuple[float, float]] = {}
        self._stale_check_at = -math.inf  # (of a sample's, and of an estimate's)
        self._crowd_check_at = -math.inf  # (of the first slot ahead's room)
        self._estimate_check_at = -math.inf
        # The earliest the next booking of each budget may go: the last one's slot, its cost
        # long at the pace. A settled booking that cost less than its estimate gives the pace
        # back, and with slots booked ahead that would land the next one beside the last: each
        # arriving at once with its max_tokens reserved, more than the bucket holds.
        self._spaced: dict[str, float] = {}
        # The highest (input ratio, output mean) slots were booked at since the last rebook.
        self._booked_at = (0.0, 0.0)

    def budgets(self) -> Iterator[Budget]:
        return (b for b in (self.input, self.output) if b is not None)

    def costs(self, prompt_estimate: int, reserved: int) -> SplitCost:
        """What one request of ``prompt_estimate`` tokens and ``max_tokens`` ``reserved``
        (0: not said) is booked at."""
        output = self._output.value if self._output.samples else float(reserved)
        if reserved > 0:
            output = min(output, float(reserved))
        return SplitCost(prompt_estimate * self._input_ratio.value, output, float(reserved))

    def _each(self, costs: SplitCost) -> Iterator[tuple[str, Budget, float, float]]:
        """(kind, budget, cost booked, cost that must fit now) of each budget ``costs`` uses."""
        if self.input is not None and costs.input > 0:
            yield "input", self.input, costs.input, costs.input
        if self.output is not None and costs.output > 0:
            # Over the whole limit still fits: only the tokens generated count in the end.
            limit = self.output.per_minute
            yield "output", self.output, min(costs.output, limit), min(costs.reserve, limit)

    def ready_at(self, at: float, costs: SplitCost) -> float:
        """The first time from ``at`` that ``costs`` fit both budgets (and their ramps): the
        output's pace at its estimate, and what the provider reserves on arrival, its whole
        ``max_tokens``, left in its bucket or window then, beside what the requests out
        still hold."""
        for kind, budget, cost, fit in self._each(costs):
            at = max(at, self._spaced.get(kind, -math.inf))
            need = max(cost, fit if kind == "input" else self._with_held(fit, budget, at))
            at = budget.ready_at(at, need)
            if (ramp := self._ramps.get(kind)) is not None:
                at = ramp.ready_at(at)
        return at

    def _with_held(self, fit: float, budget: Budget, at: float) -> float:
        """``fit`` of output and what the requests out at ``at`` hold beyond their estimates
        (:class:`~aiq.held_output.HeldOutput`; at most the limit: a request never needs more,
        and asking more would never fit)."""
        return min(fit + self._holds.at(at), budget.per_minute)

    def went(self, entry_out: Booking | None) -> None:
        """The request booked at ``entry_out`` was sent: the provider holds its max_tokens
        until its reply."""
        if entry_out is not None:
            self._holds.went(entry_out)

    def ended(self, entry_out: Booking | None, now: float | None = None) -> None:
        """The request booked at ``entry_out`` was answered at ``now`` (None: refused, given
        back, or no reply): it holds nothing more."""
        if entry_out is not None:
            self._holds.ended(entry_out, now)

    def pace_s(self, costs: SplitCost) -> float:
        """How far one booking of ``costs`` moves the slower budget's pace."""
        return max((b.pace_s(c) for _, b, c, _ in self._each(costs)), default=0.0)

    def book(self, at: float, costs: SplitCost) -> tuple[Booking | None, Booking | None]:
        """Book ``costs`` at ``at`` (from :meth:`ready_at`); the (input, output) entries."""
        entries: dict[str, Booking] = {}
        for kind, budget, cost, fit in self._each(costs):
            entries[kind] = budget.book(at, cost)
            self._spaced[kind] = at + budget.pace_s(cost)
            self._last[id(budget)] = (cost, max(cost, fit))
            if (ramp := self._ramps.get(kind)) is not None:
                ramp.book(at, cost, budget.per_minute * self._headroom / WINDOW_S)
        ratio, output = self._booked_at
        self._booked_at = (max(ratio, self._input_ratio.value), max(output, self._output.value))
        if (out := entries.get("output")) is not None and costs.reserve > out.cost:
            self._holds.booked(out, costs.reserve - out.cost)
        return entries.get("input"), out

    def taken_back(self, now: float) -> None:
        """Every slot booked after ``now`` was taken back (:meth:`Budget.drop_ahead`): the
        next may go from now, at the budgets' own pace."""
        for kind, at in self._spaced.items():
            self._spaced[kind] = min(at, now)
        for ramp in self._ramps.values():
            ramp.taken_back(now)
        self._holds.taken_back(now)

    def forget(self, entries: tuple[Booking | None, Booking | None]) -> None:
        for budget, entry in zip((self.input, self.output), entries, strict=True):
            if budget is not None and entry is not None:
                budget.forget(entry)
        self.ended(entries[1])

    def settle(
        self,
        entries: tuple[Booking | None, Booking | None],
        prompt_estimate: int,
        *,
        counted_in: int | None,
        output_tokens: int,
        now: float,
    ) -> bool:
        """A reply's usage: ``counted_in`` input tokens the input limit counts (None: the
        reply said nothing), ``output_tokens`` generated (0: unknown). True if slots booked
        ahead are to be booked again, at the new estimates (far under the old ones)."""
        entry_in, entry_out = entries
        self.ended(entry_out, now)
        if counted_in is not None:
            self._counted.update(counted_in)
            if prompt_estimate > 0:
                self._input_ratio.update(counted_in / prompt_estimate)
            if entry_in is not None and self.input is not None:
                self._ramp_settle("input", self.input, entry_in, counted_in)
                self.input.settle(entry_in, counted_in)
        if output_tokens > 0:
            self._output.update(output_tokens)
            if entry_out is not None and self.output is not None:
                self._ramp_settle("output", self.output, entry_out, output_tokens)
                self.output.settle(entry_out, output_tokens)
        return self._overestimated(now)

    def _ramp_settle(self, kind: str, budget: Budget, entry: Booking, cost: float) -> None:
        if (ramp := self._ramps.get(kind)) is not None:
            ramp.settle(entry.at, cost - entry.cost, budget.per_minute * self._headroom / WINDOW_S)

    def _overestimated(self, now: float) -> bool:
        """Whether slots booked ahead were booked at an estimate far over what replies show
        now: with many senders each holding one, the last would wait for a minute's worth
        of tokens that will not be counted."""
        ratio, output = self._booked_at
        lower = self._input_ratio.value * _STALE_ESTIMATE < ratio
        lower = lower or self._output.value * _STALE_OUTPUT < output
        if not lower or now < self._estimate_check_at:
            return False
        if all(b.next_booked(now) is None for b in self.budgets()):
            return False
        self._estimate_check_at = now + _STALE_CHECK_S
        self._booked_at = (self._input_ratio.value, self._output.value)
        return True

    def sync(
        self,
        now: float,
        info: RateLimitInfo,
        entries: tuple[Booking | None, Booking | None],
        *,
        minute_left_s: float,
    ) -> bool:
        """Follow the reply's input and output headers (:meth:`Budget.sync`), learning a
        budget the first time its limit shows; True if slots booked ahead are to be booked
        again."""
        rebook = False
        windows = (("input", info.input_tokens), ("output", info.output_tokens))
        for (kind, window), entry in zip(windows, entries, strict=True):
            budget = self.input if kind == "input" else self.output
            if budget is None:
                if not window.limit:
                    continue
                budget = Budget(window.limit, headroom=self._headroom, configured=False)
                budget.burst_off = True  # paced, never sent at once (the module docstring)
                if kind == "input":
                    self.input = budget
                else:
                    self.output = budget
                if window.limit >= RAMP_FROM_PER_MINUTE:
                    self._ramps[kind] = Ramp(self._started_at)
            window = _unrounded(window)
            if kind == "output":
                window = self._given_back(now, window, entry)
            rebook = budget.sync(now, window, entry, minute_left_s=minute_left_s) or rebook
            rebook = rebook or self._stale_ahead(now, budget, window)
            rebook = rebook or self._crowded_ahead(now, budget, window)
        return rebook

    def _crowded_ahead(self, now: float, budget: Budget, window: Window) -> bool:
        """Whether the first slot booked ahead no longer fits the bucket this sample shows:
        booked on an older one, before a reply generated more than the mean (a slot booked
        9 s ahead went where the sample 0.8 s before showed 440 of the 600 its max_tokens
        needed: a 429). Looked at most every REBOOK_EVERY_S (each time wakes every sender)."""
        if now < self._crowd_check_at or window.remaining is None:
            return False
        first = budget.first_ahead(now)
        if first is None:
            return False
        need = first.cost
        if budget is self.output:
            need = min(need + self._holds.extra(first) + self._holds.out, budget.per_minute)
        if not budget.short_at(first.at, now, window.remaining, need):
            return False
        self._crowd_check_at = now + REBOOK_EVERY_S
        return True

    def _stale_ahead(self, now: float, budget: Budget, window: Window) -> bool:
        """Whether slots booked ahead were booked under a tighter sample than this one: what
        it says is left fits a request now, yet the first slot ahead is further than the
        pace alone puts it. (A sample taken while many requests ran, each holding its
        ``max_tokens``, looks far from full; the next may show them given back.)"""
        if now < self._stale_check_at or window.remaining is None:
            return False
        first = budget.next_booked(now)
        if first is not None:
            self._stale_check_at = now + _STALE_CHECK_S
        cost, fit = self._last.get(id(budget), (0.0, 0.0))
        if first is None or window.remaining < fit:
            return False
        return first > now + budget.pace_s(cost) + _STALE_BY_S

    def _given_back(self, now: float, window: Window, answered: Booking | None) -> Window:
        """The output ``window`` as it will be once the requests in flight give back the
        ``max_tokens`` the provider holds for them beyond their estimate: a sample taken while
        they run would otherwise hold back the pace for a minute's refill of tokens that are
        never generated (the reply to ``answered`` has given its own back)."""
        held = self._holds.out_before(now, answered)
        if not held or window.remaining is None or not window.limit:
            return window
        remaining = min(window.limit, window.remaining + held)
        reset = window.reset_s
        if reset is not None:
            reset = max(0.0, reset - (remaining - window.remaining) * WINDOW_S / window.limit)
        return Window(window.limit, math.floor(remaining), reset)

    def requests_per_s(self) -> float | None:
        """The requests a second both budgets allow at the mean costs seen (None: unknown)."""
        rates = []
        for budget, mean in ((self.input, self._counted), (self.output, self._output)):
            if budget is None or not mean.samples or mean.value <= 0:
                continue
            rates.append(budget.per_minute * self._headroom / WINDOW_S / mean.value)
        return min(rates) if rates else None
