"""The part of the state store a worker uses, and an in-process implementation.

:class:`WorkerStore` is the subset of :class:`keyshift.store.StateStore` the
runtime calls; :class:`MemoryStore` implements it with dicts and the same
fencing rules, for benchmarks (the in-process ceiling) and fast unit tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from keyshift.store.protocol import (
    Assignment,
    Claim,
    CommitResult,
    JobInfo,
    KeyGroupInfo,
    StaleClaim,
    StaleGeneration,
    Timer,
    TimerChanges,
    fence_violation,
)


class WorkerStore(Protocol):
    async def ping(self) -> None: ...
    async def close(self) -> None: ...
    async def eviction_policy(self) -> str | None: ...
    async def init_job(self, job: str, key_groups: int) -> JobInfo: ...
    async def claim(
        self, job: str, key_group: int, owner: str, *, generation: int = 0
    ) -> Claim: ...
    async def commit(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        seq: int,
        puts: Mapping[str, Mapping[bytes, bytes]] | None = None,
        deletes: Mapping[str, Collection[bytes]] | None = None,
        position: int,
        watermark: int | None = None,
        timers: Mapping[str, TimerChanges] | None = None,
        entry_states: Collection[str] = (),
    ) -> CommitResult: ...
    async def check_fence(
        self, job: str, key_group: int, *, epoch: int, token: str, seq: int
    ) -> None: ...
    async def release(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        generation: int,
        seq: int = -1,
        marks: Mapping[str, float] | None = None,
    ) -> int: ...
    def watch_release(self, job: str, key_group: int) -> AsyncIterator[None]: ...
    async def record_handoff(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        marks: Mapping[str, float],
        via: str = "",
    ) -> bool: ...
    async def key_group_info(self, job: str, key_group: int) -> KeyGroupInfo: ...
    async def get_many(
        self, job: str, key_group: int, state_name: str, keys: Collection[bytes]
    ) -> dict[bytes, bytes]: ...
    async def entries(
        self,
        job: str,
        key_group: int,
        state_name: str,
        prefix: bytes,
        *,
        after: bytes | None = None,
        count: int = 1000,
    ) -> list[tuple[bytes, bytes]]: ...
    async def due_timers(
        self, job: str, key_group: int, queue: str, until: int, *, limit: int = 1000
    ) -> list[Timer]: ...
    async def get_assignment(self, job: str) -> Assignment | None: ...
    def watch_assignment(
        self, job: str, *, poll_interval: float = 1.0
    ) -> AsyncIterator[Assignment]: ...
    async def ack_generation(self, job: str, worker: str, generation: int) -> None: ...
    async def mark_alive(self, job: str, worker: str) -> None: ...
    async def mark_stopped(self, job: str, worker: str) -> None: ...


async def read_entries(
    store: WorkerStore, job: str, key_group: int, state: str, key: bytes
) -> list[tuple[bytes, bytes]]:
    """Every committed entry of ``key`` (encoded) in the map or list ``state``, as
    ``(entry key, value)`` pairs in byte order (a list's: in its order)."""
    found: list[tuple[bytes, bytes]] = []
    after: bytes | None = None
    while page := await store.entries(job, key_group, state, key, after=after):
        found += [(k[len(key) :], v) for k, v in page]
        after = page[-1][0]
    return found


@dataclass
class _KeyGroup:
    epoch: int = 0
    token: str = ""
    owner: str = ""
    seq: int = 0
    position: int = 0
    claimed_generation: int = 0
    released_generation: int = 0
    watermark: int | None = None
    claimed_at: float | None = None
    released_at: float | None = None
    release_marks: dict[str, float] = field(default_factory=dict)
    claim_marks: dict[str, float] = field(default_factory=dict)
    claim_via: str = ""
    states: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    entry_states: set[str] = field(default_factory=set)
    timers: dict[str, dict[bytes, int]] = field(default_factory=dict)


class MemoryStore:
    """An in-process :class:`WorkerStore` (no persistence, one process)."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobInfo] = {}
        self._groups: dict[tuple[str, int], _KeyGroup] = {}
        self._assignments: dict[str, Assignment] = {}
        self._changed = asyncio.Condition()
        self._release_watchers: dict[tuple[str, int], set[asyncio.Queue[None]]] = {}
        self.acks: dict[str, dict[str, int]] = {}
        self.alive: dict[str, dict[str, float]] = {}

    def _kg(self, job: str, key_group: int) -> _KeyGroup:
        found = self._groups.get((job, key_group))
        if found is None:
            found = self._groups[(job, key_group)] = _KeyGroup()
        return found

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def eviction_policy(self) -> str | None:
        return "noeviction"  # nothing is ever evicted from a dict

    async def init_job(self, job: str, key_groups: int) -> JobInfo:
        if job not in self._jobs:
            self._jobs[job] = JobInfo(job=job, key_groups=key_groups, created_at=time.time())
        return self._jobs[job]

    async def claim(self, job: str, key_group: int, owner: str, *, generation: int = 0) -> Claim:
        kg = self._kg(job, key_group)
        latest = max(kg.claimed_generation, kg.released_generation)
        if generation < latest:
            raise StaleClaim(job, key_group, generation, latest)
        kg.epoch += 1
        kg.token = secrets.token_hex(16)
        kg.owner = owner
        kg.claimed_generation = generation
        kg.claimed_at = time.time()
        kg.claim_marks = {}
        kg.claim_via = ""
        return Claim(
            job, key_group, owner, kg.epoch, kg.token, kg.seq, kg.position, kg.watermark,
            states=frozenset(kg.states), entry_states=frozenset(kg.entry_states),
        )  # fmt: skip

    def _fence(self, job: str, key_group: int, epoch: int, token: str, seq: int) -> None:
        kg = self._kg(job, key_group)
        fenced = fence_violation(
            job, key_group, epoch=epoch, token=token, seq=seq,
            stored_epoch=kg.epoch, stored_token=kg.token, stored_seq=kg.seq,
        )  # fmt: skip
        if fenced is not None:
            raise fenced

    async def commit(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        seq: int,
        puts: Mapping[str, Mapping[bytes, bytes]] | None = None,
        deletes: Mapping[str, Collection[bytes]] | None = None,
        position: int,
        watermark: int | None = None,
        timers: Mapping[str, TimerChanges] | None = None,
        entry_states: Collection[str] = (),
    ) -> CommitResult:
        self._fence(job, key_group, epoch, token, seq)
        kg = self._kg(job, key_group)
        kg.entry_states.update(n for n in entry_states if n in (puts or {}) or n in (deletes or {}))
        for name, entries in (puts or {}).items():
            kg.states.setdefault(name, {}).update(entries)
        for name, keys in (deletes or {}).items():
            state = kg.states.setdefault(name, {})
            for key in keys:
                state.pop(key, None)
        for queue, change in (timers or {}).items():
            stored = kg.timers.setdefault(queue, {})
            stored.update({t.payload: t.time for t in change.add})
            for member in change.remove:
                stored.pop(member, None)
        kg.seq += 1
        kg.position = position
        if watermark is not None:
            kg.watermark = watermark
        return CommitResult(seq=kg.seq)

    async def check_fence(
        self, job: str, key_group: int, *, epoch: int, token: str, seq: int
    ) -> None:
        self._fence(job, key_group, epoch, token, seq)

    async def release(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        generation: int,
        seq: int = -1,
        marks: Mapping[str, float] | None = None,
    ) -> int:
        self._fence(job, key_group, epoch, token, -1)
        kg = self._kg(job, key_group)
        kg.token = ""
        kg.owner = ""
        kg.released_generation = generation
        kg.released_at = time.time()
        kg.release_marks = dict(marks or {})
        for queue in self._release_watchers.get((job, key_group), ()):
            queue.put_nowait(None)
        return kg.seq

    async def watch_release(self, job: str, key_group: int) -> AsyncIterator[None]:
        queue: asyncio.Queue[None] = asyncio.Queue()
        watchers = self._release_watchers.setdefault((job, key_group), set())
        watchers.add(queue)
        try:
            yield  # subscribed
            while True:
                await queue.get()
                yield
        finally:
            watchers.discard(queue)

    async def record_handoff(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        marks: Mapping[str, float],
        via: str = "",
    ) -> bool:
        kg = self._kg(job, key_group)
        if kg.epoch != epoch or kg.token != token:
            return False
        kg.claim_marks.update(marks)
        if via:
            kg.claim_via = via
        return True

    async def key_group_info(self, job: str, key_group: int) -> KeyGroupInfo:
        kg = self._kg(job, key_group)
        return KeyGroupInfo(
            job=job,
            key_group=key_group,
            epoch=kg.epoch,
            owner=kg.owner,
            seq=kg.seq,
            position=kg.position,
            watermark=kg.watermark,
            claimed_generation=kg.claimed_generation,
            released_generation=kg.released_generation,
            entries=sum(len(s) for s in kg.states.values()),
            timers=sum(len(t) for t in kg.timers.values()),
            claimed_at=kg.claimed_at,
            released_at=kg.released_at,
            release_marks=dict(kg.release_marks),
            claim_marks=dict(kg.claim_marks),
            claim_via=kg.claim_via,
        )

    async def get_many(
        self, job: str, key_group: int, state_name: str, keys: Collection[bytes]
    ) -> dict[bytes, bytes]:
        state = self._kg(job, key_group).states.get(state_name, {})
        return {k: state[k] for k in keys if k in state}

    async def entries(
        self,
        job: str,
        key_group: int,
        state_name: str,
        prefix: bytes,
        *,
        after: bytes | None = None,
        count: int = 1000,
    ) -> list[tuple[bytes, bytes]]:
        """As the Redis backend's, but by a scan of the whole state (a dict keeps no
        order): for tests and benchmarks, not for large states."""
        state = self._kg(job, key_group).states.get(state_name, {})
        low = prefix if after is None else max(after, prefix)
        found = sorted(k for k in state if k.startswith(prefix) and k > low)[:count]
        return [(k, state[k]) for k in found]

    async def due_timers(
        self, job: str, key_group: int, queue: str, until: int, *, limit: int = 1000
    ) -> list[Timer]:
        stored = self._kg(job, key_group).timers.get(queue, {})
        found = sorted((t, m) for m, t in stored.items() if t <= until)[:limit]
        return [Timer(time=t, payload=m) for t, m in found]

    def state(self, job: str, key_group: int, state_name: str) -> dict[bytes, bytes]:
        return dict(self._kg(job, key_group).states.get(state_name, {}))

    def snapshot(self, job: str, key_group: int) -> _KeyGroup:
        """A copy of a key group, to :meth:`restore` later (a store losing writes)."""
        kg = self._kg(job, key_group)
        return replace(
            kg,
            states={name: dict(s) for name, s in kg.states.items()},
            entry_states=set(kg.entry_states),
            timers={name: dict(t) for name, t in kg.timers.items()},
        )

    def restore(self, job: str, key_group: int, snapshot: _KeyGroup) -> None:
        self._groups[(job, key_group)] = replace(
            snapshot,
            states={name: dict(s) for name, s in snapshot.states.items()},
            entry_states=set(snapshot.entry_states),
            timers={name: dict(t) for name, t in snapshot.timers.items()},
        )

    async def publish_assignment(
        self, job: str, assignment: Assignment, *, expected_generation: int
    ) -> None:
        current = self._assignments.get(job)
        stored = 0 if current is None else current.generation
        if stored != expected_generation:
            raise StaleGeneration(job, expected_generation, stored)
        self._assignments[job] = assignment
        async with self._changed:
            self._changed.notify_all()

    async def get_assignment(self, job: str) -> Assignment | None:
        return self._assignments.get(job)

    async def watch_assignment(
        self, job: str, *, poll_interval: float = 1.0
    ) -> AsyncIterator[Assignment]:
        last = 0
        while True:
            current = self._assignments.get(job)
            if current is not None and current.generation > last:
                last = current.generation
                yield current
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_interval), self._changed:
                    await self._changed.wait()

    async def ack_generation(self, job: str, worker: str, generation: int) -> None:
        self.acks.setdefault(job, {})[worker] = generation

    async def mark_alive(self, job: str, worker: str) -> None:
        self.alive.setdefault(job, {})[worker] = time.time()

    async def mark_stopped(self, job: str, worker: str) -> None:
        self.alive.get(job, {}).pop(worker, None)
