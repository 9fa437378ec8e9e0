"""Kafka through confluent-kafka (librdkafka): the source, the sink, the dead letters.

**Source** (:class:`KafkaRecordSource`): one key group per partition.  A worker
has one consumer with *manual* assignment: when it claims key group ``kg`` it
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

**Sink** (:class:`KafkaSinkWriter`): an idempotent producer (``acks=all``).
Outputs are keyed by the record's key and carry their origin (the identity a replay
reproduces, :class:`~keyshift.runtime.sinks.Origin`) in headers.
Before a key group commits, ``flush(kg)`` waits until the broker acknowledged
every output that key group produced (other key groups keep producing).  A
delivery that failed for good makes the key group replay from its last commit.

**Dead letters** (:class:`KafkaDeadLetters`): poison records' original bytes
with the error, to ``deadLetterTopic``, flushed before the commit like outputs.

Secrets never come from the manifest: ``KEYSHIFT_KAFKA_SASL_PASSWORD`` in the
environment sets ``sasl.password``, and so on for any property.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from keyshift.api.spec import KafkaClient, KafkaSink, KafkaSource
from keyshift.runtime.sources import Poison, SourceBatch
from keyshift.runtime.sources.generator import Generator

if TYPE_CHECKING:
    from keyshift.runtime.sinks import Origin

log = logging.getLogger("keyshift.runtime.kafka")

ENV_PREFIX = "KEYSHIFT_KAFKA_"
POLL_SECONDS = 0.05
"""How long the consumer thread waits for records in one poll."""
DATA_WAIT_SECONDS = 1.0
"""How long an idle key group waits before looking at its buffer again, at most: records
arriving wake it at once (``on_data``)."""
PROBE_SECONDS = 2.0
"""How often a source with a connection problem checks whether the broker is back."""
PARTITIONS_CHECK_SECONDS = 30.0
"""How often the source checks whether the topic's partition count changed."""
ORIGIN_HEADERS = ("keyshift-key-group", "keyshift-offset", "keyshift-index")
TIMER_HEADER = "keyshift-timer"
"""On a timer's outputs: ``<domain> <time> <hex of the msgpack of the timer's key>``."""


def origin_headers(origin: Origin) -> list[tuple[str, str | bytes | None]]:
    """The headers that identify an output (see :class:`~keyshift.runtime.sinks.Origin`)."""
    headers: list[tuple[str, str | bytes | None]] = [
        (ORIGIN_HEADERS[0], b"%d" % origin.key_group),
        (ORIGIN_HEADERS[1], b"%d" % origin.offset),
        (ORIGIN_HEADERS[2], b"%d" % origin.index),
    ]
    timer = origin.timer
    if timer is not None:
        key = msgspec.msgpack.encode(timer.key).hex()
        headers.append((TIMER_HEADER, f"{timer.domain} {timer.time} {key}".encode()))
    return headers


