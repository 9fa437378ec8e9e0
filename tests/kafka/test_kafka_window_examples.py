"""The windowed examples over Kafka (``examples/kafka/*.yaml``): two workers read the
generator's records from an 8-partition topic and write window results and late records
to topics; the final results and the late records are exactly the generator's
expectation (see ``tests/runtime/test_window_jobs.py`` for how at-least-once outputs
are read)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from keyshift.api.spec import GeneratorSource, StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.faults import ENV
from keyshift.runtime.kafka.admin import fill_topic
from keyshift.runtime.sources.generator import Generator
from keyshift.store import Assignment, open_store
from keyshift.store.server import LocalServer
from tests.kafka.test_kafka_jobs import header, kafka_identity
from tests.kafka_broker import KafkaBroker
from tests.runtime.test_window_jobs import (
    EXAMPLES,
    OOO_MS,
    Example,
    K,
    assert_deduplicable,
)
from tests.support import REPO, WorkerProcess, wait_for, write_manifest


def kafka_manifest(example: Example, name: str, bootstrap: str, url: str) -> dict[str, Any]:
    """The example's Kafka manifest with the test's topics, broker and input size."""
    path = REPO / "examples" / "kafka" / Path(example.manifest).name
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
    raw["metadata"]["name"] = name
    spec = raw["spec"]
    spec.update(keyGroups=K, parallelism=2, checkpointInterval="200ms")
    spec["time"].update(outOfOrderness=f"{OOO_MS}ms", idleTimeout="1s")
    for part, topic in [(spec["source"], "in"), (spec["sink"], "out"),
                        (spec["sideOutputs"]["late"], "late")]:  # fmt: skip
        part.update(bootstrapServers=bootstrap, topic=f"{name}-{topic}")
    spec["source"]["deadLetterTopic"] = f"{name}-dlq"
    spec["stateStore"] = {"url": url}
    return raw


def generator_source(example: Example) -> GeneratorSource:
    raw: dict[str, Any] = yaml.safe_load((REPO / example.manifest).read_text())
    return GeneratorSource.model_validate({**raw["spec"]["source"], **example.source})


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
async def test_window_example_over_kafka_is_exact_through_a_sigkill(
    example: Example,
    standalone_server: LocalServer,
    kafka_broker: KafkaBroker,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    name = f"w-{time.time_ns() % 10**8:08d}"
    url = standalone_server.url
    bootstrap = kafka_broker.bootstrap_servers
    source = generator_source(example)
    assert source.limit is not None
    limit = source.limit
    # event times in the past: once the input is consumed, idle key groups' watermarks
    # pass every window
    span = Generator(source, K, 0.0).scheduled(0, limit - 1)
    created_at = time.time() - span - 60
    for topic, partitions in [("in", K), ("out", 2), ("late", 2), ("dlq", 1)]:
        kafka_broker.create_topic(f"{name}-{topic}", partitions)
    fill_topic(bootstrap, f"{name}-in", Generator(source, K, created_at), start=0, stop=limit)
    manifest = write_manifest(tmp_path, kafka_manifest(example, name, bootstrap, url))
    assert StreamJob.model_validate(yaml.safe_load(manifest.read_text())).spec.job == (
        f"examples.{example.module.__name__.rpartition('.')[2]}:job"
    )
    store = open_store(url, retry_seconds=10)
    try:
        await store.init_job(name, K)
        assignment = Assignment(1, 2, plan_assignment(K, 2))
        await store.publish_assignment(name, assignment, expected_generation=0)
        # worker 0 SIGKILLs itself right before its second commit after windows fired, their
        # outputs produced: they are produced again by the replay after its restart
        w0 = spawn(manifest, 0, url, http=False, env={ENV: "commit.before.fired@2"})
        spawn(manifest, 1, url, http=False)

        async def every_window_closed() -> bool:
            if w0.died_by_itself():
                w0.env[ENV] = ""
                w0.start()
            infos = [await store.key_group_info(name, kg) for kg in range(K)]
            return all(i.position == limit and i.timers == 0 for i in infos)

        await wait_for(every_window_closed, 90, "every record and every window")
    finally:
        await store.delete_job(name)
        await store.close()

    assert w0.self_kills == 1
    outputs = kafka_broker.read_all(f"{name}-out", 2)
    late = kafka_broker.read_all(f"{name}-late", 2)
    assert_deduplicable(
        [(kafka_identity(m), int(header(m, "keyshift-key-group")), msgspec.json.decode(m.value()))
         for m in outputs]
    )  # fmt: skip
    total_late = 0
    for kg in range(K):
        expected = example.expected(source, kg, created_at)
        mine = [m for m in outputs if int(header(m, "keyshift-key-group")) == kg]
        got = example.final([msgspec.json.decode(m.value()) for m in mine])
        assert got == expected.results, f"key group {kg}"
        late_offsets = sorted(
            {int(header(m, "keyshift-offset")) for m in late
             if int(header(m, "keyshift-key-group")) == kg}
        )  # fmt: skip
        assert late_offsets == expected.late, f"key group {kg}"
        total_late += len(expected.late)
    assert total_late, "no late record: the input proves less than the test says"
