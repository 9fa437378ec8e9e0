"""Pure functions that turn both systems' output into pauses, the same way.

Each system's job writes, for every record it processes, the key group and the
wall-clock time it was processed (keyshift: ``benchmarks/jobs.py``'s
``rescale_job``; Flink: ``KeyedCounter.java``). Per key group the times form a
sorted list; a key group's pause across a rescale is the longest gap between
two consecutive records that overlaps the rescale (the last record processed
before it to the first after), exactly as ``benchmarks/rescale.py`` measures it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks.rescale import longest_gap


def owner(key_group: int, key_groups: int, parallelism: int) -> int:
    """The subtask / worker owning ``key_group`` (Flink's KeyGroupRangeAssignment)."""
    return key_group * parallelism // key_groups


def moved(key_groups: int, before: int, after: int) -> list[bool]:
    """Per key group: does its owner's index change from ``before`` to ``after`` owners?"""
    return [
        owner(kg, key_groups, before) != owner(kg, key_groups, after) for kg in range(key_groups)
    ]


def pauses(times: Sequence[Sequence[float]], start: float, end: float) -> list[float | None]:
    """Per key group, its longest gap between records overlapping ``[start, end]``."""
    return [longest_gap(list(t), start, end) for t in times]


def first_after(times: Sequence[float], t: float) -> float | None:
    """The first time in the sorted ``times`` after ``t``."""
    for x in times:
        if x > t:
            return x
    return None


def present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def rescale_row(
    system: str,
    mode: str,
    keys: int,
    before: int,
    after: int,
    moved_pauses: Sequence[float | None],
    unmoved_pauses: Sequence[float | None],
    walls: Sequence[float],
) -> dict[str, Any]:
    """One row of ``compare.json``'s ``rescale`` list (pauses pooled over repeats)."""
    m, u = present(moved_pauses), present(unmoved_pauses)
    return {
        "system": system,
        "mode": mode,
        "keys": keys,
        "from": before,
        "to": after,
        "moved_pause_seconds_median": round(statistics.median(m), 4) if m else None,
        "moved_pause_seconds_max": round(max(m), 4) if m else None,
        "unmoved_pause_seconds_max": round(max(u), 4) if u else None,
        "wall_seconds": round(statistics.median(walls), 3) if walls else None,
        "key_group_pauses": len(m),
        "missing_key_groups": len(moved_pauses) - len(m),
        "repeats": len(walls),
    }


def failover_row(system: str, mode: str, keys: int, recoveries: Sequence[float]) -> dict[str, Any]:
    """One row of ``compare.json``'s ``failover`` list (median over repeats)."""
    return {
        "system": system,
        "mode": mode,
        "keys": keys,
        "recovery_seconds": round(statistics.median(recoveries), 3) if recoveries else None,
        "repeats": len(recoveries),
        "each": [round(r, 3) for r in recoveries],
    }
