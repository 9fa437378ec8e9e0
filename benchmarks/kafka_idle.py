"""The CPU an idle worker spends on its idle Kafka key groups.

One in-process worker (the in-memory store, the null sink) owns 16 key groups of an
empty topic on the test broker (Tansu). Its CPU use over ``--seconds`` is measured with
key groups that look at their buffer every 50 ms (``DATA_WAIT_SECONDS = 0.05``, the
behaviour before records woke key groups) and with the default (records wake the key
group; 1 s fallback), alternately, ``--rounds`` times each, in one run.

    python -m benchmarks.kafka_idle
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.results_md import replace_section
from examples.counter import job as counter_job
from keyshift.api.spec import StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.config import settings_from
from keyshift.runtime.kafka import source as kafka_source
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, MemoryStore
from tests.kafka_broker import KafkaBroker
from tests.support import wait_for

KEY_GROUPS = 16
POLLING = 0.05
DEFAULT = kafka_source.DATA_WAIT_SECONDS
MODES = {"polling every 50 ms": POLLING, "woken by records": DEFAULT}


async def idle_cpu(broker: KafkaBroker, data_wait: float, seconds: float) -> float:
    """The worker process's CPU use (fraction of a core) while its key groups idle."""
    kafka_source.DATA_WAIT_SECONDS = data_wait
    topic = f"idle-{secrets.token_hex(4)}"
    broker.create_topic(topic, KEY_GROUPS)
    manifest = StreamJob.model_validate({
        "metadata": {"name": "idle"},
        "spec": {
            "job": "examples.counter:job", "keyGroups": KEY_GROUPS, "checkpointInterval": "1s",
            "source": {"type": "kafka", "topic": topic,
                       "bootstrapServers": broker.bootstrap_servers},
            "sink": {"type": "null"},
        },
    })  # fmt: skip
    store = MemoryStore()
    await store.init_job("idle", KEY_GROUPS)
    first = Assignment(1, 1, plan_assignment(KEY_GROUPS, 1))
    await store.publish_assignment("idle", first, expected_generation=0)
    worker = Worker(settings_from(manifest, ordinal=0, store_url="memory://"), counter_job, store)
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: worker.acked_generation >= 1, 60, "the worker to run")
        await asyncio.sleep(2.0)  # settle: the claims' first steps
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        return (time.process_time() - cpu) / (time.monotonic() - wall)
    finally:
        worker.stop()
        await task
        kafka_source.DATA_WAIT_SECONDS = DEFAULT


async def run(rounds: int, seconds: float) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {label: [] for label in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "broker").start()
        try:
            for n in range(rounds):
                for label, wait in (
                    ("polling every 50 ms", POLLING),
                    ("woken by records", DEFAULT),
                ):
                    results[label].append(await idle_cpu(broker, wait, seconds))
                    print(f"round {n + 1}/{rounds}, {label}: "
                          f"{results[label][-1] * 100:.1f}% of a core", flush=True)  # fmt: skip
        finally:
            broker.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    results = asyncio.run(run(args.rounds, args.seconds))
    polling = statistics.median(results["polling every 50 ms"])
    woken = statistics.median(results["woken by records"])
    rows = "\n".join(
        f"| {label} | {statistics.median(v) * 100:.1f}% | "
        f"{', '.join(f'{x * 100:.1f}' for x in v)} |"
        for label, v in results.items()
    )
    body = (
        "`python -m benchmarks.kafka_idle` "
        f"({args.rounds} rounds of {args.seconds:g} s each, alternating; "
        f"{os.cpu_count()} cores). One in-process worker owning {KEY_GROUPS} key groups of an "
        "empty topic (Tansu): its CPU use, the Kafka client's poll thread included.\n\n"
        "| idle key groups | CPU, median (of one core) | each round (%) |\n|---|---:|---|\n"
        f"{rows}\n\nWaking key groups on arriving records instead of polling their buffers "
        f"uses {polling / woken:.1f}x less CPU when idle (by design, not measured here: a "
        "record reaching an idle key group no longer waits up to 50 ms for it to look)."
    )
    replace_section("Idle Kafka key groups", body)
    print(body)


if __name__ == "__main__":
    main()
