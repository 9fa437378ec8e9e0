"""The Kafka sink and dead letters.

**Sink** (:class:`KafkaSinkWriter`): an idempotent producer (``acks=all``).
Outputs are keyed by the record's key and carry their origin (the identity a replay
reproduces, :class:`~keyshift.runtime.sinks.Origin`) in headers.
Before a key group commits, ``flush(kg)`` waits until the broker acknowledged
every output that key group produced (other key groups keep producing).  A
delivery that failed for good makes the key group replay from its last commit.

**Dead letters** (:class:`KafkaDeadLetters`): poison records' original bytes
with the error, to ``deadLetterTopic``, flushed before the commit like outputs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from confluent_kafka import (
    KafkaError,
    Message,
    Producer,
)

from keyshift.api.spec import KafkaClient, KafkaSink, KafkaSource
from keyshift.runtime.kafka.client import POLL_SECONDS, client_config
from keyshift.runtime.sources import Poison

if TYPE_CHECKING:
    from keyshift.runtime.sinks import Origin


log = logging.getLogger("keyshift.runtime.kafka")

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


def key_bytes(key: Any) -> bytes | None:
    """A Kafka message key for a record key: UTF-8 of a string, bytes as they are,
    msgpack of anything else."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    return msgspec.msgpack.encode(key)


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
