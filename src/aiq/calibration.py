"""How far a model's real prompt tokens run from aiq's estimate, learned from its replies.

The forecast's prompt figure is a rule of thumb (``tokens.estimate`` with the chat template's
overhead): per line it was 0.23 to 1.58 of what a real server counted. Each reply's ``usage``
says what the provider counted, and the store keeps it (``tokens_in``), so after a run aiq
compares a sample of the replies with their estimates and keeps, per model, the sums and the
highest ratio of one reply. The next ``--dry-run`` prices prompts at the learned ratio.

Kept in the store's ``meta`` table (one row a model, ``prompt_ratio:<model>``), not a table of
its own: a store written by an older aiq needs no migration, so ``--dry-run`` (read-only) still
reads it. Writing it is not a change of the jobs: exports stay current.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from . import tokens

if TYPE_CHECKING:
    from .store import JobStore

META_PREFIX = "prompt_ratio:"
# Replies compared after each run, the newest: enough for a stable ratio, and a run of a
# million jobs does not parse a million bodies at its end.
SAMPLE = 2_000


@dataclass(frozen=True, slots=True)
class PromptRatio:
    """Real prompt tokens over estimated ones for one model, over ``replies`` replies."""

    replies: int
    estimated: int  # tokens aiq estimated for those prompts, summed
    actual: int  # tokens the provider counted for them, summed
    highest: float  # the highest real/estimated of one reply

    @property
    def ratio(self) -> float:
        """Real over estimated, over all the replies (a long prompt weighs more)."""
        return self.actual / self.estimated

    def merge(self, other: PromptRatio) -> PromptRatio:
        return PromptRatio(
            self.replies + other.replies,
            self.estimated + other.estimated,
            self.actual + other.actual,
            max(self.highest, other.highest),
        )

    def to_json(self) -> str:
        return orjson.dumps([self.replies, self.estimated, self.actual, self.highest]).decode()

    @classmethod
    def from_json(cls, value: str) -> PromptRatio | None:
        """None for a value this aiq cannot read (written by another version): not learned."""
        try:
            replies, estimated, actual, highest = orjson.loads(value)
            ratio = cls(int(replies), int(estimated), int(actual), float(highest))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return None
        return ratio if ratio.replies > 0 and ratio.estimated > 0 and ratio.actual > 0 else None


def compare(rows: Iterable[tuple[str | None, str, bytes, int]]) -> dict[str | None, PromptRatio]:
    """Per model, how the prompts of these replies (model, endpoint, body, real prompt tokens)
    compare with their estimates. A reply without a positive count or estimate is left out."""
    sums: dict[str | None, PromptRatio] = {}
    for model, endpoint, body, actual in rows:
        estimated = tokens.estimate(body, endpoint=endpoint).prompt
        if estimated <= 0 or actual <= 0:
            continue
        one = PromptRatio(1, estimated, actual, actual / estimated)
        sums[model] = sums[model].merge(one) if model in sums else one
    return sums


async def load(store: JobStore) -> dict[str | None, PromptRatio]:
    """The ratios the store has learned, by model (None: requests naming none)."""
    learned = {}
    for name, value in (await store.meta_values(META_PREFIX)).items():
        if (ratio := PromptRatio.from_json(value)) is not None:
            learned[name.removeprefix(META_PREFIX) or None] = ratio
    return learned


async def current(store: JobStore, *, sample: int = SAMPLE) -> dict[str | None, PromptRatio]:
    """What the store has learned, with the replies done since it last learned (a run killed
    before its end, runs of an aiq from before this was kept) added but not kept: for a
    read-only ``--dry-run``."""
    learned, _ = await _updated(store, sample)
    return learned


async def learn(store: JobStore, *, sample: int = SAMPLE) -> dict[str | None, PromptRatio]:
    """Compare the replies done since the last time (the newest ``sample`` of them) with their
    estimates, add that to what the store has learned, and keep it; returns it all."""
    learned, newest = await _updated(store, sample)
    if newest is not None:
        values = {META_PREFIX + (m or ""): r.to_json() for m, r in learned.items()}
        await store.save_meta({**values, _THROUGH: repr(newest)})
    return learned


_THROUGH = "prompt_ratio_through"  # when the newest reply learned from finished


async def _updated(
    store: JobStore, sample: int
) -> tuple[dict[str | None, PromptRatio], float | None]:
    """The kept ratios with the newer replies added, and when the newest of those finished
    (None: no newer reply)."""
    learned = await load(store)
    through = await store.meta_values(_THROUGH)
    rows, newest = await store.done_prompts(since=float(through.get(_THROUGH, 0.0)), limit=sample)
    if not rows:
        return learned, None
    for model, ratio in compare(rows).items():
        learned[model] = learned[model].merge(ratio) if model in learned else ratio
    return learned, newest
