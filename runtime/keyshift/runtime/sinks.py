"""Sinks: where outputs go.  Every output carries its :class:`Origin`, an identity
that a replay reproduces.

Outputs are buffered and written by :meth:`Sink.flush`, which the runtime
calls before it commits the state of the records that produced them: an
output is never lost, and after a crash it may be written again, with the same
origin (a consumer deduplicates by origin).  :class:`Outputs` routes a worker's outputs: to the
sink, to named side outputs (``ctx.emit(value, output=name)``), and poison
records to the dead-letter topic.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Protocol

import msgspec

from keyshift.api.spec import KafkaSink, LogSink, NullSink
from keyshift.errors import KeyshiftError
from keyshift.runtime.sources import Poison


class SinkUnavailable(KeyshiftError):
    """Outputs could not be delivered yet (the state is not committed: retried)."""


class OutputsLost(KeyshiftError):
    """The sink gave up on outputs of a key group: it must replay from its last commit."""


class TimerOrigin(msgspec.Struct, frozen=True, gc=False):
    """The timer whose ``on_timer`` emitted an output: ``domain`` (``event`` or
    ``processing``), ``time`` (ms) and the timer's key (a key group holds at most one
    timer per domain, key and time)."""

    domain: str
    time: int
    key: Any


class Origin(msgspec.Struct, frozen=True, gc=False):
    """The identity of one output, equal for the same output written again by a replay.

    A record's output: ``(key_group, offset, index)``, ``offset`` the record's offset and
    ``index`` the output's number among those of the record (side outputs included).  A
    timer's output: also ``timer``, and ``offset`` is the key group's position when the
    timer fired (the offset of the next record): ``(key_group, offset, timer, index)``.
    """

    key_group: int
    offset: int
    index: int = 0
    timer: TimerOrigin | None = None


class Output(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A log sink line: the origin's fields, then the value (``timer`` only on timer
    outputs)."""

    key_group: int
    offset: int
    index: int
    value: Any
    timer: TimerOrigin | None = None


class Sink(Protocol):
    def emit(self, origin: Origin, value: Any, key: Any = None) -> None:
        """Buffer one output identified by ``origin``, whose key is ``key``."""
        ...

    async def flush(self, key_group: int) -> None:
        """Deliver at least everything ``key_group`` emitted, or raise
        (:class:`SinkUnavailable`: retry)."""
        ...

    def lost(self, key_group: int) -> bool:
        """Whether outputs of ``key_group`` failed for good since it last asked."""
        ...

    async def close(self) -> None: ...


class NullSinkWriter:
    """Counts outputs and discards them."""

    def __init__(self) -> None:
        self.emitted = 0

    def emit(self, origin: Origin, value: Any, key: Any = None) -> None:
        self.emitted += 1

    async def flush(self, key_group: int) -> None:
        return None

    def lost(self, key_group: int) -> bool:
        return False

    async def close(self) -> None:
        return None


class LogSinkWriter:
    """JSON lines ``{"key_group": .., "offset": .., "index": .., "value": ..}`` (and
    ``"timer": {"domain": .., "time": .., "key": ..}`` on a timer's outputs) to a file or
    stdout."""

    def __init__(self, path: str | None, *, fsync: bool = False) -> None:
        self._encoder = msgspec.json.Encoder()
        self._buffer = bytearray()
        self._fsync = fsync
        self._file: IO[bytes] = open(path, "ab") if path else sys.stdout.buffer  # noqa: SIM115
        self._owned = path is not None
        self.emitted = 0

    def emit(self, origin: Origin, value: Any, key: Any = None) -> None:
        line = Output(origin.key_group, origin.offset, origin.index, value, origin.timer)
        self._buffer += self._encoder.encode(line)
        self._buffer += b"\n"
        self.emitted += 1

    async def flush(self, key_group: int = 0) -> None:
        if not self._buffer:
            return
        self._file.write(self._buffer)
        self._file.flush()
        if self._fsync and self._owned:
            os.fsync(self._file.fileno())
        self._buffer.clear()

    def lost(self, key_group: int) -> bool:
        return False

    async def close(self) -> None:
        await self.flush()
        if self._owned:
            self._file.close()


def open_sink(spec: LogSink | NullSink | KafkaSink, output_dir: str | None = None) -> Sink:
    """The sink's writer; a log sink's path starts in ``output_dir`` (the config keeps it
    inside: relative, without ``..``)."""
    if isinstance(spec, LogSink):
        path = os.path.join(output_dir, spec.path) if output_dir and spec.path else spec.path
        return LogSinkWriter(path, fsync=spec.fsync)
    if isinstance(spec, KafkaSink):
        from keyshift.runtime.kafka.sink import KafkaSinkWriter  # confluent-kafka only when used

        return KafkaSinkWriter(spec)
    return NullSinkWriter()


class DeadLetters(Protocol):
    """Where poison records go (``onPoison: dead-letter``): their bytes and the error."""

    def send(self, poison: Poison) -> None: ...
    async def flush(self, key_group: int) -> None: ...
    def lost(self, key_group: int) -> bool: ...
    async def close(self) -> None: ...


class Outputs:
    """A worker's outputs: the sink, the named side outputs and the dead letters.

    A side output without a configured sink is only counted (``count_side``).
    """

    def __init__(
        self,
        sink: Sink,
        side: Mapping[str, Sink] | None = None,
        dead_letters: DeadLetters | None = None,
        count_side: Callable[[str, int], None] | None = None,
    ) -> None:
        self.sink = sink
        self.side = dict(side or {})
        self.dead_letters = dead_letters
        self._count_side = count_side

    def emit_all(
        self,
        key_group: int,
        offset: int,
        key: Any,
        outputs: Sequence[tuple[str | None, Any]],
        timer: TimerOrigin | None = None,
    ) -> None:
        """The outputs of one record (or of the timer ``timer``): ``(side output name or
        None, value)``, numbered in order (the ``index`` of their :class:`Origin`)."""
        for index, (name, value) in enumerate(outputs):
            if name is None:
                self.sink.emit(Origin(key_group, offset, index, timer), value, key)
                continue
            if self._count_side is not None:
                self._count_side(name, 1)
            side = self.side.get(name)
            if side is not None:
                side.emit(Origin(key_group, offset, index, timer), value, key)

    def dead_letter(self, poison: Poison) -> None:
        if self.dead_letters is None:
            raise RuntimeError("onPoison dead-letter without a dead-letter topic")
        self.dead_letters.send(poison)

    async def flush(self, key_group: int) -> None:
        """Deliver every buffered output before a commit of ``key_group``; raise
        :class:`OutputsLost` if some of its outputs failed for good."""
        sinks: list[Sink | DeadLetters] = [self.sink, *self.side.values()]
        if self.dead_letters is not None:
            sinks.append(self.dead_letters)
        for sink in sinks:
            await sink.flush(key_group)
        if any([sink.lost(key_group) for sink in sinks]):  # a list: ask every sink
            raise OutputsLost(f"outputs of key group {key_group} were not delivered")

    async def close(self) -> None:
        await self.sink.close()
        for side in self.side.values():
            await side.close()
        if self.dead_letters is not None:
            await self.dead_letters.close()
