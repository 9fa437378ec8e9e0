"""Load-aware, low-movement ranges (``plan_ranges``) tested as data: every key group
owned once, one contiguous range per worker ``0..p-1``, never less balanced than the
count-based split, and the fewest moves among equally balanced plans (against a brute
force over every contiguous plan on small inputs)."""

from __future__ import annotations

import itertools
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshift.controller.core.assignment import (
    BALANCE_SLACK,
    balance_of,
    best_bottleneck,
    is_ranges,
    moved,
    plan_assignment,
    plan_failover,
    plan_ranges,
)


def busiest(owners: tuple[int, ...] | list[int], load: list[float]) -> float:
    per: dict[int, float] = {}
    for kg, w in enumerate(owners):
        per[w] = per.get(w, 0.0) + load[kg]
    return max(per.values())


def contiguous_plans(k: int, p: int) -> list[list[tuple[int, int]]]:
    """Every split of ``[0, k)`` into ``p`` non-empty contiguous ranges."""
    return [
        list(itertools.pairwise((0, *cuts, k)))
        for cuts in itertools.combinations(range(1, k), p - 1)
    ]


@st.composite
def ranges_of(draw: st.DrawFn, k: int, p: int) -> tuple[int, ...]:
    """Contiguous ranges of workers ``0..p-1`` in any order (an earlier plan)."""
    cuts = draw(st.lists(st.integers(1, max(1, k - 1)), unique=True, min_size=p - 1,
                         max_size=p - 1))  # fmt: skip
    plan = list(itertools.pairwise((0, *sorted(cuts), k)))
    workers = draw(st.permutations(range(p)))
    owners: list[int] = []
    for (a, b), w in zip(plan, workers, strict=True):
        owners.extend([w] * (b - a))
    return tuple(owners)


@st.composite
def cases(draw: st.DrawFn, max_k: int = 8) -> tuple[int, int, list[float], tuple[int, ...]]:
    k = draw(st.integers(1, max_k))
    p = draw(st.integers(1, k))
    old_p = draw(st.integers(1, k))
    load = draw(st.lists(st.integers(0, 30).map(float), min_size=k, max_size=k))
    if sum(load) == 0:
        load[0] = 1.0
    return k, p, load, draw(ranges_of(k, old_p))


def brute_limit(k: int, p: int, load: list[float]) -> float:
    best = min(max(sum(load[a:b]) for a, b in plan) for plan in contiguous_plans(k, p))
    return min(best * (1 + BALANCE_SLACK), busiest(plan_assignment(k, p), load))


def brute_fewest_moves(k: int, p: int, load: list[float], current: tuple[int, ...]) -> int:
    limit = brute_limit(k, p, load) * (1 + 1e-9)
    fewest = k
    for plan in contiguous_plans(k, p):
        if max(sum(load[a:b]) for a, b in plan) > limit:
            continue
        for workers in itertools.permutations(range(p)):
            kept = sum(
                1 for (a, b), w in zip(plan, workers, strict=True)
                for kg in range(a, b) if current[kg] == w
            )  # fmt: skip
            fewest = min(fewest, k - kept)
    return fewest


@settings(max_examples=300, deadline=None)
@given(cases())
def test_valid_balanced_and_fewest_moves(
    case: tuple[int, int, list[float], tuple[int, ...]],
) -> None:
    k, p, load, current = case
    plan = plan_ranges(k, p, load, current)
    owners = plan.owners
    assert len(owners) == k and is_ranges(owners, p)  # each of 0..p-1 one range, once
    assert sorted(set(owners)) == list(range(p))
    assert plan.load_aware and plan.moved == len(moved(current, owners))
    assert plan.balance is not None
    assert math.isclose(plan.balance, balance_of(owners, load, p), abs_tol=1e-4)
    top = busiest(owners, load)
    assert top <= busiest(plan_assignment(k, p), load) * (1 + 1e-9)  # no worse than by count
    assert top <= brute_limit(k, p, load) * (1 + 1e-9)
    assert plan.moved == brute_fewest_moves(k, p, load, current)


@settings(max_examples=200, deadline=None)
@given(cases(max_k=40))
def test_larger_inputs_stay_valid_and_no_worse_than_count_based(
    case: tuple[int, int, list[float], tuple[int, ...]],
) -> None:
    k, p, load, current = case
    plan = plan_ranges(k, p, load, current)
    assert is_ranges(plan.owners, p)
    assert busiest(plan.owners, load) <= busiest(plan_assignment(k, p), load) * (1 + 1e-9)
    assert busiest(plan.owners, load) <= best_bottleneck(load, p) * (1 + BALANCE_SLACK) * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(cases(max_k=40))
