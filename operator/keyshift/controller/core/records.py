"""The controller's persistent record: the rescale in progress and the history.

The operator keeps it in the StreamJob's status; ``keyshift run`` in a JSON
file of its run directory (:class:`FileRecordStore`), which ``keyshift status``
reads from another terminal.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import msgspec

from keyshift.controller.core.handoffs import DETAIL_LIMIT
from keyshift.controller.core.rescale import Rescale

HISTORY_LIMIT = 50


class ControllerRecord(msgspec.Struct, kw_only=True):
    job: str
    current: Rescale | None = None
    """The rescale in progress, or None."""
    history: list[Rescale] = msgspec.field(default_factory=list)
    """Finished rescales, newest last, at most ``HISTORY_LIMIT``."""

    def finish(self, rescale: Rescale) -> None:
        self.history = [*self.history, rescale][-HISTORY_LIMIT:]
        self.current = None
        for older in self.history[:-DETAIL_LIMIT]:  # the per-step summary stays
            if older.handoff is not None and older.handoff.key_groups:
                older.handoff.key_groups = []


class RecordStore(Protocol):
    def load(self) -> ControllerRecord: ...
    async def save(self, record: ControllerRecord) -> None:
        """Persist ``record`` before returning (the executor's progress depends on it)."""
        ...


class FileRecordStore:
    """A record in a JSON file, replaced atomically on every save."""

    def __init__(self, path: Path, job: str) -> None:
        self.path = path
        self.job = job

    def load(self) -> ControllerRecord:
        if not self.path.exists():
            return ControllerRecord(job=self.job)
        return msgspec.json.decode(self.path.read_bytes(), type=ControllerRecord)

    async def save(self, record: ControllerRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.format(msgspec.json.encode(record)))
        os.replace(tmp, self.path)
