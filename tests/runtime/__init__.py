"""The runtime's tests; :func:`running_worker` is the in-process worker they share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from keyshift.runtime.api import Job
from keyshift.runtime.config import WorkerSettings
from keyshift.runtime.worker import Worker


@asynccontextmanager
async def running_worker(
    settings: WorkerSettings, job: Job[Any], store: Any, *, sink: Any = None
) -> AsyncIterator[Worker]:
    """A worker of ``job`` running in this event loop; stopped on exit, and failing the
    test if it does not stop within 30 s."""
    worker = Worker(settings, job, store, sink=sink)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        async with asyncio.timeout(30):
            await task
