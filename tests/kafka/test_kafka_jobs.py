"""Kafka jobs against a real Kafka-compatible broker (Tansu) and a real Valkey.

The input topics hold the generator's records (``keyshift fill-topic``'s
``fill_topic``), partition ``kg`` = key group ``kg`` at the same offsets, so the
exact expected state is the generator's (:mod:`keyshift.runtime.expected`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec

from keyshift.api.names import API_VERSION
from keyshift.api.spec import GeneratorSource, KafkaSink
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.api import encode_key
from keyshift.runtime.kafka.admin import fill_topic
from keyshift.runtime.kafka.sink import KafkaSinkWriter
from keyshift.runtime.sinks import Outputs, TimerOrigin
from keyshift.runtime.sources.generator import Event, Generator
from keyshift.store import Assignment, RedisStateStore, open_store
from keyshift.store.server import LocalServer, free_port
from tests.kafka_broker import KafkaBroker
from tests.support import (
    WorkerProcess,
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    deploy,
    positions,
    wait_for,
    write_manifest,
)

GENERATOR = {"seed": 5, "keys": 600, "distribution": "zipf"}


def kafka_manifest(
    job: str,
    *,
    bootstrap: str,
    key_groups: int,
    parallelism: int,
    store_url: str,
    source: dict[str, Any] | None = None,
    sink: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": job},
        "spec": {
            "job": "examples.counter:job",
            "keyGroups": key_groups,
            "parallelism": parallelism,
            "source": {
                "type": "kafka",
                "bootstrapServers": bootstrap,
                "topic": f"{job}-in",
                **(source or {}),
            },
            "sink": sink or {"type": "kafka", "bootstrapServers": bootstrap, "topic": f"{job}-out"},
            "stateStore": {"url": store_url},
            "checkpointInterval": "200ms",
        },
    }


def fill(broker: KafkaBroker, topic: str, key_groups: int, start: int, stop: int) -> None:
    spec = GeneratorSource.model_validate(GENERATOR)
    generator = Generator(spec, key_groups, created_at=time.time())
    fill_topic(broker.bootstrap_servers, topic, generator, start=start, stop=stop)


def header(message: Any, name: str) -> bytes:
    for key, value in message.headers() or []:
        if key == name:
            assert isinstance(value, bytes)
            return value
    raise AssertionError(f"no header {name!r} on {message.topic()}:{message.offset()}")


def kafka_identity(message: Any) -> tuple[bytes, ...]:
    """The origin headers of an output, as a consumer deduplicating would take them."""
    names = ("keyshift-key-group", "keyshift-offset", "keyshift-index")
    timer = [v for k, v in message.headers() or [] if k == "keyshift-timer"]
    return (*[header(message, n) for n in names], *timer)


def origins(messages: list[Any]) -> set[tuple[int, int]]:
    return {
        (int(header(m, "keyshift-key-group")), int(header(m, "keyshift-offset"))) for m in messages
    }


async def test_counter_over_kafka_is_exact_across_a_kill_and_a_rescale(
    standalone_server: LocalServer,
    kafka_broker: KafkaBroker,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    """8 partitions, two workers writing to an output topic; worker 1 is SIGKILLed
    while it processes, restarted, and then the job rescales 2 -> 3 while records
    still arrive.  The state is exact and every input record's output is in the
    output topic at least once (identified by its origin headers)."""
    k, half = 8, 1500
    kafka_broker.create_topic(f"{job}-in", k)
    kafka_broker.create_topic(f"{job}-out", 4)
    fill(kafka_broker, f"{job}-in", k, 0, half)
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        kafka_manifest(job, bootstrap=kafka_broker.bootstrap_servers, key_groups=k,
                       parallelism=2, store_url=url),
    )  # fmt: skip
    store = open_store(url, retry_seconds=10)
    try:
        _, workers = await deploy(store, job, k, 2, manifest, url, spawn)

        async def worker_1_started() -> bool:
            return any(p > 0 for p in (await positions(store, job, k))[4:])

        await wait_for(worker_1_started, 60, "worker 1 to commit some progress")
        workers[1].kill()
        fill(kafka_broker, f"{job}-in", k, half, 2 * half)
        workers[1].start()
        workers.append(spawn(manifest, 2, url))
        rescaled = Assignment(2, 3, plan_assignment(k, 3))
        await store.publish_assignment(job, rescaled, expected_generation=1)

        async def finished() -> bool:
            return await all_done(store, job, k, 2 * half)

        await wait_for(finished, 90, "every record of every partition to be processed")
        await assert_exact_counter_state(store, job, GENERATOR, k, 2 * half)
        await assert_owned_as_assigned(store, job, rescaled)

        out = kafka_broker.read_all(f"{job}-out", 4)
        expected = {(kg, offset) for kg in range(k) for offset in range(2 * half)}
        assert origins(out) == expected
        assert len(out) >= len(expected)
        # an output is the counter's value after its record: the last one per key is final
        last: dict[str, dict[str, int]] = {}
        for m in out:
            value = msgspec.json.decode(m.value())
            key = m.key().decode()
            assert value["key"] == key
            if value["count"] >= last.get(key, {"count": 0})["count"]:
                last[key] = value
        for kg in range(k):
            async for key, raw in store.scan_all(job, kg, "count"):
                name = msgspec.msgpack.decode(key)
                assert last[name]["count"] == msgspec.msgpack.decode(raw)
    finally:
        await store.close()


Records = list[tuple[int, bytes | None, bytes | None]]
"""``(partition, key, value)`` in the order produced."""


def poison_records(
    key_groups: int, per_partition: int
) -> tuple[Records, dict[tuple[int, int], str]]:
    """Valid Event records with three poison ones in partition 1: bytes that are not
    JSON, JSON the job's decoder rejects, and a record over the size limit."""
    spec = GeneratorSource.model_validate(GENERATOR)
    generator = Generator(spec, key_groups, created_at=0)
    records: Records = []
    poison: dict[tuple[int, int], str] = {}
    bad = {
        3: (b"\xff\xfe not json", "JSON"),
        7: (b'{"key": 5, "value": 1}', "Expected `str`"),
        11: (b'{"key": "big", "value": 1, "pad": "' + b"x" * 600 + b'"}', "maxRecordBytes"),
    }
    for kg in range(key_groups):
        for offset, event in enumerate(generator.read(kg, 0, per_partition)):
            if kg == 1 and offset in bad:
                value, error = bad[offset]
                records.append((kg, b"poison", value))
                poison[(kg, offset)] = error
            else:
                records.append((kg, event.key.encode(), msgspec.json.encode(event)))
    return records, poison


