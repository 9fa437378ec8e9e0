"""The part of the state store a worker uses.

:class:`WorkerStore` is the subset of :class:`keyshift.store.StateStore` the
runtime calls (every backend implements it: ``RedisStateStore``, and the
in-process ``MemoryStore`` of benchmarks and fast tests); :func:`read_entries`
reads one key's entries from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping
from typing import Protocol

from keyshift.store.protocol import (
    Assignment,
    Claim,
    CommitResult,
    JobInfo,
    KeyGroupInfo,
    Released,
    ScanPage,
    Timer,
    TimerChanges,
)


class WorkerStore(Protocol):
    async def ping(self) -> None: ...
    async def close(self) -> None: ...
    async def warm(self, connections: int) -> None: ...
    async def eviction_policy(self) -> str | None: ...
    async def init_job(self, job: str, key_groups: int) -> JobInfo: ...
    async def claim(
        self,
        job: str,
        key_group: int,
        owner: str,
        *,
        generation: int = 0,
        if_released: bool = False,
        token: str | None = None,
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
        release_generation: int | None = None,
        release_marks: Mapping[str, float] | None = None,
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
    def watch_releases(self, job: str) -> AsyncIterator[Released | None]: ...
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
    async def get_states(
        self, job: str, key_group: int, wanted: Mapping[str, Collection[bytes]]
    ) -> dict[str, dict[bytes, bytes]]: ...
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
    async def scan(
        self,
        job: str,
        key_group: int,
        state_name: str,
        prefix: bytes = b"",
        *,
        cursor: int = 0,
        count: int = 256,
    ) -> ScanPage: ...
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
