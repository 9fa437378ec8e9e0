"""Collection while a job is scaled to zero: what waits in its input, and its earliest timer.

With no worker running there is nothing to scrape. The :class:`IdleProbe` reads the
positions committed in the store and opens the job's own source (the generator, or the
Kafka topic with every partition assigned at its committed position, as a worker would):
the input's end offsets against those positions are the backlog. For Kafka the ends come
from fetching, not from an offsets query (a record fetched beyond the position is input
waiting, whatever the broker's offset answers). Timers: the earliest processing-time
timer of any key group is due at its time; an event-time timer when the idle watermark
reaches it (``idleTimeout`` and ``outOfOrderness`` after its time), as it would fire in
a running job without input.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from keyshift.api.spec import StreamJobSpec
from keyshift.controller.autoscaling.metrics.base import IdleSample
from keyshift.runtime.sources import Source, open_source
from keyshift.runtime.timers import EVENT_TIME, PROCESSING_TIME
from keyshift.store import StateStore, StoreError

log = logging.getLogger("keyshift.autoscaler")

SOURCE_OPEN_SECONDS = 5.0
"""How long one collection waits for the source to open (Kafka unreachable: retried at
the next collection, the backlog unknown meanwhile)."""


def backlog_of(positions: Sequence[int], ends: Sequence[int], exhausted: Sequence[bool]) -> int:
    """Records waiting beyond the committed positions (none in an input that has ended)."""
    return sum(
        0 if done else max(0, end - position)
        for position, end, done in zip(positions, ends, exhausted, strict=True)
    )


def timer_due_at(
    processing_ms: Sequence[int | None], event_ms: Sequence[int | None], spec: StreamJobSpec
) -> float | None:
    """Unix time the earliest timer is due (None: no timer): processing-time timers at
    their time, event-time ones when an idle watermark passes them."""
    lag_ms = round((spec.time.idle_timeout + spec.time.out_of_orderness) * 1000)
    due = [t for t in processing_ms if t is not None]
    due += [t + lag_ms for t in event_ms if t is not None]
    return min(due) / 1000 if due else None


class IdleProbe:
    """The :class:`IdleSample` of one job, collected from the store and the job's source."""

    def __init__(
        self,
        store: StateStore,
        job: str,
        spec: StreamJobSpec,
        credentials: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
    ) -> None:
        """``credentials``: the ``KEYSHIFT_KAFKA_*`` variables the workers get (on Kubernetes
        from Secrets), read when the source opens; default the process's environment."""
        self.store = store
        self.job = job
        self.spec = spec
        self.credentials = credentials
        self._source: Source | None = None
        self._assigned: list[int] = []
        self._last_end: tuple[float, int] | None = None
        """The previous sample's time and total end offset (the arrival rate's start)."""

    async def sample(self, now: float) -> IdleSample:
        k = self.spec.key_groups
        try:
            infos = await asyncio.gather(*(self.store.key_group_info(self.job, kg)
                                           for kg in range(k)))  # fmt: skip
            processing = await asyncio.gather(*(self.store.next_timer(self.job, kg, PROCESSING_TIME)
                                                for kg in range(k)))  # fmt: skip
            event = await asyncio.gather(*(self.store.next_timer(self.job, kg, EVENT_TIME)
                                           for kg in range(k)))  # fmt: skip
        except StoreError as exc:
            return IdleSample(now, None, None, f"state store: {exc}")
        due = timer_due_at(
            [None if t is None else t.time for t in processing],
            [None if t is None else t.time for t in event],
            self.spec,
        )
        positions = [info.position for info in infos]
        source = await self._source_at(positions)
        if source is None:
            return IdleSample(now, None, due, "the source is not open yet")
        problem = source.problem()
        if problem:
            return IdleSample(now, None, due, problem)
        ends = [source.end_offset(kg, now) for kg in range(k)]
        exhausted = [source.exhausted(kg, p) for kg, p in enumerate(positions)]
        arrival = None
        if self._last_end is not None and now > self._last_end[0]:
            arrival = max(0.0, (sum(ends) - self._last_end[1]) / (now - self._last_end[0]))
        self._last_end = (now, sum(ends))
        return IdleSample(now, backlog_of(positions, ends, exhausted), due, arrival_rate=arrival)

    async def _source_at(self, positions: list[int]) -> Source | None:
        """The job's source with every key group assigned at ``positions`` (opened, or
        assigned again after the positions moved), or None while it cannot open."""
        if self._source is None:
            info = await self.store.job_info(self.job)
            created_at = 0.0 if info is None else info.created_at
            environ = None if self.credentials is None else await self.credentials()
            opening = open_source(self.spec, created_at, group_id=f"keyshift-{self.job}-idle",
                                  environ=environ)  # fmt: skip
            try:
                self._source = await asyncio.wait_for(opening, SOURCE_OPEN_SECONDS)
            except TimeoutError:
                return None
            self._assigned = []
        if positions != self._assigned:
            for kg, position in enumerate(positions):
                if self._assigned:
                    self._source.unassign(kg)
                self._source.assign(kg, position)
            self._assigned = list(positions)
        return self._source

    async def close(self) -> None:
        """Close the source (the job woke: its workers read the input now)."""
        source, self._source, self._assigned = self._source, None, []
        self._last_end = None
        if source is not None:
            await source.close()
