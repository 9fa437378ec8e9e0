"""Assignments are pure functions: every key group owned once, ranges contiguous
and balanced, failover moves only what it must."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyshift.controller.core.assignment import (
    describe_ranges,
    key_range,
    moved,
    plan_assignment,
    plan_failover,
)

sizes = st.integers(1, 512).flatmap(lambda k: st.tuples(st.just(k), st.integers(1, k)))


@given(sizes)
def test_every_key_group_owned_once_in_contiguous_balanced_ranges(kn: tuple[int, int]) -> None:
    key_groups, parallelism = kn
    owners = plan_assignment(key_groups, parallelism)
    assert len(owners) == key_groups
    assert set(owners) == set(range(parallelism))
    assert list(owners) == sorted(owners)  # contiguous ranges in worker order
    counts = [owners.count(w) for w in range(parallelism)]
    assert max(counts) - min(counts) <= 1
    for w in range(parallelism):
        assert [kg for kg, o in enumerate(owners) if o == w] == list(
            key_range(w, parallelism, key_groups)
        )


def test_design_formula() -> None:
    # worker i of n owns [i*K//n, (i+1)*K//n)
    assert plan_assignment(10, 3) == (0, 0, 0, 1, 1, 1, 2, 2, 2, 2)
    assert plan_assignment(4, 4) == (0, 1, 2, 3)


def test_parallelism_out_of_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="between 1 and the key group count 8"):
        plan_assignment(8, 9)
    with pytest.raises(ValueError, match="between 1"):
        plan_assignment(8, 0)


@given(sizes.filter(lambda kn: kn[1] >= 2), st.data())
def test_failover_moves_only_the_lost_workers_key_groups(
    kn: tuple[int, int], data: st.DataObject
) -> None:
    key_groups, parallelism = kn
    owners = plan_assignment(key_groups, parallelism)
    lost = data.draw(st.sets(st.integers(0, parallelism - 1), min_size=1, max_size=parallelism - 1))
    new = plan_failover(owners, lost)
    assert moved(owners, new) == {kg for kg, o in enumerate(owners) if o in lost}
    assert not set(new) & lost
    survivors = sorted(set(range(parallelism)) - lost)
    counts = [new.count(w) for w in survivors]
    # as balanced as possible without moving survivors' key groups
    assert max(counts) - min(counts) <= max(
        1, max(owners.count(w) for w in survivors) - min(owners.count(w) for w in survivors)
    )


def test_failover_of_one_of_four() -> None:
    owners = plan_assignment(16, 4)
    new = plan_failover(owners, {1})
    assert new[4:8] == (0, 2, 3, 0)
    assert [new.count(w) for w in (0, 2, 3)] == [6, 5, 5]


def test_failover_without_survivors_is_refused() -> None:
    with pytest.raises(ValueError, match="no surviving worker"):
        plan_failover((0, 0, 1), {0, 1})


def test_describe_ranges() -> None:
    assert describe_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert describe_ranges([]) == "-"
