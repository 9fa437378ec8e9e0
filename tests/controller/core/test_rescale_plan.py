"""The rescale protocol and the controller's decisions, as pure functions."""

from __future__ import annotations

from keyshift.controller.core.assignment import NO_OWNER, plan_assignment, plan_failover
from keyshift.controller.core.loop import ControllerSettings, tick_pause, workers_needed
from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.core.reconcile import Desired, next_rescale
from keyshift.controller.core.rescale import (
    Advance,
    Deadlines,
    Finish,
    ForceHandoff,
    Observation,
    Phase,
    Publish,
    StartWorkers,
    StopWorkers,
    Wait,
    WorkerView,
    awaited_workers,
    needs_holders,
    next_step,
    plan_failover_rescale,
    plan_rescale,
)
from keyshift.store.protocol import Assignment

K = 8
DL = Deadlines(ready_seconds=10, handoff_seconds=5, forced_handoff_seconds=5)


def obs(
    now: float,
    generation: int,
    workers: dict[int, bool],
    acks: dict[int, int] | None = None,
    holders: dict[int, int] | None = None,
) -> Observation:
    return Observation(
        now=now,
        generation=generation,
        workers={w: WorkerView(w, ready=r, running=True) for w, r in workers.items()},
        acks=acks or {},
        holders=holders or {},
    )


def test_scale_up_starts_workers_then_publishes_then_waits_for_every_worker() -> None:
    owners = plan_assignment(K, 2)
    r = plan_rescale("j", K, owners, 2, 3, 4, "manual", now=100.0)
    assert (r.start_workers, r.stop_workers, r.phase) == ([2, 3], [], "starting_workers")
    assert next_step(r, obs(100, 3, {0: True, 1: True}), DL) == StartWorkers((2, 3))
    assert isinstance(next_step(r, obs(101, 3, {0: True, 1: True, 2: True, 3: False}), DL), Wait)
    assert next_step(r, obs(102, 3, {0: True, 1: True, 2: True, 3: True}), DL) == Advance(
        "publishing"
    )
    r.phase, r.phase_started_at = "publishing", 102
    step = next_step(r, obs(102, 3, {}), DL)
    assert step == Publish(
        generation=4,
        expected_generation=3,
        owners=plan_assignment(K, 4),
        forced=frozenset(),
        parallelism=4,
    )
    r.phase, r.phase_started_at = "handing_off", 102
    assert awaited_workers(r) == {0, 1, 2, 3}
    half = obs(103, 4, {}, acks={0: 4, 1: 3, 2: 4, 3: 4})
    assert isinstance(next_step(r, half, DL), Wait)
    done = obs(103, 4, {}, acks={0: 4, 1: 4, 2: 4, 3: 4})
    assert next_step(r, done, DL) == Advance("finished")


def test_scale_down_publishes_first_then_stops_idle_workers() -> None:
    owners = plan_assignment(K, 4)
    r = plan_rescale("j", K, owners, 4, 7, 2, "manual", now=0.0)
    assert (r.phase, r.stop_workers) == ("publishing", [2, 3])
    r.phase = "handing_off"
    # the workers being removed must report too: that is their release
    assert awaited_workers(r) == {0, 1, 2, 3}
    assert next_step(r, obs(1, 8, {}, acks={0: 8, 1: 8, 2: 8, 3: 8}), DL) == Advance(
        "stopping_workers"
    )
    r.phase = "stopping_workers"
    assert next_step(r, obs(1, 8, {0: True, 1: True, 2: True, 3: True}), DL) == StopWorkers((2, 3))
    assert next_step(r, obs(1, 8, {0: True, 1: True}), DL) == Advance("finished")


def test_new_workers_never_ready_roll_back_keeping_the_old_generation() -> None:
    r = plan_rescale("j", K, plan_assignment(K, 2), 2, 3, 4, "manual", now=100.0)
    view = obs(111, 3, {0: True, 1: True, 2: True, 3: False})
    step = next_step(r, view, DL)
    assert isinstance(step, Finish)
    assert step.outcome == "rolled_back"
    assert step.stop == (2, 3)
    assert "worker 3" in step.message and "generation 3 kept" in step.message


def test_published_before_a_restart_is_not_published_again() -> None:
    owners = plan_assignment(K, 4)
    r = plan_rescale("j", K, owners, 4, 7, 2, "manual", now=0.0)
    assert next_step(r, obs(1, 8, {}), DL) == Advance("handing_off")
    assert isinstance(next_step(r, obs(1, 9, {}), DL), Finish)  # someone else moved it


