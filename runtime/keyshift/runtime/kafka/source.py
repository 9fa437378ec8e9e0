"""The Kafka source (:class:`KafkaRecordSource`): one key group per partition.  A worker has
one consumer with *manual* assignment: when it claims key group ``kg`` it
assigns partition ``kg`` at the position committed with the state; Kafka's
consumer-group offsets are never used.  One thread owns the consumer (a
consumer's calls block each other across threads): it carries out assignment
changes and polls records into a buffer per partition (paused when full); the
key group's runner reads the buffer without blocking, and is woken by the poll thread
when records arrive for it (an idle key group does not poll its buffer).  Lag comes
from the fetch high-water mark (``get_watermark_offsets(cached=True)``).  Values are
decoded by the job's ``decode`` or the source's ``format``; a record that cannot be
decoded, or is larger than ``maxRecordBytes``, becomes a
:class:`~keyshift.runtime.sources.Poison`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast, overload

import msgspec
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from keyshift.api.spec import KafkaSource
from keyshift.runtime.kafka.client import POLL_SECONDS, check_partitions, client_config
from keyshift.runtime.sources import Poison, SourceBatch

if TYPE_CHECKING:
    pass


log = logging.getLogger("keyshift.runtime.kafka")

DATA_WAIT_SECONDS = 1.0
"""How long an idle key group waits before looking at its buffer again, at most: records
arriving wake it at once (``on_data``)."""
PROBE_SECONDS = 2.0
"""How often a source with a connection problem checks whether the broker is back."""
PARTITIONS_CHECK_SECONDS = 30.0
"""How often the source checks whether the topic's partition count changed."""


def value_decoder(fmt: str) -> Callable[[bytes], Any]:
    if fmt == "json":
        return msgspec.json.decode
    if fmt == "msgpack":
        return msgspec.msgpack.decode
    if fmt == "string":
        return lambda raw: raw.decode("utf-8")
    return lambda raw: raw


def _metadata_problem(exc: KafkaException) -> str:
    """What a failed metadata request says: the broker is unreachable, or the topic is
    missing (the exception's argument is then our own message)."""
    cause = exc.args[0] if exc.args else None
    if isinstance(cause, str):
        return cause
    return f"Kafka unreachable: {cause.str() if isinstance(cause, KafkaError) else exc}"


def partition_change(topic: str, partitions: int, key_groups: int) -> str | None:
    """What to tell the user when a running job's topic no longer has ``key_groups``
    partitions (it keeps reading the ones it started with)."""
    if partitions == key_groups:
        return None
    return (
        f"topic {topic!r} now has {partitions} partitions; the job keeps reading the "
        f"{key_groups} it started with (the count is fixed for the life of the job)"
    )


class _Partition:
    """The buffer of one assigned partition (guarded by the source's lock)."""

    __slots__ = ("assigned_at", "high", "messages", "next_fetch", "on_data", "paused")

    def __init__(self, position: int, on_data: Callable[[], None] | None = None) -> None:
        self.assigned_at = position
        self.on_data = on_data
        """Called (from the poll thread) when records arrive: wakes the key group."""
        self.next_fetch = position
        self.messages: deque[tuple[int, Message]] = deque()
        """``(offset, message)`` in offset order."""
        self.paused = False
        self.high = -1
        """The partition's high-water mark at the last fetch (-1: not known yet)."""


