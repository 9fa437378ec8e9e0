"""Handoff planning: pure functions of assignments."""

from __future__ import annotations

from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.handoff import plan_handoff, stale_claims
from keyshift.store import Assignment


def test_scale_up_releases_the_tail_and_keeps_the_rest() -> None:
    old = Assignment(1, 2, plan_assignment(12, 2))  # worker 0: 0-5, worker 1: 6-11
    new = Assignment(2, 3, plan_assignment(12, 3))  # worker 0: 0-3, worker 1: 4-7, worker 2: 8-11
    w0 = plan_handoff(old.owned_by(0), new, 0)
    assert w0.release == {4, 5} and w0.keep == {0, 1, 2, 3} and not w0.claim
    w1 = plan_handoff(old.owned_by(1), new, 1)
    assert w1.claim == {4, 5} and w1.release == {8, 9, 10, 11} and w1.keep == {6, 7}
    w2 = plan_handoff([], new, 2)
    assert w2.claim == {8, 9, 10, 11} and not w2.forced and not w2.keep


def test_failover_claims_are_forced() -> None:
    new = Assignment(generation=3, parallelism=1, owners=(0, 0, 0, 0), forced=frozenset({2, 3}))
    plan = plan_handoff([0, 1], new, 0)
    assert plan.claim == {2, 3} and plan.forced == {2, 3}


def test_stale_claims_are_mine_in_the_store_but_not_in_the_assignment() -> None:
    assignment = Assignment(4, 2, plan_assignment(4, 2))  # 0,1 -> worker 0; 2,3 -> worker 1
    owners = {0: "j-worker-0", 2: "j-worker-0", 3: "j-worker-1"}
    assert stale_claims(owners, assignment, 0, "j-worker-0") == [2]