def client_config(spec: KafkaClient, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """librdkafka settings: the spec's properties plus secrets from the environment
    (``KEYSHIFT_KAFKA_SASL_PASSWORD`` -> ``sasl.password``)."""
    env = os.environ if environ is None else environ
    config: dict[str, Any] = {"bootstrap.servers": spec.bootstrap_servers, **spec.properties}
    for name, value in env.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            config[name[len(ENV_PREFIX) :].lower().replace("_", ".")] = value
    return config


def key_bytes(key: Any) -> bytes | None:
    """A Kafka message key for a record key: UTF-8 of a string, bytes as they are,
    msgpack of anything else."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    return msgspec.msgpack.encode(key)


def value_decoder(fmt: str) -> Callable[[bytes], Any]:
    if fmt == "json":
        return msgspec.json.decode
    if fmt == "msgpack":
        return msgspec.msgpack.decode
    if fmt == "string":
        return lambda raw: raw.decode("utf-8")
    return lambda raw: raw


def check_partitions(topic: str, partitions: int, key_groups: int) -> None:
    if partitions != key_groups:
        raise ValueError(
            f"Kafka topic {topic!r} has {partitions} partitions but the job has {key_groups} "
            "key groups: a Kafka job reads one partition per key group, so keyGroups must "
            "equal the partition count (fixed for the life of the job)"
        )


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
        self._thread = threading.Thread(target=self._poll_loop, name="kafka-source", daemon=True)

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
        self._thread.start()

    def _partition_count(self, timeout: float) -> int:
        metadata = self._consumer.list_topics(self.topic, timeout=timeout)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            error = topic.error if topic is not None else "not found"
            raise KafkaException(f"Kafka topic {self.topic!r}: {error}")
        return len(topic.partitions)

    async def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, 5.0)
        await asyncio.to_thread(self._consumer.close)

    def _call(self, command: Callable[[], None]) -> None:
        """Run ``command`` on the consumer in the poll thread (or now, before it runs)."""
        if self._thread.is_alive():
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
        to_pause: list[TopicPartition] = []
        received = False
        arrived: dict[int, Callable[[], None]] = {}
        with self._lock:
            for m in messages:
                if m.error() is not None:
                    log.warning("Kafka fetch: %s", m.error())
                    continue
                received = True
                partition = m.partition()
                offset = m.offset()
                if partition is None or offset is None:
                    continue
                part = self._partitions.get(partition)
                if part is None or offset < part.next_fetch:
                    continue  # unassigned meanwhile, or fetched before a re-assignment
                part.messages.append((offset, m))
                part.next_fetch = offset + 1
                if part.on_data is not None:
                    arrived[partition] = part.on_data
                if not part.paused and len(part.messages) >= self._high:
                    part.paused = True
                    to_pause.append(TopicPartition(self.topic, partition))
        if received:
            self._problem = None
        for wake in arrived.values():
            wake()
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
        taken: list[tuple[int, Message]] = []
        resume = False
        with self._lock:
            part = self._partitions.get(kg)
            if part is None:
                return SourceBatch([], [], [], start)
            queue = part.messages
            while queue and queue[0][0] < start:
                queue.popleft()  # processed up to start
            count = stop - start
            for entry in queue:
                if entry[0] >= stop or len(taken) >= count:
                    break
                taken.append(entry)
            if part.paused and len(queue) <= self._low:
                part.paused = False
                resume = True
        if resume:
            tp = TopicPartition(self.topic, kg)
            self._call(lambda: self._consumer.resume([tp]))
        records: list[Any] = []
        offsets: list[int] = []
        timestamps: list[int] = []
        poison = False
        now_ms = int(time.time() * 1000)
        for offset, m in taken:
            record = self._decode_message(kg, offset, m)
            poison = poison or isinstance(record, Poison)
            records.append(record)
            offsets.append(offset)
            kind, ts = m.timestamp()
            timestamps.append(ts if kind != TIMESTAMP_NOT_AVAILABLE else now_ms)
        next_position = offsets[-1] + 1 if offsets else start
        return SourceBatch(records, offsets, timestamps, next_position, poison)

    def _decode_message(self, kg: int, offset: int, m: Message) -> Any:
        key = m.key()
        value = m.value()
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


class _Deliveries:
    """Per key group count of produced messages not yet acknowledged, and failures."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}
        self._lost: set[int] = set()
        self._waiters: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}

    def produced(self, kg: int) -> None:
        with self._lock:
            self._pending[kg] = self._pending.get(kg, 0) + 1

    def delivered(self, kg: int, error: KafkaError | None) -> None:
        """Called from the producer's poll thread."""
        with self._lock:
            left = self._pending[kg] = self._pending.get(kg, 1) - 1
            if error is not None:
                self._lost.add(kg)
            waiter = self._waiters.pop(kg, None) if left <= 0 else None
        if waiter is not None:
            loop, event = waiter
            loop.call_soon_threadsafe(event.set)

    async def wait(self, kg: int, within: float) -> bool:
        """Wait until every message of ``kg`` was acknowledged; False on timeout."""
        with self._lock:
            if self._pending.get(kg, 0) <= 0:
                return True
            event = asyncio.Event()
            self._waiters[kg] = (asyncio.get_running_loop(), event)
        try:
            async with asyncio.timeout(within):
                await event.wait()
            return True
        except TimeoutError:
            with self._lock:
                self._waiters.pop(kg, None)
            return False

    def pending(self, kg: int) -> int:
        with self._lock:
            return self._pending.get(kg, 0)

    def lost(self, kg: int) -> bool:
        with self._lock:
            if kg in self._lost:
                self._lost.discard(kg)
                return True
            return False