def test_an_old_owner_that_does_not_release_is_forced_after_the_deadline() -> None:
    owners = plan_assignment(K, 4)
    r = plan_rescale("j", K, owners, 4, 7, 2, "manual", now=0.0)
    r.phase, r.phase_started_at = "handing_off", 0.0
    stuck = obs(6, 8, {}, acks={0: 8, 1: 8, 2: 8, 3: 7}, holders={6: 3, 7: 3})
    step = next_step(r, stuck, DL)
    assert step == ForceHandoff(laggards=(3,), forced=frozenset({6, 7}), excused=frozenset({3}))
    r.handoff_forced, r.to_generation = True, 9
    r.excused_workers = [3]
    assert next_step(r, obs(7, 9, {}, acks={0: 9, 1: 9, 2: 9, 3: 7}), DL) == Advance(
        "stopping_workers"
    )
    late = obs(11, 9, {}, acks={0: 8, 1: 9, 2: 9})
    assert isinstance(next_step(r, late, DL), Finish)


def test_the_holders_are_read_only_when_the_decision_depends_on_them() -> None:
    """The executor asks the store who holds the moving key groups only when
    ``needs_holders``; at every other moment the step is the same without them."""
    r = plan_rescale("j", K, plan_assignment(K, 2), 2, 5, 3, "manual", now=0.0)
    holders = {2: 0, 3: 0}
    acks = {0: 5, 1: 5, 2: 6}
    cases: list[tuple[Phase, bool, float]] = [
        ("publishing", False, 9.0),
        ("handing_off", False, 4.0),
        ("handing_off", False, 6.0),
        ("handing_off", True, 6.0),
        ("stopping_workers", False, 9.0),
    ]
    for phase, forced, now in cases:
        r.phase, r.phase_started_at, r.handoff_forced = phase, 0.0, forced
        with_holders = next_step(r, obs(now, 5, {}, acks=acks, holders=holders), DL)
        without = next_step(r, obs(now, 5, {}, acks=acks), DL)
        if not needs_holders(r, now, DL):
            assert with_holders == without, (phase, forced, now)
        else:
            assert (phase, forced, now) == ("handing_off", False, 6.0)
            assert isinstance(with_holders, ForceHandoff) and isinstance(without, Wait)


def test_a_slow_old_owner_that_keeps_key_groups_is_forced_too() -> None:
    """Scale-up 2 -> 3: worker 0 keeps 0..1 and must release 2..3; it is starved and does
    not. 2..3 are forced to worker 1, and worker 0 (gaining nothing) is no longer awaited."""
    r = plan_rescale("j", K, plan_assignment(K, 2), 2, 5, 3, "manual", now=0.0)
    r.phase, r.phase_started_at = "handing_off", 0.0
    assert awaited_workers(r) == {0, 1, 2}
    # worker 1 released 5..7 (worker 2 holds them) and waits for 2..3 from worker 0
    holders = {2: 0, 3: 0, 5: 2, 6: 2, 7: 2}
    early = obs(4, 6, {}, acks={0: 5, 1: 5, 2: 6}, holders=holders)
    assert isinstance(next_step(r, early, DL), Wait)
    step = next_step(r, obs(6, 6, {}, acks={0: 5, 1: 5, 2: 6}, holders=holders), DL)
    assert step == ForceHandoff(laggards=(0,), forced=frozenset({2, 3}), excused=frozenset({0}))
    # a late owner that must also claim stays awaited: worker 1 holds 5, released 6..7
    held = {2: 0, 3: 0, 5: 1}
    step = next_step(r, obs(6, 6, {}, acks={0: 5, 1: 5, 2: 5}, holders=held), DL)
    assert step == ForceHandoff(laggards=(0, 1), forced=frozenset({2, 3, 5}),
                                excused=frozenset({0}))  # fmt: skip
    r.handoff_forced, r.to_generation, r.excused_workers = True, 7, [0]
    assert next_step(r, obs(7, 7, {}, acks={0: 5, 1: 7, 2: 7}), DL) == Advance("finished")
    stuck = obs(11, 7, {}, acks={0: 5, 1: 6, 2: 7})
    assert isinstance(next_step(r, stuck, DL), Finish)


