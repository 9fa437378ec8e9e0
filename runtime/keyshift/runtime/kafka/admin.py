"""Kafka topics for tests and benchmarks: create one, fill it with the generator's records."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
from confluent_kafka import (
    KafkaException,
    Producer,
)

from keyshift.runtime.kafka.client import check_partitions
from keyshift.runtime.sources.generator import Generator

if TYPE_CHECKING:
    pass


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
