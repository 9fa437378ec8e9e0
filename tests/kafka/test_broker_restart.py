"""The Kafka broker restarts, keeping its data, while a job reads from it and writes
to it.

Tansu stores in S3 here (``moto_server`` on loopback), so a restarted broker has
every record it acknowledged. The broker is stopped while two workers process;
they back off (not ready) and resume when it is back; more input arrives after
the restart. The state is exact, and every input record's output is in the output
topic (identified by its origin headers).

The broker is stopped with SIGTERM, not SIGKILL: SIGKILLed, Tansu 0.6 with S3
storage loses records it acknowledged to an idempotent producer (the batch in
flight at the kill; reproduced with a plain confluent-kafka producer, none lost
without idempotence), which no client can make up for. See docs/reliability.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keyshift.store import open_store
from keyshift.store.server import LocalServer
from tests.kafka.test_kafka_jobs import GENERATOR, fill, kafka_manifest, origins
from tests.kafka_broker import KafkaBroker, S3Server, S3ServerUnavailable
from tests.support import (
    WorkerProcess,
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    deploy,
    positions,
    ready,
    wait_for,
    write_manifest,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    try:
        s3 = S3Server(tmp_path / "s3").start()
    except S3ServerUnavailable as exc:  # provisioned from PyPI on first use
        pytest.skip(f"no S3 server for the broker's storage: {exc}")
    broker = KafkaBroker(tmp_path / "tansu", storage=s3)
    try:
        yield broker.start()
    finally:
        broker.stop()
        s3.stop()


async def test_a_broker_restart_loses_nothing(
    standalone_server: LocalServer,
    durable_broker: KafkaBroker,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    broker, k, half = durable_broker, 4, 1000
    broker.create_topic(f"{job}-in", k)
    broker.create_topic(f"{job}-out", 2)
    fill(broker, f"{job}-in", k, 0, half)
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        kafka_manifest(job, bootstrap=broker.bootstrap_servers, key_groups=k,
                       parallelism=2, store_url=url),
    )  # fmt: skip
    store = open_store(url, retry_seconds=10)
    try:
        assignment, workers = await deploy(store, job, k, 2, manifest, url, spawn)

        async def some_progress() -> bool:
            return min(await positions(store, job, k)) > 0

        await wait_for(some_progress, 60, "every key group to commit some progress")
        await asyncio.to_thread(broker.stop)

        async def not_ready() -> bool:
            return not any(ready(w) for w in workers)

        await wait_for(not_ready, 30, "the workers to report the broker gone")
        await asyncio.to_thread(broker.start)
        # the restarted broker kept the first half: the second half follows it
        fill(broker, f"{job}-in", k, half, 2 * half)

        async def finished() -> bool:
            return await all_done(store, job, k, 2 * half)

        await wait_for(finished, 120, "every record of every partition to be processed")
        assert all(ready(w) for w in workers)
        await assert_exact_counter_state(store, job, GENERATOR, k, 2 * half)
        await assert_owned_as_assigned(store, job, assignment)
        out = broker.read_all(f"{job}-out", 2)
        missing = {(kg, offset) for kg in range(k) for offset in range(2 * half)} - origins(out)
        assert not missing, f"{len(missing)} inputs have no output, e.g. {sorted(missing)[:8]}"
    finally:
        await store.close()
