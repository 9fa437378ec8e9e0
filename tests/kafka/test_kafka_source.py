"""The Kafka source's batches: each record decoded in its place, with its offset and its
timestamp; a record that cannot be given to the job (a tombstone, undecodable, over
``maxRecordBytes``) is a :class:`Poison` in its place, saying why.  Against the real
broker (Tansu)."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from keyshift.api.spec import KafkaSource
from keyshift.runtime.kafka.source import KafkaRecordSource
from keyshift.runtime.sources import Event, Poison
from tests.kafka_broker import KafkaBroker
from tests.support import wait_for

decode_event: Callable[[bytes], Any] = msgspec.json.Decoder(Event).decode


def event(key: str, value: int) -> bytes:
    return msgspec.json.encode(Event(key, value))


@asynccontextmanager
async def reading(
    broker: KafkaBroker, records: Sequence[tuple[bytes | None, bytes | None]], **spec: Any
) -> AsyncIterator[KafkaRecordSource]:
    """A source over a new one-partition topic holding ``records`` (key, value), all of
    them in its buffer."""
    topic = f"source-{secrets.token_hex(4)}"
    broker.create_topic(topic, 1)
    broker.produce(topic, [(0, key, value) for key, value in records])
    source = KafkaRecordSource(
        KafkaSource.model_validate(
            {"type": "kafka", "bootstrapServers": broker.bootstrap_servers, "topic": topic, **spec}
        ),
        1,
        group_id=topic,
        decode=decode_event,
    )
    await source.open()
    try:
        source.assign(0, 0)
        await wait_for(lambda: source.available(0, time.time()) == len(records), 20, "the records")
        yield source
    finally:
        await source.close()


async def test_a_batch_holds_each_record_with_its_offset_and_timestamp(
    kafka_broker: KafkaBroker,
) -> None:
    before = int(time.time() * 1000)
    records = [(b"a", event("a", 1)), (None, event("b", 2)), (b"c", event("c", 3))]
    async with reading(kafka_broker, records) as source:
        after = int(time.time() * 1000)
        middle = source.read_batch(0, 1, 2)
        assert (list(middle.records), middle.offsets, middle.next_position) == (
            [Event("b", 2)], [1], 2
        )  # fmt: skip
        batch = source.read_batch(0, 1, 100)
    assert list(batch.records) == [Event("b", 2), Event("c", 3)]
    assert (batch.offsets, batch.next_position, batch.has_poison) == ([1, 2], 3, False)
    assert batch.timestamps is not None and len(batch.timestamps) == 2
    stamps = [batch.timestamps[i] for i in range(2)]
    assert all(before <= t <= after for t in stamps), (before, stamps, after)
    assert batch.timestamps[1:] == stamps[1:]


async def test_poison_records_stand_in_their_place_and_say_why(
    kafka_broker: KafkaBroker,
) -> None:
    oversized = b'{"key": "big", "value": 1, "pad": "' + b"x" * 200 + b'"}'
    records = [
        (b"k", event("a", 1)),
        (b"k", None),  # a tombstone
        (b"k", b"not json"),
        (b"k", b'{"key": "n", "value": "not a number"}'),
        (b"k", oversized),
        (b"k", event("b", 2)),
    ]
    async with reading(kafka_broker, records, maxRecordBytes=100) as source:
        batch = source.read_batch(0, 0, 100)
    assert batch.has_poison and batch.offsets == list(range(6))
    assert batch.records[0] == Event("a", 1) and batch.records[5] == Event("b", 2)
    poison = batch.records[1:5]
    assert all(isinstance(p, Poison) for p in poison), poison
    assert [(p.offset, p.key, p.value) for p in poison] == [
        (offset, key, value) for offset, (key, value) in enumerate(records[1:5], start=1)
    ]
    reasons = [p.error for p in poison]
    assert reasons[0] == "record has no value (a tombstone)"
    assert reasons[1].startswith("DecodeError") and reasons[2].startswith("ValidationError")
    assert reasons[3] == (
        f"record of {1 + len(oversized)} bytes is larger than maxRecordBytes (100)"
    )


async def test_records_within_the_limit_are_not_poison_though_the_longest_key_and_value_are_not(
    kafka_broker: KafkaBroker,
) -> None:
    """The batch's longest key and longest value together exceed ``maxRecordBytes``,
    but come from different records: each record is within the limit."""
    long_key = b"k" * 60
    records = [(long_key, event("a", 1)), (b"k", event("b" * 40, 2))]
    assert all(len(k) + len(v) <= 100 for k, v in records)
    assert len(long_key) + max(len(v) for _, v in records) > 100
    async with reading(kafka_broker, records, maxRecordBytes=100) as source:
        batch = source.read_batch(0, 0, 100)
    assert list(batch.records) == [Event("a", 1), Event("b" * 40, 2)]
    assert not batch.has_poison
