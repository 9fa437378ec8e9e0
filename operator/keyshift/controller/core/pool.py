"""The WorkerPool interface: where workers run.

Two implementations share the controller: ``LocalWorkerPool`` (processes on
this machine, for ``keyshift run``) and the Kubernetes StatefulSet pool of the
operator. A pool starts and stops workers by ordinal and reports what runs.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    ordinal: int
    name: str
    running: bool
    """The process (pod) exists and has not exited."""
    ready: bool
    """It answers its readiness probe: connected to the store, running the current generation."""
    not_ready_since: float | None
    """Unix time it was last seen ready, if it is not ready now (None if ready)."""
    metrics_url: str | None = None
    pid: int | None = None
    detail: str = ""
    """Why it is not ready, when known."""


class WorkerPool(Protocol):
    async def start(self, ordinals: Collection[int]) -> None:
        """Start these workers (no-op for those already running)."""
        ...

    async def stop(self, ordinals: Collection[int]) -> None:
        """Stop these workers gracefully (they commit before exiting) and forget them."""
        ...

    async def workers(self) -> dict[int, WorkerInfo]:
        """The workers this pool runs (or restarts), with their readiness now."""
        ...

    async def close(self) -> None: ...
