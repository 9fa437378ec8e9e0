"""Scale to zero and wake on Kafka input: ``keyshift run`` over a real Kafka-compatible
broker (Tansu). While no worker runs, the controller fetches from every partition at the
position committed in the store: records beyond it wake the job.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.controller.local.localjob import LocalJob
from tests.kafka.test_kafka_jobs import GENERATOR, fill, kafka_manifest
from tests.kafka_broker import KafkaBroker
from tests.support import all_done, assert_exact_counter_state, positions, wait_for, write_manifest

pytestmark = pytest.mark.slow

K = 4


async def test_a_kafka_job_scales_to_zero_and_wakes_when_records_arrive(
    tmp_path: Path, local_jobs: list[LocalJob], kafka_broker: KafkaBroker
) -> None:
    doc = kafka_manifest(
        "napper", bootstrap=kafka_broker.bootstrap_servers, key_groups=K, parallelism=1,
        store_url="redis://127.0.0.1:1", sink={"type": "null"},
    )  # fmt: skip
    doc["spec"]["autoscaler"] = {
        "enabled": True, "minParallelism": 0, "maxParallelism": 2, "scaleToZeroAfter": "3s",
        "wakeCheckSeconds": "500ms", "metricsWindowSeconds": 2, "intervalSeconds": 1,
        "cooldownSeconds": 2,
    }  # fmt: skip
    kafka_broker.create_topic("napper-in", K)
    fill(kafka_broker, "napper-in", K, 0, 200)
    job = LocalJob(tmp_path, write_manifest(tmp_path, doc), "napper").start()
    local_jobs.append(job)
    idle = await asyncio.to_thread(
        job.wait_status, lambda s: s["phase"] == "Idle", 90, "the job to scale to zero"
    )
    assert (idle["parallelism"], idle["workers"]) == (0, [])
    store = job.store()
    assert await positions(store, "napper", K) == [200] * K
    await assert_exact_counter_state(store, "napper", GENERATOR, K, 200)

    fill(kafka_broker, "napper-in", K, 200, 300)
    woken = await asyncio.to_thread(
        job.wait_status,
        lambda s: any(r["from"] == 0 and r["reason"] == "autoscaler" for r in s["rescales"]),
        60, "the job to wake for the new records",
    )  # fmt: skip
    decisions = woken["autoscaler"]["decisions"]
    wake = next(d for d in decisions if d["reason"] == "input_waiting")
    assert 0 < wake["inputs"]["backlog"] <= 100 * K
    await wait_for(lambda: all_done(store, "napper", K, 300), 60, "the new records")
    await assert_exact_counter_state(store, "napper", GENERATOR, K, 300)
    await store.close()
    assert job.interrupt() == 0
