"""Event time: per-key-group watermarks and keyed timers, committed with the state.

Times are integer milliseconds (unix epoch).  A key group's :class:`Watermark` is
the largest event time seen minus ``outOfOrderness``; after ``idleTimeout`` of
processing time without records it follows processing time (``now - idleTimeout -
outOfOrderness``); at the end of a bounded input it jumps to :data:`END_OF_TIME`.
It never goes back.  The runner commits an idle advance before anything depends on it
(the wall clock is not replayed; records and the end of the input are).

A :class:`TimerTable` holds the timers of one key group, in two queues
(:data:`EVENT_TIME`, :data:`PROCESSING_TIME`).  A timer is identified by
``(key, time)``: registering it twice keeps one (the last payload wins).  Its
stored member is ``msgpack([key_bytes, time, payload])``; the table collects the
additions and removals since the last commit, which go into the same atomic commit
as the state, the input position and the watermark.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from keyshift.store.protocol import Timer, TimerChanges

EVENT_TIME: Literal["event"] = "event"
PROCESSING_TIME: Literal["processing"] = "processing"
QUEUES: tuple[str, str] = (EVENT_TIME, PROCESSING_TIME)
END_OF_TIME = 2**62
"""The watermark of a key group whose bounded input ended: every event-time timer is due."""

_encoder = msgspec.msgpack.Encoder()
_member_decoder = msgspec.msgpack.Decoder(tuple[bytes, int, Any])


class Watermark:
    """The event-time clock of one key group (pure: the caller passes the clocks)."""

    __slots__ = ("_idle_ms", "_last_record", "_ooo_ms", "max_seen", "value")

    def __init__(
        self, *, out_of_orderness: float = 0.0, idle_timeout: float = 10.0, value: int | None = None
    ) -> None:
        self._ooo_ms = round(out_of_orderness * 1000)
        self._idle_ms = round(idle_timeout * 1000)
        self.value: int | None = value
        """The watermark (milliseconds), ``None`` until the first record."""
        self.max_seen: int | None = None
        self._last_record: float | None = None

    def _advance(self, to: int) -> bool:
        if self.value is None or to > self.value:
            self.value = to
            return True
        return False

    def observe(self, event_time: int, now: float) -> bool:
        """A record with ``event_time`` at processing time ``now`` (seconds); True if advanced."""
        self._last_record = now
        if self.max_seen is None or event_time > self.max_seen:
            self.max_seen = event_time
        return self._advance(event_time - self._ooo_ms)

    def idle(self, now: float) -> bool:
        """No record is available at ``now`` (unix seconds): advance if idle long enough."""
        if self._last_record is None:
            self._last_record = now
            return False
        if (now - self._last_record) * 1000 < self._idle_ms:
            return False
        return self._advance(int(now * 1000) - self._idle_ms - self._ooo_ms)

    def end(self) -> bool:
        """The bounded input ended: everything is due."""
        return self._advance(END_OF_TIME)

    def is_late(self, event_time: int) -> bool:
        return self.value is not None and event_time <= self.value


@dataclass(frozen=True, slots=True)
class FiredTimer:
    """What ``Job.on_timer`` receives; ``ctx.key`` is the timer's key."""

    domain: Literal["event", "processing"]
    time: int
    key: Any
    payload: Any
    member: bytes


def timer_member(key_bytes: bytes, time: int, payload: Any) -> bytes:
    return _encoder.encode((key_bytes, time, payload))


