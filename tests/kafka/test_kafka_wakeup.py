"""Records arriving in Kafka wake their idle key group at once: the source calls the
key group's ``on_data`` from its poll thread, instead of the key group looking at its
buffer every few milliseconds.  Against the real broker (Tansu)."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time

import pytest

from examples.counter import job as counter_job
from keyshift.api.spec import KafkaSource, StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime import keygroup
from keyshift.runtime.config import settings_from
from keyshift.runtime.kafka import source as kafka_source
from keyshift.runtime.kafka.source import KafkaRecordSource
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, MemoryStore
from tests.kafka_broker import KafkaBroker
from tests.support import wait_for

RECORD = b'{"key": "k", "value": 1}'


async def test_the_source_calls_on_data_for_the_partition_that_received_records(
    kafka_broker: KafkaBroker,
) -> None:
    topic = f"wake-{secrets.token_hex(4)}"
    kafka_broker.create_topic(topic, 2)
    spec = KafkaSource.model_validate(
        {"type": "kafka", "bootstrapServers": kafka_broker.bootstrap_servers, "topic": topic}
    )
    source = KafkaRecordSource(spec, 2, group_id=topic)
    await source.open()
    woken = {0: threading.Event(), 1: threading.Event()}
    try:
        source.assign(0, 0, woken[0].set)
        source.assign(1, 0, woken[1].set)
        kafka_broker.produce(topic, [(1, b"k", RECORD)])
        await wait_for(woken[1].is_set, 20, "the callback of partition 1")
        assert source.available(1, time.time()) == 1
        assert not woken[0].is_set(), "partition 0 received nothing"
    finally:
        await source.close()


async def test_an_idle_key_group_processes_new_records_without_polling(
    kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every fallback wait an hour long, only the wake-up can make an idle key
    group process the records produced after it caught up."""
    monkeypatch.setattr(kafka_source, "DATA_WAIT_SECONDS", 3600.0)
    monkeypatch.setattr(keygroup, "IDLE_SECONDS", 3600.0)
    topic = f"idle-{secrets.token_hex(4)}"
    kafka_broker.create_topic(topic, 2)
    manifest = StreamJob.model_validate({
        "metadata": {"name": "idle"},
        "spec": {
            "job": "examples.counter:job", "keyGroups": 2, "checkpointInterval": "50ms",
            "source": {"type": "kafka", "topic": topic,
                       "bootstrapServers": kafka_broker.bootstrap_servers},
            "sink": {"type": "null"},
        },
    })  # fmt: skip
    store = MemoryStore()
    await store.init_job("idle", 2)
    await store.publish_assignment("idle", Assignment(1, 1, plan_assignment(2, 1)),
                                   expected_generation=0)  # fmt: skip
    worker = Worker(settings_from(manifest, ordinal=0, store_url="memory://"), counter_job, store)
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: worker.acked_generation == 1, 30, "the worker to run both")
        kafka_broker.produce(topic, [(1, b"k", RECORD)] * 3)

        async def committed() -> bool:
            return (await store.key_group_info("idle", 1)).position == 3

        await wait_for(committed, 20, "key group 1 to process and commit the 3 records")
        assert (await store.key_group_info("idle", 0)).position == 0
    finally:
        worker.stop()
        await wait_for(task.done, 30, "the worker to stop")
