"""Which worker owns which key group: pure functions.

Like Flink's ``KeyGroupRangeAssignment``: worker ``i`` of ``n`` owns the
contiguous key groups ``[i*K//n, (i+1)*K//n)``. Failover is the exception: a
lost worker's key groups are spread over the survivors and nothing else moves,
so the surviving key groups never pause; a later rebalance restores the ranges.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

Owners = tuple[int, ...]
"""``owners[kg]`` is the ordinal of the worker owning key group ``kg``."""


def key_range(worker: int, parallelism: int, key_groups: int) -> range:
    """The key groups worker ``worker`` of ``parallelism`` owns."""
    if not 0 <= worker < parallelism:
        raise ValueError(f"worker {worker} out of range for parallelism {parallelism}")
    return range(worker * key_groups // parallelism, (worker + 1) * key_groups // parallelism)


def check_parallelism(parallelism: int, key_groups: int) -> None:
    if not 1 <= parallelism <= key_groups:
        raise ValueError(
            f"parallelism {parallelism} must be between 1 and the key group count {key_groups}"
        )


def plan_assignment(key_groups: int, parallelism: int) -> Owners:
    """Contiguous, balanced ranges: every key group owned once, sizes differ by at most one."""
    check_parallelism(parallelism, key_groups)
    owners = [0] * key_groups
    for worker in range(parallelism):
        for kg in key_range(worker, parallelism, key_groups):
            owners[kg] = worker
    return tuple(owners)


def plan_failover(owners: Sequence[int], lost: Collection[int]) -> Owners:
    """Move the key groups of ``lost`` workers to the survivors, and nothing else.

    Each moved key group goes to the survivor owning the fewest key groups at
    that moment (lowest ordinal on ties), so the result is as balanced as a
    minimal move allows.
    """
    survivors = sorted(set(owners) - set(lost))
    if not survivors:
        raise ValueError("no surviving worker to fail over to")
    load = Counter({w: 0 for w in survivors})
    load.update(w for w in owners if w in load)
    new = list(owners)
    for kg, owner in enumerate(owners):
        if owner in lost:
            target = min(survivors, key=lambda w: (load[w], w))
            new[kg] = target
            load[target] += 1
    return tuple(new)


def moved(old: Sequence[int], new: Sequence[int]) -> frozenset[int]:
    """Key groups whose owner differs between two assignments."""
    if len(old) != len(new):
        raise ValueError("assignments of different key group counts")
    return frozenset(kg for kg, (a, b) in enumerate(zip(old, new, strict=True)) if a != b)


def key_groups_of(owners: Sequence[int], worker: int) -> list[int]:
    return [kg for kg, owner in enumerate(owners) if owner == worker]


def describe_ranges(key_groups: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    parts: list[str] = []
    run: list[int] = []
    for kg in sorted(key_groups):
        if run and kg == run[-1] + 1:
            run.append(kg)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [kg]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts) if parts else "-"
