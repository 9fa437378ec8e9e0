"""Fixtures of the runtime tests: worker processes stopped by PID when a test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import WorkerProcess


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes; all are stopped (by PID) when the test ends."""
    started: list[WorkerProcess] = []

    def make(manifest: Path, ordinal: int, store_url: str, **kwargs: Any) -> WorkerProcess:
        worker = WorkerProcess(manifest, ordinal, store_url, tmp_path, **kwargs).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()