class TimerTable:
    """The timers of one key group: an index, due-order heaps and uncommitted changes."""

    def __init__(self) -> None:
        self._index: dict[str, dict[tuple[bytes, int], bytes]] = {q: {} for q in QUEUES}
        self._heaps: dict[str, list[tuple[int, bytes, bytes]]] = {q: [] for q in QUEUES}
        self._adds: dict[str, dict[bytes, Timer]] = {q: {} for q in QUEUES}
        self._removes: dict[str, set[bytes]] = {q: set() for q in QUEUES}

    def load(self, queue: str, timers: Iterable[Timer]) -> None:
        """Timers read from the store (committed): no change to commit."""
        for t in timers:
            key_bytes, time, _ = _member_decoder.decode(t.payload)
            self._index[queue][(key_bytes, time)] = t.payload
            heapq.heappush(self._heaps[queue], (time, key_bytes, t.payload))

    def __len__(self) -> int:
        return sum(len(i) for i in self._index.values())

    def register(self, queue: str, key_bytes: bytes, time: int, payload: Any = None) -> None:
        member = timer_member(key_bytes, time, payload)
        index = self._index[queue]
        old = index.get((key_bytes, time))
        if old == member:
            return
        if old is not None:
            self._remove_member(queue, old)
        index[(key_bytes, time)] = member
        heapq.heappush(self._heaps[queue], (time, key_bytes, member))
        self._removes[queue].discard(member)
        self._adds[queue][member] = Timer(time=time, payload=member)

    def delete(self, queue: str, key_bytes: bytes, time: int) -> None:
        member = self._index[queue].pop((key_bytes, time), None)
        if member is not None:
            self._remove_member(queue, member)

    def _remove_member(self, queue: str, member: bytes) -> None:
        # the heap entry stays; it is skipped as stale when it comes up.  The removal is
        # always committed: the member may be in the store even if it was also added
        # since the last commit (delete, register, delete); removing one that is not
        # stored is a no-op there.
        self._adds[queue].pop(member, None)
        self._removes[queue].add(member)

    def _live(self, queue: str, entry: tuple[int, bytes, bytes]) -> bool:
        time, key_bytes, member = entry
        return self._index[queue].get((key_bytes, time)) == member

    def next_time(self, queue: str) -> int | None:
        heap = self._heaps[queue]
        while heap and not self._live(queue, heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def peek_due(self, queue: str, until: int, limit: int) -> list[tuple[int, bytes, bytes]]:
        """Up to ``limit`` live timers with ``time <= until``, in (time, key) order."""
        heap = self._heaps[queue]
        while heap and not self._live(queue, heap[0]):
            heapq.heappop(heap)
        out: list[tuple[int, bytes, bytes]] = []
        seen: set[bytes] = set()
        for entry in heapq.nsmallest(limit * 2 + 16, heap):
            if entry[0] > until or len(out) >= limit:
                break
            if entry[2] not in seen and self._live(queue, entry):
                seen.add(entry[2])
                out.append(entry)
        return out

    def pop_fired(self, queue: str, key_bytes: bytes, time: int, member: bytes) -> None:
        """The timer fired (its effects applied): remove it, to be committed."""
        if self._index[queue].get((key_bytes, time)) == member:
            del self._index[queue][(key_bytes, time)]
            self._remove_member(queue, member)

    def changes(self) -> dict[str, TimerChanges]:
        out: dict[str, TimerChanges] = {}
        for q in QUEUES:
            adds, removes = self._adds[q], self._removes[q]
            if adds or removes:
                out[q] = TimerChanges(add=list(adds.values()), remove=sorted(removes))
        return out

    def has_changes(self) -> bool:
        return any(self._adds[q] or self._removes[q] for q in QUEUES)

    def committed(self) -> None:
        for q in QUEUES:
            self._adds[q] = {}
            self._removes[q] = set()


def decode_member(member: bytes) -> tuple[bytes, int, Any]:
    key_bytes, time, payload = _member_decoder.decode(member)
    return key_bytes, time, payload


class TimerService:
    """``ctx.timers``: registrations of the current record (applied if it succeeds)."""

    __slots__ = ("ops",)

    def __init__(self) -> None:
        self.ops: list[tuple[str, str, int, Any]] = []

    def register_event_time(self, time: int, payload: Any = None) -> None:
        self.ops.append(("add", EVENT_TIME, int(time), payload))

    def register_processing_time(self, time: int, payload: Any = None) -> None:
        self.ops.append(("add", PROCESSING_TIME, int(time), payload))

    def delete_event_time(self, time: int) -> None:
        self.ops.append(("delete", EVENT_TIME, int(time), None))

    def delete_processing_time(self, time: int) -> None:
        self.ops.append(("delete", PROCESSING_TIME, int(time), None))

    def apply(self, table: TimerTable, key_bytes: bytes) -> None:
        for op, queue, time, payload in self.ops:
            if op == "add":
                table.register(queue, key_bytes, time, payload)
            else:
                table.delete(queue, key_bytes, time)