class KafkaRecordSource:
    """The Kafka source of one worker (see the module docstring)."""

    def __init__(
        self,
        spec: KafkaSource,
        key_groups: int,
        *,
        group_id: str,
        decode: Callable[[bytes], Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.topic = spec.topic
        self.key_groups = key_groups
        self._decode = decode or value_decoder(spec.format)
        self._max_bytes = spec.max_record_bytes
        self._high = spec.fetch_max_records
        self._low = spec.fetch_max_records // 4
        config = client_config(spec, environ)
        config.update({
            "group.id": group_id,  # required by librdkafka; offsets are never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 100,
            "session.timeout.ms": 6000,
            "error_cb": self._on_error,
        })  # fmt: skip
        self._consumer = Consumer(config)
        self._lock = threading.Lock()
        self._partitions: dict[int, _Partition] = {}
        self._problem: str | None = "connecting to Kafka"
        self._last_probe = 0.0
        self._last_partitions_check = time.monotonic()
        self.partition_change: str | None = None
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        """Consumer calls for the poll thread (assign, unassign, resume)."""
        self._stop = threading.Event()
        # not named ``_thread``: compiled with mypyc, its C name would be ``__thread``
        self._poll_thread = threading.Thread(
            target=self._poll_loop, name="kafka-source", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------

    async def open(self, *, backoff_max: float = 30.0) -> None:
        """Wait for the topic (backing off while Kafka is unreachable), check its
        partition count, and start the poll thread."""
        delay = 0.5
        while True:
            try:
                partitions = await asyncio.to_thread(self._partition_count, 5.0)
                break
            except KafkaException as exc:
                self._problem = _metadata_problem(exc)
                log.warning("%s; retrying in %.1fs", self._problem, delay)
                await asyncio.sleep(delay)
                delay = min(backoff_max, delay * 2)
        check_partitions(self.topic, partitions, self.key_groups)
        self._problem = None
        self._poll_thread.start()

    def _partition_count(self, timeout: float) -> int:
        metadata = self._consumer.list_topics(self.topic, timeout=timeout)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            error = topic.error if topic is not None else "not found"
            raise KafkaException(f"Kafka topic {self.topic!r}: {error}")
        return len(topic.partitions)

    async def close(self) -> None:
        self._stop.set()
        if self._poll_thread.is_alive():
            await asyncio.to_thread(self._poll_thread.join, 5.0)
        await asyncio.to_thread(self._consumer.close)

    def _call(self, command: Callable[[], None]) -> None:
        """Run ``command`` on the consumer in the poll thread (or now, before it runs)."""
        if self._poll_thread.is_alive():
            self._commands.put(command)
        else:
            command()

    # -- the poll thread -------------------------------------------------------------

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self._problem = f"Kafka unreachable: {error.str()}"
        log.warning("Kafka consumer: %s", error.str())

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                while True:
                    self._commands.get_nowait()()
            except queue.Empty:
                pass
            except KafkaException as exc:
                log.error("Kafka consumer: %s", exc)
            try:
                messages = self._consumer.consume(1000, POLL_SECONDS)
            except (KafkaException, RuntimeError) as exc:
                self._problem = f"Kafka consumer: {exc}"
                self._stop.wait(1.0)
                continue
            if messages:
                self._buffer(messages)
            self._update_high_water_marks()
            self._check_health()

    def _update_high_water_marks(self) -> None:
        with self._lock:
            assigned = list(self._partitions)
        for kg in assigned:
            tp = TopicPartition(self.topic, kg)
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            with self._lock:
                part = self._partitions.get(kg)
                if part is not None and high >= 0:
                    part.high = high

    def _buffer(self, messages: list[Message]) -> None:
        """Append what one poll fetched to the partitions' buffers; wake the key groups
        whose records arrived and pause the partitions whose buffer is full."""
        received = False
        touched: dict[int, _Partition] = {}
        with self._lock:
            partitions = self._partitions
            number = -1
            part: _Partition | None = None
            for m in messages:
                if m.error() is not None:
                    log.warning("Kafka fetch: %s", m.error())
                    continue
                received = True
                partition = m.partition()
                offset = m.offset()
                if partition != number:  # a poll's messages come in runs of one partition
                    number = -1 if partition is None else partition
                    part = partitions.get(number)
                    if part is not None:
                        touched[number] = part
                if part is None or offset is None or offset < part.next_fetch:
                    continue  # unassigned meanwhile, or fetched before a re-assignment
                part.messages.append((offset, m))
                part.next_fetch = offset + 1
            to_pause: list[TopicPartition] = []
            for number, part in touched.items():
                if not part.paused and len(part.messages) >= self._high:
                    part.paused = True
                    to_pause.append(TopicPartition(self.topic, number))
            wake = [part.on_data for part in touched.values() if part.on_data is not None]
        if received:
            self._problem = None
        for on_data in wake:
            on_data()
        if to_pause:
            self._consumer.pause(to_pause)

    def _check_health(self) -> None:
        now = time.monotonic()
        probe = self._problem is not None and now - self._last_probe >= PROBE_SECONDS
        check = now - self._last_partitions_check >= PARTITIONS_CHECK_SECONDS
        if not (probe or check):
            return
        self._last_probe = now
        self._last_partitions_check = now
        try:
            partitions = self._partition_count(2.0)
        except KafkaException as exc:
            self._problem = _metadata_problem(exc)
            return
        self._problem = None
        notice = partition_change(self.topic, partitions, self.key_groups)
        if notice is not None and notice != self.partition_change:
            log.error("%s", notice)
        self.partition_change = notice

    # -- Source ------------------------------------------------------------------------

    def assign(self, kg: int, position: int, on_data: Callable[[], None] | None = None) -> None:
        with self._lock:
            self._partitions[kg] = _Partition(position, on_data)
        tp = TopicPartition(self.topic, kg, position)
        self._call(lambda: self._consumer.incremental_assign([tp]))

    def unassign(self, kg: int) -> None:
        with self._lock:
            if self._partitions.pop(kg, None) is None:
                return
        tp = TopicPartition(self.topic, kg)
        self._call(lambda: self._consumer.incremental_unassign([tp]))

    def problem(self) -> str | None:
        return self._problem

    def notice(self) -> str | None:
        return self.partition_change

    def available(self, kg: int, now: float) -> int:
        with self._lock:
            part = self._partitions.get(kg)
            if part is None:
                return 0
            if part.messages:
                return part.messages[-1][0] + 1
            return part.assigned_at

    def end_offset(self, kg: int, now: float) -> int:
        with self._lock:
            part = self._partitions.get(kg)
            high = -1 if part is None else part.high
        return max(high, self.available(kg, now))

    def exhausted(self, kg: int, position: int) -> bool:
        return False

    def when_available(self, kg: int, offset: int, now: float) -> float:
        # records arriving wake the key group through ``on_data``; this is the fallback
        return now + DATA_WAIT_SECONDS

    def event_time(self, kg: int, offset: int) -> int:
        return int(time.time() * 1000)  # only for records without a timestamp

    def read_batch(self, kg: int, start: int, stop: int) -> SourceBatch:
        resume = False
        with self._lock:
            part = self._partitions.get(kg)
            if part is None:
                return SourceBatch([], [], [], start)
            queue = part.messages
            while queue and queue[0][0] < start:
                queue.popleft()  # processed up to start
            # offsets grow: the first stop - start from start on, less those past stop
            taken = list(itertools.islice(queue, stop - start))
            while taken and taken[-1][0] >= stop:
                taken.pop()
            if part.paused and len(queue) <= self._low:
                part.paused = False
                resume = True
        if resume:
            tp = TopicPartition(self.topic, kg)
            self._call(lambda: self._consumer.resume([tp]))
        offsets = [offset for offset, _ in taken]
        messages = [m for _, m in taken]
        records = self._decode_all(messages)
        poison = False
        if records is None:  # some record is poison, maybe: one by one, to say which
            records = [self._decode_message(kg, offset, m) for offset, m in taken]
            poison = any(isinstance(record, Poison) for record in records)
        next_position = offsets[-1] + 1 if offsets else start
        timestamps = MessageTimestamps(messages, int(time.time() * 1000))
        return SourceBatch(records, offsets, timestamps, next_position, poison)

    def _decode_all(self, messages: list[Message]) -> list[Any] | None:
        """The batch's records, if none is poison (None: some is; decode one by one).

        One pass per step over the whole batch rather than one call per record: this is
        a Kafka job's per-record cost (``benchmarks/RESULTS.md``, "The Kafka source's
        cost per record")."""
        found = [m.value() for m in messages]
        if None in found:
            return None  # a tombstone
        values = cast("list[bytes]", found)
        keys = [m.key() for m in messages]
        longest_key = max([len(k) for k in keys if k is not None], default=0)
        if max(map(len, values), default=0) + longest_key > self._max_bytes:
            return None  # maybe one record over the limit: the slow path tells which
        decode = self._decode
        try:
            return [decode(value) for value in values]
        except Exception:  # the user's decoder may raise anything: the slow path reports it
            return None

    def _decode_message(self, kg: int, offset: int, m: Message) -> Any:
        key: bytes | None = m.key()
        value: bytes | None = m.value()
        size = len(key or b"") + len(value or b"")
        if size > self._max_bytes:
            error = f"record of {size} bytes is larger than maxRecordBytes ({self._max_bytes})"
            return Poison(kg, offset, error, key, value)
        if value is None:
            return Poison(kg, offset, "record has no value (a tombstone)", key, value)
        try:
            return self._decode(value)
        except Exception as exc:  # the user's decoder may raise anything
            return Poison(kg, offset, f"{type(exc).__name__}: {exc}", key, value)


class MessageTimestamps(Sequence[int]):
    """The event times of a batch's messages (unix ms), read when asked: a job without
    event time never asks.  A message without a timestamp has the batch's read time."""

    __slots__ = ("_messages", "_read_at")

    def __init__(self, messages: list[Message], read_at: int) -> None:
        self._messages = messages
        self._read_at = read_at

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self._timestamp(m) for m in self._messages[index]]
        return self._timestamp(self._messages[index])

    def _timestamp(self, m: Message) -> int:
        kind, ts = m.timestamp()
        return self._read_at if kind == TIMESTAMP_NOT_AVAILABLE else int(ts)