def test_a_plan_is_stable_under_its_own_load(
    case: tuple[int, int, list[float], tuple[int, ...]],
) -> None:
    """Planning again at the same parallelism and load moves nothing (no ping-pong)."""
    k, p, load, current = case
    plan = plan_ranges(k, p, load, current)
    assert plan_ranges(k, p, load, plan.owners).moved == 0


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 40).flatmap(lambda k: st.tuples(st.just(k), st.integers(2, k))), st.data())
def test_after_a_failover_the_plan_is_ranges_again(
    kp: tuple[int, int], data: st.DataObject
) -> None:
    k, p = kp
    lost = data.draw(st.sets(st.integers(0, p - 1), min_size=1, max_size=p - 1))
    current = plan_failover(plan_assignment(k, p), lost)
    assert not is_ranges(current, p)
    load = data.draw(st.none() | st.lists(st.floats(0, 100), min_size=k, max_size=k))
    plan = plan_ranges(k, p, load, current)
    assert is_ranges(plan.owners, p)
    if not load or sum(load) <= 0:
        assert plan.owners == plan_assignment(k, p)
        return
    weights = load
    assert busiest(plan.owners, weights) <= busiest(plan_assignment(k, p), weights) * (1 + 1e-9)


def test_without_load_count_based() -> None:
    # first deployment or no metrics: the plain ranges
    first = plan_ranges(10, 3)
    assert (first.owners, first.balance, first.moved, first.load_aware) == (
        plan_assignment(10, 3), None, 10, False,
    )  # fmt: skip
    plan = plan_ranges(32, 4, None, plan_assignment(32, 2))
    assert (plan.owners, plan.moved, plan.balance) == (plan_assignment(32, 4), 24, None)
    # a load that cannot steer (wrong length, negative, none measured): the same
    for bad in ([1.0] * 31, [-1.0] + [1.0] * 31, [0.0] * 32, [math.nan] * 32):
        assert plan_ranges(32, 4, bad, plan_assignment(32, 2)) == plan


def test_an_even_load_keeps_count_balance_and_moves_fewer() -> None:
    """2 -> 4 of 32 key groups under an even load: 8 key groups each as by count, but
    workers 0 and 1 keep half of their ranges: 16 moves instead of 24."""
    plan = plan_ranges(32, 4, [5.0] * 32, plan_assignment(32, 2))
    assert sorted(plan.owners.count(w) for w in range(4)) == [8, 8, 8, 8]
    assert (plan.moved, plan.balance, plan.load_aware) == (16, 1.0, True)
    # a load that wobbles a little: still balanced by the same boundaries, 16 moves
    rng = random.Random(5)
    wobbly = [5.0 * (1 + rng.uniform(-0.03, 0.03)) for _ in range(32)]
    plan = plan_ranges(32, 4, wobbly, plan_assignment(32, 2))
    assert plan.moved == 16 and plan.balance is not None and plan.balance < 1.03


def test_skewed_load_moves_the_boundaries() -> None:
    # key groups 0-3 carry most of the load: they get a worker each (count-based: two)
    load = [40.0, 40.0, 40.0, 40.0] + [1.0] * 12
    plan = plan_ranges(16, 4, load, plan_assignment(16, 2))
    assert busiest(plan.owners, load) == 52.0  # the best contiguous split: 40, 40, 40, 40 + 12
    assert plan.balance == round(52 / 43, 4)
    assert busiest(plan_assignment(16, 4), load) == 160.0


def test_zipf_over_shuffled_key_groups_two_to_four() -> None:
    rng = random.Random(7)
    load = [1 / (rank + 1) ** 1.3 for rank in range(32)]
    rng.shuffle(load)
    before = plan_ranges(32, 2, load, plan_assignment(32, 1)).owners
    plan = plan_ranges(32, 4, load, before)
    assert is_ranges(plan.owners, 4)
    assert balance_of(plan.owners, load, 4) <= balance_of(plan_assignment(32, 4), load, 4)
    assert plan.moved <= 20


def test_large_problems_fall_back_to_balanced_boundaries() -> None:
    rng = random.Random(3)
    load = [1 / (rank + 1) ** 1.1 for rank in range(4096)]
    rng.shuffle(load)
    plan = plan_ranges(4096, 512, load, plan_assignment(4096, 256))
    assert is_ranges(plan.owners, 512)
    assert busiest(plan.owners, load) <= busiest(plan_assignment(4096, 512), load) * (1 + 1e-9)
