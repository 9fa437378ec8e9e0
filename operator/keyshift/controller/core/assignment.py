"""Which worker owns which key group: pure functions.

Like Flink's ``KeyGroupRangeAssignment``: worker ``i`` of ``n`` owns the
contiguous key groups ``[i*K//n, (i+1)*K//n)``. Failover is the exception: a
lost worker's key groups are spread over the survivors and nothing else moves,
so the surviving key groups never pause; a later rebalance restores the ranges.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from keyshift.errors import KeyshiftError

Owners = tuple[int, ...]
"""``owners[kg]`` is the ordinal of the worker owning key group ``kg``."""

NO_OWNER = -1
"""The owner of every key group of a job scaled to zero: nobody runs it, its state and
position wait in the store."""


def idle_owners(key_groups: int) -> Owners:
    """The owners of a job scaled to zero."""
    return (NO_OWNER,) * key_groups


def key_range(worker: int, parallelism: int, key_groups: int) -> range:
    """The key groups worker ``worker`` of ``parallelism`` owns."""
    if not 0 <= worker < parallelism:
        raise ValueError(f"worker {worker} out of range for parallelism {parallelism}")
    return range(worker * key_groups // parallelism, (worker + 1) * key_groups // parallelism)


class PlanError(KeyshiftError, ValueError):
    """A parallelism the job's key groups cannot have (a user's request, not a bug)."""


def check_parallelism(parallelism: int, key_groups: int) -> None:
    """:class:`PlanError` unless ``1 <= parallelism <= key_groups``."""
    if not 1 <= parallelism <= key_groups:
        raise PlanError(
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


# -- load-aware, low-movement ranges ------------------------------------------------

BALANCE_SLACK = 0.05
"""Plans whose busiest worker carries at most this much more load than the best
contiguous plan's busiest count as equally balanced (measured loads wobble by a
few percent; a moved key group pauses for real)."""

PLAN_BUDGET = 1_000_000
"""Steps the move-minimising search may take; a larger problem (tens of thousands of
key groups over hundreds of workers with a lopsided load) keeps the balanced
boundaries and only chooses which worker gets which range."""


@dataclass(frozen=True, slots=True)
class RangePlan:
    """A contiguous-range assignment and what it promises."""

    owners: Owners
    balance: float | None
    """Predicted busiest worker's load / mean load over the workers; ``None`` when no
    load is known (the plan then balances key group counts)."""
    moved: int
    """Key groups whose owner changes (all of them on a first deployment)."""
    load_aware: bool
    """The boundaries follow the given load (False: count-based, no usable load)."""


def is_ranges(owners: Sequence[int], parallelism: int) -> bool:
    """Whether workers ``0..parallelism-1`` each own exactly one non-empty contiguous
    range and nobody else owns anything (in any order of workers). False after a
    failover: the lost worker owns nothing, a survivor a second range. A job scaled to
    zero (parallelism 0) is ranges when nobody owns anything."""
    if parallelism == 0:
        return all(owner == NO_OWNER for owner in owners)
    seen: set[int] = set()
    previous: int | None = None
    for owner in owners:
        if owner != previous:
            if owner in seen or not 0 <= owner < parallelism:
                return False
            seen.add(owner)
            previous = owner
    return len(seen) == parallelism


def usable_load(load: Sequence[float] | None, key_groups: int) -> list[float] | None:
    """``load`` as a list if it can steer a plan: one finite, non-negative value per key
    group and some load in total; otherwise None (plan by count)."""
    if load is None or len(load) != key_groups:
        return None
    values = [float(x) for x in load]
    if not all(math.isfinite(x) and x >= 0 for x in values) or sum(values) <= 0:
        return None
    return values


def balance_of(owners: Sequence[int], load: Sequence[float], parallelism: int) -> float:
    """Busiest worker's load / mean load per worker."""
    per = [0.0] * parallelism
    for kg, owner in enumerate(owners):
        per[owner] += load[kg]
    mean = sum(per) / parallelism
    return max(per) / mean if mean > 0 else 1.0


def _busiest(owners: Sequence[int], load: Sequence[float]) -> float:
    per: dict[int, float] = {}
    for kg, owner in enumerate(owners):
        per[owner] = per.get(owner, 0.0) + load[kg]
    return max(per.values())


def _min_ranges(prefix: Sequence[float], limit: float, reverse: bool) -> list[int]:
    """``out[i]``: the fewest ranges of load at most ``limit`` covering ``[0, i)``
    (``reverse``: ``[i, K)``); every single key group must fit."""
    k = len(prefix) - 1
    out = [0] * (k + 1)
    if not reverse:
        s = 0
        for i in range(1, k + 1):
            while prefix[i] - prefix[s] > limit:
                s += 1
            out[i] = out[s] + 1
    else:
        e = k
        for i in range(k - 1, -1, -1):
            while prefix[e] - prefix[i] > limit:
                e -= 1
            out[i] = out[e] + 1
    return out


