"""Sinks: where outputs go.  Every output carries its origin ``(key_group, offset)``.

Outputs are buffered and written by :meth:`Sink.flush`, which the runtime
calls before it commits the state of the records that produced them: an
output is never lost, and after a crash it may be written again (a consumer
deduplicates by origin).
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any, Protocol

import msgspec

from keyshift.runtime.config import LogSink, NullSink


class Output(msgspec.Struct, frozen=True, gc=False):
    key_group: int
    offset: int
    value: Any


class Sink(Protocol):
    def emit(self, key_group: int, offset: int, value: Any) -> None: ...
    async def flush(self) -> None: ...
    async def close(self) -> None: ...


class NullSinkWriter:
    """Counts outputs and discards them."""

    def __init__(self) -> None:
        self.emitted = 0

    def emit(self, key_group: int, offset: int, value: Any) -> None:
        self.emitted += 1

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        return None


class LogSinkWriter:
    """JSON lines ``{"key_group": .., "offset": .., "value": ..}`` to a file or stdout."""

    def __init__(self, path: str | None, *, fsync: bool = False) -> None:
        self._encoder = msgspec.json.Encoder()
        self._buffer = bytearray()
        self._fsync = fsync
        self._file: IO[bytes] = open(path, "ab") if path else sys.stdout.buffer  # noqa: SIM115
        self._owned = path is not None
        self.emitted = 0

    def emit(self, key_group: int, offset: int, value: Any) -> None:
        self._buffer += self._encoder.encode(Output(key_group, offset, value))
        self._buffer += b"\n"
        self.emitted += 1

    async def flush(self) -> None:
        if not self._buffer:
            return
        self._file.write(self._buffer)
        self._file.flush()
        if self._fsync and self._owned:
            os.fsync(self._file.fileno())
        self._buffer.clear()

    async def close(self) -> None:
        await self.flush()
        if self._owned:
            self._file.close()


def open_sink(spec: LogSink | NullSink) -> Sink:
    if isinstance(spec, LogSink):
        return LogSinkWriter(spec.path, fsync=spec.fsync)
    return NullSinkWriter()
