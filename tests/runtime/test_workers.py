"""Worker processes run the counter job against a real Valkey; the final state is exact."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from pathlib import Path

from keyshift.controller.core.assignment import plan_assignment
from keyshift.store import Assignment, open_store
from keyshift.store.server import LocalServer
from tests.support import (
    WorkerProcess,
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    counter_manifest,
    deploy,
    ready,
    wait_for,
    write_manifest,
)


async def test_two_workers_compute_the_exact_counts(
    standalone_server: LocalServer,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    key_groups, limit = 8, 5000
    source = {"seed": 7, "keys": 2000, "distribution": "zipf", "limit": limit}
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        counter_manifest(job, key_groups=key_groups, parallelism=2, store_url=url, source=source,
                         sink={"type": "log", "path": "out.jsonl"}),
    )  # fmt: skip
    store = open_store(url, retry_seconds=10)
    try:
        assignment, workers = await deploy(store, job, key_groups, 2, manifest, url, spawn)

        await wait_for(
            lambda: all_done(store, job, key_groups, limit),
            60,
            "both workers to process every record",
        )
        await assert_exact_counter_state(store, job, source, key_groups, limit)
        await assert_owned_as_assigned(store, job, assignment)

        async def all_ready() -> bool:
            return all(ready(w) for w in workers)

        await wait_for(all_ready, 10, "both workers to be ready")
        assert workers[0].metric("keyshift_records_processed_total") > 0
        assert workers[0].metric("keyshift_key_groups_owned") == 4
        assert workers[0].metric("keyshift_assignment_generation") == 1
        health = workers[1].get("/healthz").json()
        assert health["status"] == "ok" and health["key_groups"] == [4, 5, 6, 7]
        # a prober that asks often (the local controller) keeps one connection, and so
        # one thread of the worker's server, for all its requests
        assert workers[1].http_port is not None
        connection = http.client.HTTPConnection("127.0.0.1", workers[1].http_port, timeout=5)
        try:
            sockets = []
            for path in ("/readyz", "/healthz", "/metrics", "/readyz"):
                connection.request("GET", path)
                response = connection.getresponse()
                response.read()
                assert response.status == 200 and not response.will_close, path
                sockets.append(connection.sock)
            assert len(set(map(id, sockets))) == 1  # one connection throughout
        finally:
            connection.close()
        # every record produced one output line naming its origin (at least once)
        origins = set()
        for line in (tmp_path / "out.jsonl").read_text().splitlines():
            head = line.split(',"value"', 1)[0]
            origins.add(head)
        assert len(origins) == key_groups * limit
    finally:
        await store.close()


async def test_three_workers_rescale_while_processing(
    standalone_server: LocalServer,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    """2 -> 3 -> 2 workers while records flow; nothing lost, nothing counted twice."""
    key_groups, limit = 12, 3000
    source = {
        "seed": 11, "keys": 5000, "distribution": "uniform", "limit": limit,
        "rate": {"recordsPerSecond": 6000},
    }  # fmt: skip
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        counter_manifest(job, key_groups=key_groups, parallelism=2, store_url=url, source=source),
    )
    store = open_store(url, retry_seconds=10)
    try:
        await store.init_job(job, key_groups)
        workers = [spawn(manifest, i, url) for i in range(3)]

        async def all_ready() -> bool:
            return all(ready(w) for w in workers)

        await wait_for(all_ready, 20, "three idle workers to be ready")
        for generation, parallelism in enumerate((2, 3, 2), start=1):
            assignment = Assignment(
                generation, parallelism, plan_assignment(key_groups, parallelism)
            )
            await store.publish_assignment(job, assignment, expected_generation=generation - 1)

            async def acked(g: int = generation) -> bool:
                acks = await store.worker_generations(job)
                return all(acks.get(f"{job}-worker-{i}") == g for i in range(3))

            await wait_for(acked, 20, f"every worker to run generation {generation}")
            progress = await store.list_key_groups(job)
            assert not all(kg.position == limit for kg in progress), "rescale came too late"

        await wait_for(
            lambda: all_done(store, job, key_groups, limit), 60, "all records to be processed"
        )
        await assert_exact_counter_state(store, job, source, key_groups, limit)
        await assert_owned_as_assigned(store, job, assignment)
        assert workers[2].metric("keyshift_key_groups_owned") == 0
    finally:
        await store.close()