async def expected_counts(
    store: RedisStateStore,
    job: str,
    records: Records,
    poison: dict[tuple[int, int], str],
    key_groups: int,
) -> None:
    """The store's counts are exactly those of the valid records."""
    counts: dict[int, dict[str, int]] = {kg: {} for kg in range(key_groups)}
    offsets = dict.fromkeys(range(key_groups), 0)
    for kg, _, value in records:
        offset = offsets[kg]
        offsets[kg] += 1
        if (kg, offset) in poison:
            continue
        assert value is not None
        event = msgspec.json.decode(value, type=Event)
        counts[kg][event.key] = counts[kg].get(event.key, 0) + 1
    for kg in range(key_groups):
        stored = {k: v async for k, v in store.scan_all(job, kg, "count")}
        assert {msgspec.msgpack.decode(k): msgspec.msgpack.decode(v) for k, v in stored.items()} \
            == counts[kg], f"key group {kg}"  # fmt: skip


POISON_K, POISON_N = 2, 40
"""Key groups (partitions) and records per partition of the poison tests."""


@asynccontextmanager
async def poison_job(
    broker: KafkaBroker,
    url: str,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
    source: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[RedisStateStore, WorkerProcess, Records, dict[tuple[int, int], str]]]:
    """One worker on a topic holding :func:`poison_records`, with ``source`` settings."""
    k, n = POISON_K, POISON_N
    broker.create_topic(f"{job}-in", k)
    records, poison = poison_records(k, n)
    broker.produce(f"{job}-in", records)
    manifest = write_manifest(
        tmp_path,
        kafka_manifest(job, bootstrap=broker.bootstrap_servers, key_groups=k, parallelism=1,
                       store_url=url, source=source, sink={"type": "null"}),
    )  # fmt: skip
    store = open_store(url, retry_seconds=10)
    try:
        _, [worker] = await deploy(store, job, k, 1, manifest, url, spawn)
        yield store, worker, records, poison
    finally:
        await store.close()