def _fits(prefix: Sequence[float], limit: float, parallelism: int) -> bool:
    return _min_ranges(prefix, limit, reverse=False)[-1] <= parallelism


def best_bottleneck(load: Sequence[float], parallelism: int) -> float:
    """The least possible busiest-range load over ``parallelism`` contiguous ranges
    (to a relative 1e-9)."""
    prefix = list(itertools.accumulate(load, initial=0.0))
    lo = max(max(load), prefix[-1] / parallelism)
    hi = _busiest(plan_assignment(len(load), parallelism), load)
    if _fits(prefix, lo * (1 + 1e-12), parallelism):
        return lo
    for _ in range(100):
        if hi - lo <= 1e-9 * hi:
            break
        mid = (lo + hi) / 2
        if _fits(prefix, mid, parallelism):
            hi = mid
        else:
            lo = mid
    return hi


def plan_ranges(
    key_groups: int,
    parallelism: int,
    load: Sequence[float] | None = None,
    current: Sequence[int] | None = None,
    *,
    slack: float = BALANCE_SLACK,
) -> RangePlan:
    """Contiguous ranges for ``parallelism`` workers, their boundaries following ``load``
    (one non-negative value per key group: records/s or busy seconds over the metrics
    window), and among equally balanced plans the one moving fewest key groups from
    ``current``. Pure.

    - No usable load (None, wrong length, nothing measured yet): count-based, the plain
      ranges of :func:`plan_assignment`.
    - The busiest worker carries at most ``min(best * (1 + slack), count_based)``:
      ``best`` the least possible over contiguous ranges, ``count_based`` that of
      :func:`plan_assignment`'s ranges. So a plan is never less balanced than the
      count-based split, and within ``slack`` of the best one.
    - Among those, the fewest key groups move (ranges may go to any worker: worker 2
      may own the first range); then the lower busiest load; then the first found.
      Exact when ``current`` is contiguous ranges (an earlier plan); after a failover
      (a survivor owns two runs) the moves are near-minimal.
    """
    check_parallelism(parallelism, key_groups)
    if current is not None and len(current) != key_groups:
        raise ValueError("the current assignment has another key group count")
    values = usable_load(load, key_groups)
    if values is None:
        plain = plan_assignment(key_groups, parallelism)
        count = key_groups if current is None else len(moved(current, plain))
        return RangePlan(plain, None, count, False)
    limit = min(
        best_bottleneck(values, parallelism) * (1 + slack),
        _busiest(plan_assignment(key_groups, parallelism), values),
    )
    limit *= 1 + 1e-12  # float sums of the same ranges in another order
    old = list(current) if current is not None else [-1] * key_groups
    owners = _search(values, parallelism, old, limit) or _fallback(values, parallelism, old, limit)
    return RangePlan(
        owners=owners,
        balance=round(balance_of(owners, values, parallelism), 4),
        moved=len(moved(current, owners)) if current is not None else key_groups,
        load_aware=True,
    )