def test_failover_forces_only_the_lost_workers_key_groups() -> None:
    owners = plan_assignment(K, 4)
    new = plan_failover(owners, {1})
    r = plan_failover_rescale("j", owners, 4, 5, new, now=0.0)
    assert r.forced == [2, 3]
    assert r.excused_workers == [1]
    assert awaited_workers(r) == {0, 2, 3}
    assert r.phase == "publishing"
    step = next_step(r, obs(0, 5, {}), DL)
    assert isinstance(step, Publish)
    assert step.forced == frozenset({2, 3})


def info(ordinal: int, ready: bool, not_ready_since: float | None = None) -> WorkerInfo:
    return WorkerInfo(
        ordinal=ordinal,
        name=f"j-worker-{ordinal}",
        running=ready,
        ready=ready,
        not_ready_since=None if ready else not_ready_since,
    )


def test_next_rescale_first_deployment() -> None:
    r = next_rescale("j", K, None, {}, Desired(3), now=0.0, failover_after=3)
    assert r is not None
    assert (r.reason, r.from_parallelism, r.to_parallelism, r.to_generation) == ("initial", 0, 3, 1)


def test_next_rescale_failover_only_after_failover_after() -> None:
    a = Assignment(5, 4, plan_assignment(K, 4))
    workers = {0: info(0, True), 1: info(1, False, 10.0), 2: info(2, True), 3: info(3, True)}
    assert next_rescale("j", K, a, workers, Desired(4), now=12.9, failover_after=3) is None
    r = next_rescale("j", K, a, workers, Desired(4), now=13.0, failover_after=3)
    assert r is not None
    assert (r.reason, r.forced) == ("failover", [2, 3])


def test_next_rescale_no_failover_when_no_worker_is_ready() -> None:
    """A common cause (store or network outage): moving key groups would not help."""
    a = Assignment(5, 2, plan_assignment(K, 2))
    workers = {0: info(0, False, 0.0), 1: info(1, False, 0.0)}
    assert next_rescale("j", K, a, workers, Desired(2), now=100.0, failover_after=3) is None


def test_next_rescale_rebalances_once_everyone_is_ready_again() -> None:
    owners = plan_failover(plan_assignment(K, 4), {1})
    a = Assignment(6, 4, owners)
    all_ready = {w: info(w, True) for w in range(4)}
    r = next_rescale("j", K, a, all_ready, Desired(4), now=0.0, failover_after=3)
    assert r is not None
    assert (r.reason, tuple(r.to_owners), r.forced) == ("rebalance", plan_assignment(K, 4), [])
    one_down = {**all_ready, 1: info(1, False, 0.0)}
    assert next_rescale("j", K, a, one_down, Desired(4), now=1.0, failover_after=3) is None


def test_next_rescale_follows_the_desired_parallelism() -> None:
    a = Assignment(2, 2, plan_assignment(K, 2))
    ready = {w: info(w, True) for w in range(2)}
    assert next_rescale("j", K, a, ready, Desired(2), now=0.0, failover_after=3) is None
    r = next_rescale("j", K, a, ready, Desired(5, "autoscaler"), now=0.0, failover_after=3)
    assert r is not None
    assert (r.reason, r.to_parallelism, r.start_workers) == ("autoscaler", 5, [2, 3, 4])


def test_next_rescale_no_failover_of_workers_still_recovering_from_a_store_outage() -> None:
    """The store was down until t=100: both workers were not ready since t=50; worker 0
    is back first.  Worker 1 gets ``failover_after`` from the store's return."""
    a = Assignment(5, 2, plan_assignment(K, 2))
    workers = {0: info(0, True), 1: info(1, False, 50.0)}
    assert next_rescale("j", K, a, workers, Desired(2), 102.9, 3, store_ok_since=100.0) is None
    r = next_rescale("j", K, a, workers, Desired(2), 103.0, 3, store_ok_since=100.0)
    assert r is not None and r.reason == "failover"