async def test_poison_records_go_to_the_dead_letter_topic_with_their_error(
    standalone_server: LocalServer,
    kafka_broker: KafkaBroker,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    k, n = POISON_K, POISON_N
    kafka_broker.create_topic(f"{job}-dlq", 1)
    source = {"onPoison": "dead-letter", "deadLetterTopic": f"{job}-dlq", "maxRecordBytes": 300}
    async with poison_job(kafka_broker, standalone_server.url, job, tmp_path, spawn, source) as (
        store,
        worker,
        records,
        poison,
    ):

        async def finished() -> bool:
            return await all_done(store, job, k, n)

        await wait_for(finished, 60, "every record, poison included, to be passed")
        await expected_counts(store, job, records, poison, k)
        letters = kafka_broker.read_all(f"{job}-dlq", 1)
        found = {
            (int(header(m, "keyshift-partition")), int(header(m, "keyshift-offset"))): m
            for m in letters
        }
        assert set(found) == set(poison)
        for origin, m in found.items():
            assert poison[origin] in header(m, "keyshift-error").decode()
            assert header(m, "keyshift-topic") == f"{job}-in".encode()
            kg, offset = origin
            assert (kg, m.key(), m.value()) == records[kg * n + offset]
        assert worker.metric("keyshift_poison_records_total") == 3


async def test_a_poison_record_stops_its_key_group_under_the_fail_policy(
    standalone_server: LocalServer,
    kafka_broker: KafkaBroker,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    k, n = POISON_K, POISON_N
    async with poison_job(kafka_broker, standalone_server.url, job, tmp_path, spawn) as (
        store, worker, _, _,
    ):  # fmt: skip

        async def stopped_at_the_poison() -> bool:
            return await positions(store, job, k) == [n, 3]

        await wait_for(stopped_at_the_poison, 60, "partition 0 done, partition 1 at offset 3")
        health = worker.get("/healthz").json()
        assert health["status"] == "degraded"
        assert health["failed_key_groups"]["1"] == {
            "reason": "poison-record", "offset": 3, "error": "PoisonRecordError"
        }  # fmt: skip
        assert "poison record at key group 1 offset 3" in worker.log()  # the words: the log
        assert worker.metric("keyshift_key_groups_failed") == 1
        # nothing of the poison record or after it counted
        counted = {k: v async for k, v in store.scan_all(job, 1, "count")}
        expected = Generator(GeneratorSource.model_validate(GENERATOR), k, 0).read(1, 0, 3)
        assert sum(msgspec.msgpack.decode(v) for v in counted.values()) == len(expected)
        assert set(counted) == {encode_key(e.key) for e in expected}


async def test_a_partition_count_other_than_key_groups_is_refused(
    standalone_server: LocalServer,
    kafka_broker: KafkaBroker,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    kafka_broker.create_topic(f"{job}-in", 8)
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        kafka_manifest(job, bootstrap=kafka_broker.bootstrap_servers, key_groups=4,
                       parallelism=1, store_url=url, sink={"type": "null"}),
    )  # fmt: skip
    worker = spawn(manifest, 0, url)
    assert worker.process is not None
    assert worker.process.wait(timeout=60) == 1
    assert f"Kafka topic '{job}-in' has 8 partitions but the job has 4 key groups" in worker.log()


async def test_a_worker_is_not_ready_until_kafka_is_reachable(
    standalone_server: LocalServer,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    """Kafka is down when the worker starts: it backs off and says why in /healthz,
    /readyz is 503; once the broker is up it processes and turns ready."""
    k, n = 2, 50
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        kafka_manifest(job, bootstrap=bootstrap, key_groups=k, parallelism=1, store_url=url,
                       sink={"type": "null"}),
    )  # fmt: skip
    store = open_store(url, retry_seconds=10)
    broker = KafkaBroker(tmp_path / "broker", port=port)
    try:
        _, [worker] = await deploy(store, job, k, 1, manifest, url, spawn)

        async def says_unreachable() -> bool:
            try:
                health = worker.get("/healthz").json()
            except httpx.HTTPError:
                return False  # not serving yet
            return "Kafka unreachable" in health["source"]

        await wait_for(says_unreachable, 30, "/healthz to say Kafka is unreachable")
        assert worker.get("/readyz").status_code == 503
        broker.start()
        broker.create_topic(f"{job}-in", k)
        fill(broker, f"{job}-in", k, 0, n)

        async def processed() -> bool:
            return await all_done(store, job, k, n)

        await wait_for(processed, 60, "the records to be processed once Kafka is up")
        await assert_exact_counter_state(store, job, GENERATOR, k, n)

        async def is_ready() -> bool:
            return worker.get("/readyz").status_code == 200

        await wait_for(is_ready, 10, "the worker to be ready")
        # the broker goes away: the worker says so and is not ready until it is back
        broker.stop()
        await wait_for(says_unreachable, 30, "/healthz to say Kafka is unreachable again")
        assert worker.get("/readyz").status_code == 503
        broker.start()  # memory storage: a new, empty broker

        async def says_topic_missing() -> bool:
            return f"Kafka topic '{job}-in'" in worker.get("/healthz").json()["source"]

        await wait_for(says_topic_missing, 30, "/healthz to say the topic is missing")
        broker.create_topic(f"{job}-in", k)
        await wait_for(is_ready, 30, "the worker to be ready again")
    finally:
        broker.stop()
        await store.close()


async def test_a_timer_output_and_the_output_of_the_record_at_its_position_differ_in_identity(
    kafka_broker: KafkaBroker, job: str
) -> None:
    """Key group 0's watermark passes a timer at position 7: the timer's output, then
    record 7's output, are produced; the worker commits position 8 but crashes, and its
    replay from position 7 (a new producer) produces record 7's output again (the timer
    fired before the last commit: not again).  Three messages, two identities: the
    replayed output's equals the original's, the timer output's is another (a consumer
    deduplicating by identity keeps both real outputs; both had index 0 at offset 7)."""
    topic = f"{job}-out"
    kafka_broker.create_topic(topic, 1)
    spec = KafkaSink.model_validate(
        {"type": "kafka", "bootstrapServers": kafka_broker.bootstrap_servers, "topic": topic}
    )
    first = Outputs(KafkaSinkWriter(spec))
    first.emit_all(0, 7, "k", [(None, {"window": 60_000})], TimerOrigin("event", 60_000, "k"))
    first.emit_all(0, 7, "k", [(None, {"count": 3})])
    await first.flush(0)
    await first.close()
    replay = Outputs(KafkaSinkWriter(spec))
    replay.emit_all(0, 7, "k", [(None, {"count": 3})])
    await replay.flush(0)
    await replay.close()

    messages = kafka_broker.read_all(topic, 1)
    assert [msgspec.json.decode(m.value()) for m in messages] == [
        {"window": 60_000},
        {"count": 3},
        {"count": 3},
    ]
    timer, record, replayed = (kafka_identity(m) for m in messages)
    assert record == replayed
    assert timer != record
    assert header(messages[0], "keyshift-timer").startswith(b"event 60000 ")
