"""Sources: where a worker's records come from, per key group and offset.

A source serves each key group as an ordered log: :meth:`Source.read_batch` returns the
records from a position on, with their offsets, and the position after them.  The
runtime commits that position with the state, so a key group resumes where its
last commit left it, on any worker.  Two sources exist: the deterministic
:mod:`generator <keyshift.runtime.sources.generator>` and :mod:`Kafka
<keyshift.runtime.sources.kafka>` (one key group per partition).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from keyshift.api.spec import GeneratorSource, StreamJobSpec


class Event(msgspec.Struct, frozen=True, gc=False):
    """A generated record: a key and a small positive integer (the generator's
    records, and the examples' records on Kafka, as JSON).

    Defined here rather than in :mod:`~keyshift.runtime.sources.generator`, which is
    compiled with mypyc in a wheel (``hatch_build.py``): mypyc drops a class's
    keywords, and an ``Event`` compiled there would be neither frozen nor hashable.
    """

    key: str
    value: int


@dataclass(frozen=True, slots=True)
class Poison:
    """A record that cannot be given to the job: undecodable, rejected by the job's
    decoder, or over the size limit.  What happens to it is the source's
    ``onPoison`` policy (``fail``, ``skip`` or ``dead-letter``)."""

    key_group: int
    offset: int
    error: str
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class SourceBatch:
    """Records of one key group, in order, and where reading goes on after them."""

    records: Sequence[Any]
    """The records; a :class:`Poison` stands in for one that could not be decoded."""
    offsets: Sequence[int] | None
    """Each record's offset; ``None``: consecutive from the position read at."""
    timestamps: Sequence[int] | None
    """Each record's event time from the source (unix ms), if it has one."""
    next_position: int
    """The position after the batch (the last offset + 1)."""
    has_poison: bool = False


class Source(Protocol):
    """What a key group's runner reads through.  Every method is non-blocking."""

    def available(self, kg: int, now: float) -> int:
        """Records before this position can be read now."""
        ...

    def end_offset(self, kg: int, now: float) -> int:
        """The end of the key group's log as far as known (for lag): ``>= available``."""
        ...

    def exhausted(self, kg: int, position: int) -> bool:
        """A bounded input ended at ``position``: nothing more will come."""
        ...

    def when_available(self, kg: int, offset: int, now: float) -> float:
        """A unix time at which ``offset`` may be readable (a hint for waiting)."""
        ...

    def read_batch(self, kg: int, start: int, stop: int) -> SourceBatch:
        """Records from ``start`` on, up to (not including) offset ``stop``."""
        ...

    def event_time(self, kg: int, offset: int) -> int:
        """The source's event time of a record (unix ms) when the batch has none."""
        ...

    def assign(self, kg: int, position: int, on_data: Callable[[], None] | None = None) -> None:
        """This worker now reads ``kg`` from ``position`` (after a claim).

        ``on_data``, if given, is called (from any thread) when records of ``kg`` arrive,
        so that an idle key group wakes at once instead of at its next
        :meth:`when_available`.  A source whose records exist by the clock (the
        generator) need not call it."""
        ...

    def unassign(self, kg: int) -> None:
        """This worker no longer reads ``kg`` (released, fenced or stopped)."""
        ...

    def problem(self) -> str | None:
        """Why the source cannot deliver records now (``None``: it can)."""
        ...

    def notice(self) -> str | None:
        """Something the user should know that does not stop the source."""
        ...

    async def close(self) -> None: ...


async def open_source(
    spec: StreamJobSpec,
    created_at: float,
    *,
    group_id: str,
    decode: Callable[[bytes], Any] | None = None,
    on_open: Callable[[Source], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Source:
    """The job's source: the generator (``created_at``: when the job's clock started), or
    the Kafka topic (waits for it, backing off while Kafka is unreachable; ``on_open`` sees
    the source before it waits, so that its ``problem()`` can be reported meanwhile;
    ``environ``: where its ``KEYSHIFT_KAFKA_*`` credentials are, default the process's)."""
    if isinstance(spec.source, GeneratorSource):
        from keyshift.runtime.sources.generator import Generator  # it imports this module

        return Generator(spec.source, spec.key_groups, created_at)
    from keyshift.runtime.kafka.source import KafkaRecordSource  # confluent-kafka only when used

    source = KafkaRecordSource(
        spec.source, spec.key_groups, group_id=group_id, decode=decode, environ=environ
    )
    if on_open is not None:
        on_open(source)
    await source.open()
    return source