def test_next_rescale_plans_load_aware_ranges_and_records_balance_and_moves() -> None:
    a = Assignment(2, 2, plan_assignment(K, 2))
    ready = {w: info(w, True) for w in range(2)}
    load = [9.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # key groups 0 and 1 are hot
    r = next_rescale("j", K, a, ready, Desired(4), now=0.0, failover_after=3, load=load)
    assert r is not None and r.load_aware
    per = [sum(x for kg, x in enumerate(load) if r.to_owners[kg] == w) for w in range(4)]
    assert max(per) == 9.0  # count-based ranges: 18 on worker 0
    assert r.predicted_balance == round(9.0 / 6.0, 4)
    assert r.moved_key_groups == sum(
        1 for x, y in zip(r.from_owners, r.to_owners, strict=True) if x != y
    )
    # no load known: the plain ranges, no prediction
    plain = next_rescale("j", K, a, ready, Desired(4), now=0.0, failover_after=3)
    assert plain is not None and plain.to_owners == list(plan_assignment(K, 4))
    assert (plain.predicted_balance, plain.load_aware, plain.moved_key_groups) == (None, False, 6)


def test_next_rescale_a_change_of_load_alone_starts_no_rescale() -> None:
    """Load-aware ranges (not the plain ones) at the desired parallelism stay as they are
    however the load moves: only a new parallelism or a failover's rebalance replans."""
    ready = {w: info(w, True) for w in range(4)}
    owners = (2, 2, 0, 0, 0, 1, 1, 3)  # an earlier load-aware plan
    a = Assignment(7, 4, owners)
    for load in (None, [1.0] * K, [50.0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 50.0]):
        assert (
            next_rescale("j", K, a, ready, Desired(4), now=0.0, failover_after=3, load=load) is None
        )


def test_next_rescale_rebalances_after_a_failover_by_load() -> None:
    owners = plan_failover(plan_assignment(K, 4), {1})
    a = Assignment(6, 4, owners)
    ready = {w: info(w, True) for w in range(4)}
    load = [1.0] * K
    r = next_rescale("j", K, a, ready, Desired(4), now=0.0, failover_after=3, load=load)
    assert r is not None and r.reason == "rebalance"
    assert sorted(r.to_owners.count(w) for w in range(4)) == [2, 2, 2, 2]
    assert r.predicted_balance == 1.0


def test_standby_workers_are_taken_by_a_scale_up_and_kept_by_a_scale_down() -> None:
    """With two standby workers (ordinals 2 and 3 beside parallelism 2), 2 -> 4 starts no
    process: the standby workers are ready, so the new assignment is published at once;
    4 -> 2 stops nobody: the freed workers are the new standby, and only workers beyond
    parallelism + standby stop."""
    owners = plan_assignment(K, 2)
    up = plan_rescale("j", K, owners, 2, 3, 4, "manual", now=0.0, standby=2)
    assert up.start_workers == [2, 3]
    standby_ready = {0: True, 1: True, 2: True, 3: True, 4: True, 5: True}
    assert next_step(up, obs(0, 3, standby_ready), DL) == Advance("publishing")
    down = plan_rescale("j", K, plan_assignment(K, 4), 4, 4, 2, "manual", now=0.0, standby=2)
    assert down.stop_workers == [4, 5]
    assert plan_rescale("j", K, plan_assignment(K, 4), 4, 4, 3, "manual", 0.0).stop_workers == [3]


def test_the_controller_keeps_the_standby_running() -> None:
    assignment = Assignment(2, 3, tuple(plan_assignment(K, 3)))
    assert workers_needed(assignment, None, standby=2) == {0, 1, 2, 3, 4}
    assert workers_needed(assignment, None) == {0, 1, 2}
    assert workers_needed(None, None, standby=2) == set()


def test_the_loop_ticks_fast_while_a_rescale_waits_for_its_workers() -> None:
    """Publishing, handing off and stopping end when a tick sees the workers' answer: a
    full tick's pause would be most of a rescale whose handoffs take milliseconds."""
    settings = ControllerSettings(tick_seconds=0.2, handoff_tick_seconds=0.02)
    up = plan_rescale("j", K, plan_assignment(K, 2), 2, 1, 4, "manual", now=0.0)
    assert tick_pause(settings, None) == 0.2
    expected = {"starting_workers": 0.2, "publishing": 0.02, "handing_off": 0.02,
                "stopping_workers": 0.02, "finished": 0.2}  # fmt: skip
    for phase, pause in expected.items():
        up.phase = phase  # type: ignore[assignment]
        assert tick_pause(settings, up) == pause, phase
    slow = ControllerSettings(tick_seconds=0.01, handoff_tick_seconds=0.02)
    up.phase = "handing_off"
    assert tick_pause(slow, up) == 0.01  # never slower than the normal tick


def test_a_scale_up_refills_the_standby_it_took_once_its_handoffs_are_done() -> None:
    """2 -> 4 with 2 standby workers takes workers 2 and 3; the new standby (4 and 5) is
    started after the handoffs, not during them, when it would take their CPU."""
    before = Assignment(1, 2, tuple(plan_assignment(K, 2)))
    up = plan_rescale("j", K, plan_assignment(K, 2), 2, 1, 4, "manual", now=0.0, standby=2)
    assert up.start_workers == [2, 3]  # running already, as the standby
    for phase in ("starting_workers", "publishing"):
        up.phase = phase
        assert workers_needed(before, up, standby=2) == {0, 1, 2, 3}
    after = Assignment(2, 4, tuple(plan_assignment(K, 4)))
    up.phase = "handing_off"
    assert workers_needed(after, up, standby=2) == {0, 1, 2, 3}
    up.phase = "stopping_workers"
    assert workers_needed(after, up, standby=2) == {0, 1, 2, 3, 4, 5}
    assert workers_needed(after, None, standby=2) == {0, 1, 2, 3, 4, 5}
    # a scale-down keeps every worker it hands off from until it stops the extra ones
    down = plan_rescale("j", K, plan_assignment(K, 4), 4, 2, 2, "manual", now=0.0, standby=2)
    down.phase = "handing_off"
    back = Assignment(3, 2, tuple(plan_assignment(K, 2)))
    assert workers_needed(back, down, standby=2) == set(range(6))
    assert down.stop_workers == [4, 5]


# -- scale to zero and wake -----------------------------------------------------------------


def test_scale_to_zero_releases_every_key_group_to_nobody_and_stops_every_worker() -> None:
    owners = plan_assignment(K, 2)
    r = plan_rescale("j", K, owners, 2, 5, 0, "autoscaler", now=0.0, standby=1)
    assert (r.phase, r.to_owners, r.stop_workers) == ("publishing", [NO_OWNER] * K, [0, 1, 2])
    step = next_step(r, obs(0, 5, {0: True, 1: True, 2: True}), DL)
    assert step == Publish(6, 5, (NO_OWNER,) * K, frozenset(), 0)
    r.phase, r.phase_started_at = "handing_off", 0.0
    assert awaited_workers(r) == {0, 1}  # their acknowledgement is their release
    assert isinstance(next_step(r, obs(1, 6, {}, acks={0: 6, 1: 5}), DL), Wait)
    assert next_step(r, obs(1, 6, {}, acks={0: 6, 1: 6}), DL) == Advance("stopping_workers")
    r.phase = "stopping_workers"
    assert next_step(r, obs(2, 6, {0: True, 1: True, 2: True}), DL) == StopWorkers((0, 1, 2))
    assert next_step(r, obs(3, 6, {}), DL) == Advance("finished")


def test_a_worker_that_never_releases_on_scale_to_zero_is_stopped_all_the_same() -> None:
    owners = plan_assignment(K, 2)
    r = plan_rescale("j", K, owners, 2, 5, 0, "autoscaler", now=0.0)
    r.phase, r.phase_started_at = "handing_off", 0.0
    late = obs(DL.handoff_seconds + 1, 6, {}, acks={0: 6}, holders={kg: 1 for kg in range(4, 8)})
    step = next_step(r, late, DL)
    assert isinstance(step, ForceHandoff)
    assert (step.laggards, step.forced, step.excused) == (
        (1,),
        frozenset(range(4, 8)),
        frozenset({1}),
    )
    r.excused_workers, r.handoff_forced = [1], True
    assert next_step(r, late, DL) == Advance("stopping_workers")


def test_no_worker_runs_while_the_job_is_scaled_to_zero() -> None:
    idle = Assignment(generation=6, parallelism=0, owners=(NO_OWNER,) * K)
    assert workers_needed(idle, None, standby=2) == set()
    assert next_rescale("j", K, idle, {}, Desired(0, "autoscaler"), 10.0, 3.0) is None


def test_a_wake_is_a_deployment_from_the_store_claiming_unreleased_key_groups_by_force() -> None:
    idle = Assignment(generation=6, parallelism=0, owners=(NO_OWNER,) * K)
    r = next_rescale("j", K, idle, {}, Desired(2, "autoscaler"), 10.0, 3.0, standby=1, held=[3])
    assert r is not None
    assert (r.reason, r.from_parallelism, r.to_parallelism) == ("autoscaler", 0, 2)
    assert (r.from_owners, r.to_owners) == ([], list(plan_assignment(K, 2)))
    assert (r.start_workers, r.stop_workers, r.forced) == ([0, 1], [], [3])
    r.phase = "handing_off"
    assert awaited_workers(r) == {0, 1}
    # the standby comes back once the wake is done
    woken = Assignment(generation=7, parallelism=2, owners=plan_assignment(K, 2))
    assert workers_needed(woken, None, standby=1) == {0, 1, 2}