def _runs(old: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Maximal runs of one owner: ``run_of[kg]``, each run's start and owner."""
    run_of: list[int] = []
    starts: list[int] = []
    workers: list[int] = []
    for kg, owner in enumerate(old):
        if not workers or owner != workers[-1]:
            starts.append(kg)
            workers.append(owner)
        run_of.append(len(workers) - 1)
    return run_of, starts, workers


_State = tuple[int, int, int]
"""(range start, ranges before it, whether the old run straddling the start has its keeper)"""


def _search(
    load: Sequence[float], parallelism: int, old: Sequence[int], limit: float
) -> Owners | None:
    """The most key groups kept over ``parallelism`` contiguous ranges of load at most
    ``limit``: a dynamic programme over (range start, ranges so far, whether the old run
    straddling the start already has its keeper). A range keeps the key groups of one
    old run of a worker (its *keeper*, then its new owner); keepers come in the order of
    their runs, so when every worker's old key groups are one run this is exact. None if
    over :data:`PLAN_BUDGET`."""
    k = len(load)
    prefix = list(itertools.accumulate(load, initial=0.0))
    lo = _min_ranges(prefix, limit, reverse=False)
    lo_suffix = _min_ranges(prefix, limit, reverse=True)
    ends = [0] * k  # the furthest end of a range starting at i
    e = 0
    for i in range(k):
        e = max(e, i + 1)
        while e < k and prefix[e + 1] - prefix[i] <= limit:
            e += 1
        ends[i] = e

    def spans(i: int) -> range:
        return range(max(lo[i] if i else 0, parallelism - (k - i)),
                     min(i, parallelism - lo_suffix[i]) + 1)  # fmt: skip

    if sum(len(spans(i)) * (ends[i] - i) for i in range(k)) * 2 > PLAN_BUDGET:
        return None
    run_of, starts, run_worker = _runs(old)
    run_end = [*starts[1:], k]
    eligible = [0 <= w < parallelism for w in run_worker]
    # state (i, j, flag) -> (kept, busiest, previous state, keeper run or -1)
    best: dict[_State, tuple[int, float, _State | None, int]] = {(0, 0, 0): (0, 0.0, None, -1)}
    for i in range(k):
        for flag in (0, 1):
            js = [j for j in spans(i) if (i, j, flag) in best]
            if not js:
                continue
            r0 = run_of[i]
            blocked = r0 if flag else -1
            closed_value, closed_run = 0, -1  # best keeper among runs ending inside
            for e in range(i + 1, ends[i] + 1):
                last = run_of[e - 1]
                if e - 1 > i and last != run_of[e - 2]:
                    prev = run_of[e - 2]  # that run closed at e - 1
                    if eligible[prev] and prev != blocked:
                        value = run_end[prev] - max(i, starts[prev])
                        if value > closed_value:
                            closed_value, closed_run = value, prev
                busy = prefix[e] - prefix[i]
                cont = e < k and run_of[e] == last
                last_value = e - max(i, starts[last]) if eligible[last] and last != blocked else -1
                options: list[tuple[int, int, int]] = []  # (kept, keeper, next flag)
                if cont:
                    options.append((closed_value, closed_run, 1 if last == blocked else 0))
                    if last_value >= 0:
                        options.append((last_value, last, 1))
                elif last_value > closed_value:
                    options.append((last_value, last, 0))
                else:
                    options.append((closed_value, closed_run, 0))
                for j in js:
                    kept, busiest, _, _ = best[(i, j, flag)]
                    top = max(busiest, busy)
                    for value, keeper, nflag in options:
                        key = (e, j + 1, nflag)
                        seen = best.get(key)
                        if seen is None or (kept + value, -top) > (seen[0], -seen[1]):
                            best[key] = (kept + value, top, (i, j, flag), keeper)
    end = best.get((k, parallelism, 0))
    if end is None:
        return None
    ranges: list[tuple[int, int, int]] = []  # (start, end, keeper's worker or -1)
    state: _State = (k, parallelism, 0)
    while True:
        _, _, before, keeper = best[state]
        if before is None:
            break
        ranges.append((before[0], state[0], run_worker[keeper] if keeper >= 0 else -1))
        state = before
    ranges.reverse()
    return _label(ranges, parallelism, old)


def _label(ranges: list[tuple[int, int, int]], parallelism: int, old: Sequence[int]) -> Owners:
    """Owners from ranges with their preferred worker (-1: any): a worker preferred twice
    (possible only when its old key groups were split, after a failover) keeps the range
    where it keeps most; the ranges left get the workers left, in order."""

    def kept(index: int) -> int:
        start, end, worker = ranges[index]
        return sum(1 for kg in range(start, end) if old[kg] == worker)

    taken: dict[int, int] = {}  # worker -> range index
    for index in sorted(range(len(ranges)), key=lambda i: -kept(i)):
        worker = ranges[index][2]
        if worker >= 0 and worker not in taken:
            taken[worker] = index
    by_range = {index: worker for worker, index in taken.items()}
    free = iter(w for w in range(parallelism) if w not in taken)
    owners: list[int] = []
    for index, (start, end, _) in enumerate(ranges):
        chosen = by_range.get(index)
        owners.extend([next(free) if chosen is None else chosen] * (end - start))
    return tuple(owners)


def _fallback(load: Sequence[float], parallelism: int, old: Sequence[int], limit: float) -> Owners:
    """Balanced boundaries without the search (too large a problem): greedy ranges of
    load at most ``limit``, split to ``parallelism``; each range goes to the old owner
    of most of it when free."""
    k = len(load)
    bounds = [0]
    total = 0.0
    for kg, x in enumerate(load):
        if total + x > limit and kg > bounds[-1]:
            bounds.append(kg)
            total = 0.0
        total += x
    bounds.append(k)
    pieces = [(a, b) for a, b in itertools.pairwise(bounds)]
    while len(pieces) < parallelism:  # split the widest range (its halves fit the limit)
        widest = max(range(len(pieces)), key=lambda p: pieces[p][1] - pieces[p][0])
        a, b = pieces[widest]
        pieces[widest : widest + 1] = [(a, (a + b) // 2), ((a + b) // 2, b)]
    ranges = []
    for a, b in pieces:
        counts = Counter(old[a:b])
        worker = max(counts, key=lambda w: (counts[w], -w))
        ranges.append((a, b, worker if 0 <= worker < parallelism else -1))
    return _label(ranges, parallelism, old)
