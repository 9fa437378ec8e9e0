"""The rescale executor: carries out :func:`~keyshift.controller.core.rescale.next_step`.

It observes (pool, assignment, workers' generation reports), asks the pure
planner for the next step, does it, and saves the controller record after
every change of phase, so a controller killed at any point resumes the same
rescale (``keyshift run`` again, or the operator's next leader). Fault tests
kill it at the crash points ``executor.start.after``, ``executor.publish.after``,
``executor.stop.after`` and ``executor.<phase>.entered`` (see
``keyshift.runtime.faults``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from keyshift.api.names import ordinal_of, worker_name
from keyshift.controller.core.assignment import moved
from keyshift.controller.core.handoffs import (
    HandoffTimeline,
    key_group_handoff,
    publish_time,
    timeline,
)
from keyshift.controller.core.pool import WorkerPool
from keyshift.controller.core.records import ControllerRecord, RecordStore
from keyshift.controller.core.rescale import (
    Advance,
    Deadlines,
    Finish,
    ForceHandoff,
    Observation,
    Publish,
    Rescale,
    StartWorkers,
    StepTiming,
    StopWorkers,
    Wait,
    WorkerView,
    needs_holders,
    next_step,
)
from keyshift.runtime.faults import crash_point
from keyshift.store.protocol import Assignment, StateStore

log = logging.getLogger("keyshift.controller")

FOLLOW_UP_SECONDS = 10.0
"""How long after a rescale the executor still looks for new owners' handoff marks that
came after its end (a first batch processed after the last acknowledgement)."""
FOLLOW_UP_EVERY = 0.5

EventSink = Callable[[str, str], None]
"""``(kind, message)``: kind is ``Normal`` or ``Warning``, as Kubernetes Events."""


class RescaleExecutor:
    def __init__(
        self,
        job: str,
        store: StateStore,
        pool: WorkerPool,
        records: RecordStore,
        record: ControllerRecord,
        *,
        deadlines: Deadlines | None = None,
        on_event: EventSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.job = job
        self.store = store
        self.pool = pool
        self.records = records
        self.record = record
        self.deadlines = deadlines or Deadlines()
        self.on_event = on_event or (lambda kind, msg: None)
        self.clock = clock
        self._followed_up = 0.0

    async def observe(self) -> Observation:
        workers = await self.pool.workers()
        assignment = await self.store.get_assignment(self.job)
        acks: dict[int, int] = {}
        for name, generation in (await self.store.worker_generations(self.job)).items():
            ordinal = ordinal_of(self.job, name)
            if ordinal is not None:
                acks[ordinal] = generation
        holders: dict[int, int] = {}
        r = self.record.current
        now = self.clock()
        if r is not None and needs_holders(r, now, self.deadlines):
            owners = await self.store.owners(self.job, moved(r.from_owners, r.to_owners))
            for kg, name in owners.items():
                ordinal = ordinal_of(self.job, name)
                if ordinal is not None:
                    holders[kg] = ordinal
        return Observation(
            now=now,
            generation=0 if assignment is None else assignment.generation,
            workers={
                o: WorkerView(o, ready=w.ready, running=w.running, detail=w.detail)
                for o, w in workers.items()
            },
            acks=acks,
            holders=holders,
        )

    async def begin(self, rescale: Rescale) -> None:
        self.record.current = rescale
        await self.records.save(self.record)
        self.on_event(
            "Normal",
            f"rescale {rescale.from_parallelism} -> {rescale.to_parallelism} "
            f"({rescale.reason}) started: generation {rescale.to_generation}, "
            f"{rescale.moved_key_groups} key groups move"
            + (
                f", busiest worker predicted at {rescale.predicted_balance:.2f}x the mean load"
                if rescale.predicted_balance is not None
                else ""
            ),
        )

    async def advance(self) -> Rescale | None:
        """Take steps of the current rescale until it must wait; return it once finished."""
        r = self.record.current
        if r is None:
            return None
        for _ in range(16):  # bounded: each pass either waits, acts or changes phase
            step = next_step(r, await self.observe(), self.deadlines)
            if isinstance(step, Wait):
                return None
            if isinstance(step, StartWorkers):
                await self.pool.start(step.ordinals)
                crash_point("executor.start.after")
            elif isinstance(step, StopWorkers):
                await self.pool.stop(step.ordinals)
                for ordinal in step.ordinals:
                    await self.store.forget_worker(self.job, worker_name(self.job, ordinal))
                crash_point("executor.stop.after")
            elif isinstance(step, Publish):
                await self.store.publish_assignment(
                    self.job,
                    Assignment(
                        generation=step.generation,
                        parallelism=step.parallelism,
                        owners=step.owners,
                        forced=step.forced,
                    ),
                    expected_generation=step.expected_generation,
                )
                crash_point("executor.publish.after")
                await self._enter(r, "handing_off")
            elif isinstance(step, ForceHandoff):
                await self._force(r, step)
            elif isinstance(step, Advance):
                if step.phase == "finished":
                    await self._finish(r, "succeeded", "")
                    return r
                await self._enter(r, step.phase)
            elif isinstance(step, Finish):
                if step.stop:
                    await self.pool.stop(step.stop)
                await self._finish(r, step.outcome, step.message)
                return r
        return None

    async def _enter(self, r: Rescale, phase: str) -> None:
        now = self.clock()
        r.steps = [*r.steps, StepTiming(r.phase, round(now - r.phase_started_at, 4))]
        r.phase = phase  # type: ignore[assignment]
        r.phase_started_at = now
        await self.records.save(self.record)
        log.info("rescale %s: %s", r.id, phase)
        crash_point(f"executor.{phase}.entered")

    async def _force(self, r: Rescale, step: ForceHandoff) -> None:
        generation = r.to_generation + 1
        await self.store.publish_assignment(
            self.job,
            Assignment(
                generation=generation,
                parallelism=r.to_parallelism,
                owners=tuple(r.to_owners),
                forced=step.forced,
            ),
            expected_generation=r.to_generation,
        )
        r.to_generation = generation
        r.forced = sorted(step.forced)
        r.excused_workers = sorted(set(r.excused_workers) | step.excused)
        r.handoff_forced = True
        await self.records.save(self.record)
        self.on_event(
            "Warning",
            f"workers {list(step.laggards)} did not release within "
            f"{self.deadlines.handoff_seconds:.0f}s: their key groups are claimed by force "
            f"(generation {generation})",
        )

    async def _finish(self, r: Rescale, outcome: str, message: str) -> None:
        now = self.clock()
        r.steps = [*r.steps, StepTiming(r.phase, round(now - r.phase_started_at, 4))]
        r.phase = "finished"
        r.outcome = outcome  # type: ignore[assignment]
        r.message = message
        r.finished_at = now
        if outcome == "succeeded":
            r.max_pause_seconds = await self._max_pause(r)
            r.handoff = await self._handoff_timeline(r)
        self.record.finish(r)
        await self.records.save(self.record)
        summary = (
            f"rescale {r.from_parallelism} -> {r.to_parallelism} ({r.reason}) {outcome} "
            f"in {now - r.started_at:.2f}s"
        )
        if r.max_pause_seconds is not None:
            summary += f", longest key group pause {r.max_pause_seconds * 1000:.0f} ms"
        if message:
            summary += f": {message}"
        self.on_event("Normal" if outcome == "succeeded" else "Warning", summary)

    async def _max_pause(self, r: Rescale) -> float | None:
        """The longest handoff pause among the key groups this rescale moved."""
        key_groups = moved(r.from_owners, r.to_owners) if r.from_owners else frozenset()
        pauses = []
        for kg in sorted(key_groups):
            info = await self.store.key_group_info(self.job, kg)
            if info.claimed_generation >= r.from_generation + 1 and info.last_pause is not None:
                pauses.append(max(0.0, info.last_pause))
        return round(max(pauses), 4) if pauses else None

    async def _handoff_timeline(self, r: Rescale) -> HandoffTimeline | None:
        """Each moved key group's handoff, step by step, from the marks in the store (none
        for a scale to zero: nobody claims)."""
        if not r.from_owners or r.to_parallelism == 0:
            return None
        published = publish_time(r.started_at, [(s.phase, s.seconds) for s in r.steps])
        handoffs = []
        for kg in sorted(moved(r.from_owners, r.to_owners)):
            info = await self.store.key_group_info(self.job, kg)
            handoffs.append(key_group_handoff(
                info, r.from_owners[kg], r.to_owners[kg], r.from_generation + 1, published
            ))  # fmt: skip
        return timeline(published, handoffs)

    async def follow_up(self) -> None:
        """Complete the last rescale's handoff timeline with the new owners' marks that came
        after it finished (their first batch), for a few seconds after its end."""
        last = self.record.history[-1] if self.record.history else None
        now = self.clock()
        if (
            last is None
            or last.handoff is None
            or last.handoff.complete
            or last.finished_at is None
            or now - last.finished_at > FOLLOW_UP_SECONDS
            or now - self._followed_up < FOLLOW_UP_EVERY
        ):
            return
        self._followed_up = now
        found = await self._handoff_timeline(last)
        if found is not None and found != last.handoff:
            last.handoff = found
            await self.records.save(self.record)