class _Producer:
    """An idempotent producer with a poll thread and per key group delivery tracking."""

    def __init__(self, spec: KafkaClient, flush_timeout: float) -> None:
        config = client_config(spec)
        config.update({
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "partitioner": "murmur2_random",  # the Java client's: keys land where Java puts them
            "queue.buffering.max.messages": 1_000_000,
            "error_cb": lambda e: log.warning("Kafka producer: %s", e.str()),
        })  # fmt: skip
        self.producer = Producer(config)
        self.deliveries = _Deliveries()
        self.flush_timeout = flush_timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kafka-producer", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(POLL_SECONDS)

    def produce(
        self,
        kg: int,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
    ) -> None:
        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            self.deliveries.delivered(kg, error)
            if error is not None:
                log.error("Kafka delivery to %s failed (key group %d): %s", topic, kg, error)

        self.deliveries.produced(kg)
        while True:
            try:
                self.producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=on_delivery
                )
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                time.sleep(0.01)

    async def flush(self, kg: int) -> None:
        from keyshift.runtime.sinks import SinkUnavailable

        if not await self.deliveries.wait(kg, self.flush_timeout):
            raise SinkUnavailable(
                f"Kafka has not acknowledged {self.deliveries.pending(kg)} outputs of key group "
                f"{kg} within {self.flush_timeout:g}s"
            )

    async def close(self) -> None:
        await asyncio.to_thread(self.producer.flush, self.flush_timeout)
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 5.0)


class _ProducerWriter:
    """What the sink and the dead letters share: their producer's flush, losses, close."""

    _producer: _Producer

    async def flush(self, key_group: int) -> None:
        await self._producer.flush(key_group)

    def lost(self, key_group: int) -> bool:
        return self._producer.deliveries.lost(key_group)

    async def close(self) -> None:
        await self._producer.close()


class KafkaSinkWriter(_ProducerWriter):
    """Outputs to a Kafka topic (see the module docstring)."""

    def __init__(self, spec: KafkaSink) -> None:
        self.topic = spec.topic
        self._producer = _Producer(spec, spec.flush_timeout)
        self._encode: Callable[[Any], bytes] = (
            msgspec.json.encode if spec.format == "json" else msgspec.msgpack.encode
        )
        self.emitted = 0

    def emit(self, origin: Origin, value: Any, key: Any = None) -> None:
        self._producer.produce(
            origin.key_group,
            self.topic,
            key_bytes(key),
            self._encode(value),
            origin_headers(origin),
        )
        self.emitted += 1


class KafkaDeadLetters(_ProducerWriter):
    """Poison records to the dead-letter topic: the original key and value, and headers
    ``keyshift-error``, ``keyshift-topic``, ``keyshift-partition``, ``keyshift-offset``."""

    def __init__(self, spec: KafkaSource) -> None:
        assert spec.dead_letter_topic is not None
        self.topic = spec.dead_letter_topic
        self.source_topic = spec.topic
        self._producer = _Producer(spec, 30.0)
        self.sent = 0

    def send(self, poison: Poison) -> None:
        headers: list[tuple[str, str | bytes | None]] = [
            ("keyshift-error", poison.error.encode()),
            ("keyshift-topic", self.source_topic.encode()),
            ("keyshift-partition", b"%d" % poison.key_group),
            ("keyshift-offset", b"%d" % poison.offset),
        ]
        self._producer.produce(poison.key_group, self.topic, poison.key, poison.value, headers)
        self.sent += 1


def create_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions, unless it exists with that many."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    existing = admin.list_topics(timeout=10).topics.get(topic)
    if existing is not None and existing.error is None:
        check_partitions(topic, len(existing.partitions), partitions)
        return
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)


def fill_topic(
    bootstrap_servers: str,
    topic: str,
    generator: Generator,
    *,
    start: int,
    stop: int,
    chunk: int = 5_000,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write the generator's records ``[start, stop)`` of every key group to partition
    ``kg`` of ``topic`` (key: the record's key; value: JSON; timestamp: its event time),
    so that a Kafka job's exact results are the generator's.  Returns records written."""
    producer = Producer({
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        "linger.ms": 20,
        "queue.buffering.max.messages": 1_000_000,
    })  # fmt: skip
    encode = msgspec.json.encode
    written = 0
    for lo in range(start, stop, chunk):
        hi = min(stop, lo + chunk)
        for kg in range(generator.key_groups):
            for offset, event in enumerate(generator.read(kg, lo, hi), start=lo):
                while True:
                    try:
                        producer.produce(
                            topic, value=encode(event), key=event.key.encode(), partition=kg,
                            timestamp=generator.event_time(kg, offset),
                        )  # fmt: skip
                        break
                    except BufferError:
                        producer.poll(0.1)
                written += 1
            producer.poll(0)
        if progress is not None:
            progress(written)
    left = producer.flush(60)
    if left:
        raise KafkaException(f"{left} records were not acknowledged by Kafka")
    return written
