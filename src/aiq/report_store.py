"""Plain-text renderings of what the store commands that send nothing did: ``replay-dead``
and ``prune``."""

from __future__ import annotations

import json

from .records import Pruned, Replayed
from .text import plural, size_text


def _set_change(r: Replayed, name: str) -> str:
    n, value = r.changed.get(name, 0), r.sets[name]
    to = "taken out" if value is None else f"set to {_json(value)}"
    same = r.replayed - n
    return f"{to} in {plural(n, 'body', 'bodies')}" + (
        f" ({same:,} {'has' if same == 1 else 'have'} it already)" if same else ""
    )


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def replay_lines(r: Replayed) -> list[str]:
    """What ``replay-dead`` did, and what to do next only when there is something to do."""
    if r.dry_run:
        lines = [f"would replay {plural(r.replayed, 'dead job')}; nothing was changed"]
        lines += [f"  {name}: {_set_change(r, name)}" for name in r.sets]
    elif r.replayed and r.sets:
        lines = [
            f"replayed {plural(r.replayed, 'dead job')} as {plural(r.new_requests, 'request')} "
            f"with {', '.join(f'{k}={_json(v)}' for k, v in r.sets.items())}; run `aiq resume` "
            "to send them"
        ]
    elif r.replayed:
        lines = [f"replayed {plural(r.replayed, 'dead job')}; run `aiq resume` to send them"]
    elif not r.dead_types:
        lines = ["nothing to replay: the store has no dead jobs"]
    elif r.not_replayed:
        lines = ["nothing to replay: none of those custom_ids has a dead job"]
    else:
        lines = ["nothing to replay: no dead job matches"]
    if r.not_replayed:
        shown = [f"{c} ({why})" for c, why in list(r.not_replayed.items())[:10]]
        more = len(r.not_replayed) - len(shown)
        lines.append("not replayed: " + ", ".join(shown) + (f" and {more:,} more" if more else ""))
    return lines


def prune_lines(p: Pruned) -> list[str]:
    """What ``prune`` did: the jobs pruned, what it freed, the file's size, what it left."""
    what = "forgot" if p.forgotten else "pruned"
    jobs = [plural(n, f"{state} job") for n, state in ((p.done, "done"), (p.dead, "dead")) if n]
    if jobs:
        lines = [
            f"{what} {' and '.join(jobs)}: {size_text(p.freed_bytes)} of requests, replies and "
            "input lines (their lines stay in the results and dead-letter files)"
        ]
    else:
        lines = ["nothing to prune: no exported job is that old"]
    if jobs:
        size = f"store {size_text(p.size_before)} -> {size_text(p.size_after)} on disk"
        lines.append(size + (" (VACUUM)" if p.vacuumed else ""))
    else:
        lines.append(f"store {size_text(p.size_after)} on disk")
    if p.vacuum_skipped:
        lines.append(f"not shrunk: {p.vacuum_skipped}")
    if p.not_exported:
        lines.append(
            f"left {plural(p.not_exported, 'job')} old enough but not in their output files "
            "yet (or those files changed since aiq wrote them): run `aiq resume` to export "
            "them, then prune again"
        )
    return lines
