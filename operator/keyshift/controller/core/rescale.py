"""The rescale protocol as data: a rescale's record and its next step.

A rescale moves a job from assignment generation ``g`` to ``g+1`` (docs/design.md,
"The rescale protocol"):

- scale-up ``n -> m``: start workers ``n..m-1`` and wait until they are
  ready, publish ``g+1``, wait until every worker involved runs ``g+1``;
- scale-down ``m -> n``: publish first, wait for the handoffs, then stop the
  idle workers ``n..m-1``;
- failover: publish ``g+1`` with the lost workers' key groups on the
  survivors, claimed by force; rebalance: publish contiguous ranges again.

The target of a scale or a rebalance is :func:`~keyshift.controller.core.assignment.plan_ranges`:
contiguous ranges whose boundaries follow the measured load per key group (if known), and
among equally balanced plans the one moving the fewest key groups; the record keeps the
predicted balance and the moves.

:func:`next_step` looks at a :class:`Rescale` and what the controller observes
and says what to do next. It is pure: the executor (``executor.py``) does the
I/O and persists the record after every phase, so a restarted controller
resumes exactly where the last one stopped.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from keyshift.controller.core.assignment import (
    NO_OWNER,
    PlanError,
    RangePlan,
    check_parallelism,
    idle_owners,
    moved,
    plan_ranges,
)
from keyshift.controller.core.handoffs import HandoffTimeline

Reason = Literal["initial", "manual", "autoscaler", "failover", "rebalance"]
Phase = Literal["starting_workers", "publishing", "handing_off", "stopping_workers", "finished"]
RescaleOutcome = Literal["succeeded", "rolled_back", "failed"]


class StepTiming(msgspec.Struct, frozen=True):
    phase: str
    seconds: float


class Rescale(msgspec.Struct, kw_only=True):
    """One rescale, from its plan to its outcome. Persisted as JSON."""

    id: str
    job: str
    reason: Reason
    from_parallelism: int
    to_parallelism: int
    from_generation: int
    to_generation: int
    from_owners: list[int]
    to_owners: list[int]
    forced: list[int] = msgspec.field(default_factory=list)
    """Key groups the new owners claim without waiting for a release."""
    start_workers: list[int] = msgspec.field(default_factory=list)
    stop_workers: list[int] = msgspec.field(default_factory=list)
    excused_workers: list[int] = msgspec.field(default_factory=list)
    """Old owners whose release is no longer awaited (their key groups were forced)."""
    handoff_forced: bool = False
    phase: Phase = "starting_workers"
    started_at: float = 0.0
    phase_started_at: float = 0.0
    steps: list[StepTiming] = msgspec.field(default_factory=list)
    outcome: RescaleOutcome | None = None
    message: str = ""
    finished_at: float | None = None
    moved_key_groups: int = 0
    max_pause_seconds: float | None = None
    """The longest pause of a moved key group: from its release to its claim."""
    handoff: HandoffTimeline | None = None
    """Where the moved key groups' pause went, step by step (``handoffs.py``)."""
    predicted_balance: float | None = None
    """The plan's busiest worker's load / mean load, by the load it was planned with
    (None: planned by key group count, no load known)."""
    load_aware: bool = False
    """The ranges' boundaries follow a measured load per key group."""

    @property
    def done(self) -> bool:
        return self.phase == "finished"

    @property
    def duration_seconds(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at


@dataclass(frozen=True, slots=True)
class Deadlines:
    ready_seconds: float = 60.0
    """New workers must be ready within this, or the rescale is rolled back."""
    handoff_seconds: float = 15.0
    """Old owners must release within this, or their key groups are claimed by force."""
    forced_handoff_seconds: float = 30.0
    """After forcing, new owners must run the generation within this, or the rescale fails."""


def _new(
    job: str,
    reason: Reason,
    from_owners: Sequence[int],
    to_owners: Sequence[int],
    from_parallelism: int,
    to_parallelism: int,
    from_generation: int,
    now: float,
    *,
    forced: Collection[int] = (),
    standby: int = 0,
) -> Rescale:
    grow = list(range(from_parallelism, to_parallelism))  # standby ones are running already
    kept = to_parallelism + standby if to_parallelism else 0  # scaled to zero: no standby
    shrink = list(range(kept, from_parallelism + standby))
    return Rescale(
        id=secrets.token_hex(4),
        job=job,
        reason=reason,
        from_parallelism=from_parallelism,
        to_parallelism=to_parallelism,
        from_generation=from_generation,
        to_generation=from_generation + 1,
        from_owners=list(from_owners),
        to_owners=list(to_owners),
        forced=sorted(forced),
        start_workers=grow,
        stop_workers=shrink,
        phase="starting_workers" if grow else "publishing",
        started_at=now,
        phase_started_at=now,
        moved_key_groups=len(moved(from_owners, to_owners)) if from_owners else len(to_owners),
    )


def plan_rescale(
    job: str,
    key_groups: int,
    current_owners: Sequence[int] | None,
    current_parallelism: int,
    current_generation: int,
    to_parallelism: int,
    reason: Reason,
    now: float,
    load: Sequence[float] | None = None,
    standby: int = 0,
    forced: Collection[int] = (),
) -> Rescale:
    """A rescale to ``to_parallelism`` contiguous ranges (also the first deployment);
    ``load``: the measured load per key group, steering the boundaries (None: by count);
    ``standby``: workers kept running beyond the parallelism, owning nothing (a scale-up
    takes them first; a scale-down keeps that many of the workers it frees).

    Scale to zero (``to_parallelism`` 0): every key group is released to nobody
    (:data:`~keyshift.controller.core.assignment.NO_OWNER`) and every worker stops, standby
    ones too. A wake (from parallelism 0) is planned like a first deployment from the
    state in the store: nothing is running to hand off from; ``forced``: key groups the
    store still names an owner of (a release that never came), claimed without waiting.
    """
    if to_parallelism == 0:
        if current_owners is None:
            raise PlanError("a job cannot start at parallelism 0")
        return _new(job, reason, current_owners, idle_owners(key_groups), current_parallelism, 0,
                    current_generation, now, standby=standby)  # fmt: skip
    check_parallelism(to_parallelism, key_groups)
    waking = current_owners is not None and current_parallelism == 0
    previous = None if waking else current_owners
    plan: RangePlan = plan_ranges(key_groups, to_parallelism, load, previous)
    rescale = _new(
        job, "initial" if current_owners is None else reason,
        previous or [], plan.owners,
        0 if current_owners is None else current_parallelism, to_parallelism,
        current_generation, now, standby=standby, forced=forced,
    )  # fmt: skip
    rescale.predicted_balance = plan.balance
    rescale.load_aware = plan.load_aware
    return rescale


def plan_failover_rescale(
    job: str,
    owners: Sequence[int],
    parallelism: int,
    generation: int,
    new_owners: Sequence[int],
    now: float,
) -> Rescale:
    """A failover: the lost workers' key groups go to survivors, claimed by force."""
    forced = sorted(moved(owners, new_owners))
    rescale = _new(job, "failover", owners, new_owners, parallelism, parallelism, generation, now,
                   forced=forced)  # fmt: skip
    # the lost workers will never release: do not wait for them
    rescale.excused_workers = sorted({owners[kg] for kg in forced})
    return rescale


# -- the next step ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What the controller sees of one worker."""

    ordinal: int
    ready: bool
    running: bool
    """The process (pod) exists and has not exited."""
    detail: str = ""
    """Why it is not ready, when known (exit code, probe answer)."""


@dataclass(frozen=True, slots=True)
class Observation:
    now: float
    generation: int
    """The assignment generation in the store (0: none yet)."""
    workers: Mapping[int, WorkerView]
    acks: Mapping[int, int]
    """Worker ordinal -> the generation it reports running."""
    holders: Mapping[int, int] = field(default_factory=dict)
    """During a handoff: moving key group -> the ordinal of the worker the store names as its
    owner (absent while it is released)."""


@dataclass(frozen=True, slots=True)
class StartWorkers:
    ordinals: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StopWorkers:
    ordinals: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Publish:
    generation: int
    expected_generation: int
    owners: tuple[int, ...]
    forced: frozenset[int]
    parallelism: int


@dataclass(frozen=True, slots=True)
class Advance:
    phase: Phase


@dataclass(frozen=True, slots=True)
class ForceHandoff:
    """Old owners did not release in time: republish with their key groups forced."""

    laggards: tuple[int, ...]
    forced: frozenset[int]
    excused: frozenset[int]
    """Laggards no longer awaited: those that gain no key group in this rescale."""


@dataclass(frozen=True, slots=True)
class Finish:
    outcome: RescaleOutcome
    message: str
    stop: tuple[int, ...] = ()
    """Workers to stop first (a rollback of started workers)."""


@dataclass(frozen=True, slots=True)
class Wait:
    why: str


Step = StartWorkers | StopWorkers | Publish | Advance | ForceHandoff | Finish | Wait


def awaited_workers(r: Rescale) -> set[int]:
    """Workers that must report the new generation before the handoff is done:
    every owner in the new assignment, and every old owner that loses key
    groups (its report means it has released them), unless excused."""
    new_owners = set(r.to_owners) - {NO_OWNER}
    losers = (
        {r.from_owners[kg] for kg in moved(r.from_owners, r.to_owners)} if r.from_owners else set()
    )
    return (new_owners | losers) - set(r.excused_workers)


def needs_holders(r: Rescale, now: float, deadlines: Deadlines) -> bool:
    """Whether :func:`next_step` looks at ``Observation.holders`` now: only a handoff
    past its deadline, not yet forced, does (so the store is not asked every tick)."""
    return (
        r.phase == "handing_off"
        and bool(r.from_owners)
        and not r.handoff_forced
        and now - r.phase_started_at > deadlines.handoff_seconds
    )


def next_step(r: Rescale, obs: Observation, deadlines: Deadlines) -> Step:
    """What the executor does next for rescale ``r``, given what it observes."""
    elapsed = obs.now - r.phase_started_at
    if r.phase == "starting_workers":
        missing = tuple(w for w in r.start_workers if w not in obs.workers)
        if missing:
            return StartWorkers(missing)
        not_ready = [w for w in r.start_workers if not obs.workers[w].ready]
        if not not_ready:
            return Advance("publishing")
        if elapsed > deadlines.ready_seconds:
            details = "; ".join(
                f"worker {w}: {obs.workers[w].detail or 'not ready'}" for w in not_ready
            )
            return Finish(
                "rolled_back",
                f"new workers {', '.join(map(str, not_ready))} not ready after "
                f"{deadlines.ready_seconds:.0f}s ({details}); generation {r.from_generation} "
                "kept, new workers stopped",
                stop=tuple(r.start_workers),
            )
        return Wait(f"waiting for workers {not_ready} to become ready")

    if r.phase == "publishing":
        if obs.generation == r.to_generation:
            return Advance("handing_off")  # published before a controller restart
        if obs.generation != r.from_generation:
            return Finish(
                "failed",
                f"the assignment moved to generation {obs.generation} outside this rescale "
                f"(expected {r.from_generation})",
            )
        return Publish(
            generation=r.to_generation,
            expected_generation=r.from_generation,
            owners=tuple(r.to_owners),
            forced=frozenset(r.forced),
            parallelism=r.to_parallelism,
        )

    if r.phase == "handing_off":
        waiting = sorted(w for w in awaited_workers(r) if obs.acks.get(w, 0) < r.to_generation)
        if not waiting:
            return Advance("stopping_workers" if r.stop_workers else "finished")
        # old owners still holding a moving key group (slow, starved or hung, whether or not
        # they keep others): past the deadline, those key groups are claimed by force. A
        # laggard is no longer awaited unless it must also claim a key group.
        losing = moved(r.from_owners, r.to_owners) if r.from_owners else []
        unreleased = [kg for kg in losing if obs.holders.get(kg) == r.from_owners[kg]]
        laggards = tuple(sorted({r.from_owners[kg] for kg in unreleased} & set(waiting)))
        if laggards and not r.handoff_forced and elapsed > deadlines.handoff_seconds:
            forced = frozenset(kg for kg in unreleased if r.from_owners[kg] in laggards)
            gaining = {r.to_owners[kg] for kg in losing}
            excused = frozenset(w for w in laggards if w not in gaining)
            return ForceHandoff(laggards, forced | frozenset(r.forced), excused)
        limit = deadlines.handoff_seconds + deadlines.forced_handoff_seconds
        if elapsed > limit:
            return Finish(
                "failed",
                f"workers {waiting} did not run generation {r.to_generation} within {limit:.0f}s",
            )
        return Wait(f"waiting for workers {waiting} to run generation {r.to_generation}")

    if r.phase == "stopping_workers":
        still = tuple(w for w in r.stop_workers if w in obs.workers)
        if still:
            return StopWorkers(still)
        return Advance("finished")

    return Wait("finished")
