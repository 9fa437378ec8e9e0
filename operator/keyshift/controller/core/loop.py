"""The controller loop, shared by ``keyshift run`` and the Kubernetes operator (each
runs it through :class:`~keyshift.controller.supervisor.Supervisor`).

Each tick: keep the workers of the current assignment in the pool, drive the
rescale in progress, or else ask :func:`~keyshift.controller.core.reconcile.next_rescale`
whether to start one (first deployment, failover, rebalance, new desired
parallelism).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from keyshift.api.spec import StreamJobSpec
from keyshift.controller.core.assignment import PlanError
from keyshift.controller.core.executor import EventSink, RescaleExecutor
from keyshift.controller.core.pool import WorkerPool
from keyshift.controller.core.reconcile import Desired, next_rescale
from keyshift.controller.core.records import RecordStore
from keyshift.controller.core.rescale import Deadlines, Rescale
from keyshift.store.protocol import Assignment, StateStore, StoreError

log = logging.getLogger("keyshift.controller")


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Every timing of a job's control loop, on both hosts, in one place.

    The first three come from the StreamJob's spec (:meth:`for_spec`); the others are the
    loop's own pace.
    """

    failover_after: float = 3.0
    """A worker that owns key groups and is not ready this long loses them (``failoverAfter``)."""
    deadlines: Deadlines = field(default_factory=Deadlines)
    """How long a rescale's phases may take (``handoffTimeout`` is the handoff's)."""
    standby_workers: int = 0
    """Workers kept running beyond the parallelism, owning nothing (``standbyWorkers``)."""
    tick_seconds: float = 0.2
    """The pause between two ticks of the loop (a rescale advances one step per tick)."""
    handoff_tick_seconds: float = 0.02
    """The pause while a rescale publishes, hands off or stops workers: those phases end
    when a tick reads the last worker's acknowledgement (or sees its workers gone), and a
    full tick's pause would add up to ``tick_seconds`` to the rescale's wall time for
    handoffs that take tens of milliseconds. A tick then is a few store reads."""
    status_seconds: float = 1.0
    """How often the job's status is written (``status.json``, the StreamJob's status)."""
    store_stall_seconds: float = 1.0
    """A store call that took longer than this counts as a store outage ending now."""
    drift_seconds: float = 5.0
    """Kubernetes: how often the objects the job owns are compared with what they should be."""
    secret_retry_seconds: float = 2.0
    """Kubernetes: how often the Secrets of a job are checked again while one is refused."""

    def for_spec(
        self, spec: StreamJobSpec, *, failover_after: float | None = None
    ) -> ControllerSettings:
        """These settings with the spec's timings (``failover_after`` overrides the spec's)."""
        return replace(
            self,
            failover_after=failover_after or spec.failover_after,
            deadlines=Deadlines(handoff_seconds=spec.handoff_timeout),
            standby_workers=spec.standby_workers,
        )


def tick_pause(settings: ControllerSettings, current: Rescale | None) -> float:
    """How long the loop pauses before its next tick: short while the rescale in
    progress waits for its workers' acknowledgements or for stopped workers to go."""
    if current is not None and current.phase in ("publishing", "handing_off", "stopping_workers"):
        return min(settings.handoff_tick_seconds, settings.tick_seconds)
    return settings.tick_seconds


def workers_needed(
    assignment: Assignment | None, current: Rescale | None, standby: int = 0
) -> set[int]:
    """Ordinals that must be running (or restarting) now: the assignment's workers and
    ``standby`` more, which own nothing until a scale-up takes them (none while the job
    is scaled to zero).

    While a rescale starts its workers, publishes or hands off, the standby is the one
    from before it: a scale-up that took standby workers refills the standby once its
    handoffs are done, so that starting processes do not take CPU from the handoffs
    (locally they share the machine; on Kubernetes, a node)."""
    if current is not None and current.phase in ("starting_workers", "publishing", "handing_off"):
        before = current.from_parallelism
        needed = set(range(before + standby)) if before else set()
        if current.phase == "handing_off":
            needed |= set(range(max(current.from_parallelism, current.to_parallelism)))
        return needed
    if assignment is None or assignment.parallelism == 0:
        return set()
    return set(range(assignment.parallelism + standby))


class Controller:
    def __init__(
        self,
        job: str,
        key_groups: int,
        store: StateStore,
        pool: WorkerPool,
        records: RecordStore,
        *,
        desired: Callable[[], Desired],
        load: Callable[[], Sequence[float] | None] | None = None,
        settings: ControllerSettings | None = None,
        on_event: EventSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.job = job
        self.key_groups = key_groups
        self.store = store
        self.pool = pool
        self.desired = desired
        self.load = load or (lambda: None)
        """The measured load per key group (records/s over the metrics window), or None:
        it shapes the ranges of a rescale, never starts one."""
        self.settings = settings or ControllerSettings()
        self.on_event = on_event or (lambda kind, msg: None)
        self.clock = clock
        self.executor = RescaleExecutor(
            job, store, pool, records, records.load(),
            deadlines=self.settings.deadlines, on_event=self.on_event, clock=clock,
        )  # fmt: skip
        self.assignment: Assignment | None = None
        self.last_error: str | None = None
        self.store_ok_since: float = clock()
        """When the controller last regained the store (or started): failover waits."""
        self._store_down = False

    def pause_seconds(self) -> float:
        """The pause before the next tick (:func:`tick_pause`)."""
        return tick_pause(self.settings, self.executor.record.current)

    async def tick(self) -> None:
        asked = self.clock()
        self.assignment = await self.store.get_assignment(self.job)
        # the store was away if the call failed before, or if it hung (a stalled connection
        # is waited out inside the client's retries, no error ever reaches this loop)
        if self._store_down or self.clock() - asked > self.settings.store_stall_seconds:
            self._store_down = False
            self.store_ok_since = self.clock()
            self.on_event("Normal", "state store reachable again")
        current = self.executor.record.current
        needed = workers_needed(self.assignment, current, self.settings.standby_workers)
        running = await self.pool.workers()
        missing = sorted(needed - set(running))
        if missing:
            await self.pool.start(missing)
            running = await self.pool.workers()
        if current is not None:
            await self.executor.advance()
            return
        await self.executor.follow_up()
        desired = self.desired()
        held: list[int] = []
        if self.assignment is not None and self.assignment.parallelism == 0 and desired.parallelism:
            owners = await self.store.owners(self.job, range(self.key_groups))
            held = sorted(kg for kg, owner in owners.items() if owner)
        try:
            rescale = next_rescale(
                self.job, self.key_groups, self.assignment, running, desired,
                self.clock(), self.settings.failover_after, self.store_ok_since, self.load(),
                self.settings.standby_workers, held,
            )  # fmt: skip
        except PlanError as exc:  # e.g. a desired parallelism above the key group count
            self._error(str(exc))
            return
        if rescale is not None:
            await self.executor.begin(rescale)
            await self.executor.advance()

    def _error(self, message: str) -> None:
        if message != self.last_error:
            self.on_event("Warning", message)
        self.last_error = message

    def store_unreachable(self, exc: StoreError) -> None:
        """A tick failed on the store: reported once, and the return is noticed (failover
        then waits for the workers to come back)."""
        self._store_down = True
        self._error(f"state store: {exc}")
