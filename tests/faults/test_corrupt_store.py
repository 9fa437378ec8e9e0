"""Store keys edited or lost behind the job's back (a real Valkey, an in-process worker).

What a user must see: the affected key group stops, named with the error in the
worker's ``/healthz`` and ``keyshift_key_groups_failed``, logged once; nothing is
written on top of the bad data; the other key groups go on; and once the store is
repaired, the key group resumes by itself (retried with back-off). A store that may
evict keys is refused at start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from examples.counter import job as counter_job
from keyshift.api.spec import StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.config import settings_from
from keyshift.runtime.worker import Worker
from keyshift.store import (
    Assignment,
    RedisStateStore,
    StoreMisconfigured,
    keys,
    open_store,
)
from keyshift.store.server import LocalServer
from tests.support import all_done, assert_exact_counter_state, positions, wait_for

K = 4
LIMIT = 3000
SOURCE = {"seed": 8, "keys": 800, "distribution": "zipf", "limit": LIMIT,
          "rate": {"shape": "constant", "recordsPerSecond": 2000}}  # fmt: skip
"""6 s of input over the four key groups."""


def manifest(job: str, url: str, **state_store: Any) -> StreamJob:
    return StreamJob.model_validate(
        {
            "metadata": {"name": job},
            "spec": {
                "job": "examples.counter:job",
                "keyGroups": K,
                "source": {"type": "generator", **SOURCE},
                "stateStore": {"url": url, **state_store},
                "checkpointInterval": "100ms",
            },
        }
    )


@pytest.fixture
async def store(standalone_server: LocalServer) -> AsyncIterator[RedisStateStore]:
    s = open_store(standalone_server.url, retry_seconds=10)
    yield s
    await s.close()


@asynccontextmanager
async def worker_of(m: StreamJob, store: RedisStateStore) -> AsyncIterator[Worker]:
    """One worker in this process, owning every key group (generation 1)."""
    job = m.metadata.name
    await store.init_job(job, K)
    if await store.get_assignment(job) is None:
        await store.publish_assignment(
            job, Assignment(1, 1, plan_assignment(K, 1)), expected_generation=0
        )
    worker = Worker(settings_from(m, ordinal=0, store_url=store.url), counter_job, store)
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: worker.started.is_set() or task.done(), 10, "the worker")
        yield worker
    finally:
        worker.stop()
        async with asyncio.timeout(30):
            await task


def stopped_logs(caplog: pytest.LogCaptureFixture, kg: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(f"key group {kg} stopped")]  # fmt: skip


async def test_metadata_of_the_wrong_type_fails_the_key_group_visibly_until_repaired(
    store: RedisStateStore, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keyshift")
    await store._client.set(keys.meta(job, 1), "not a hash")
    async with worker_of(manifest(job, store.url), store) as worker:

        async def others_done() -> bool:
            infos = [await store.key_group_info(job, kg) for kg in (0, 2, 3)]
            return all(info.position == LIMIT for info in infos)

        await wait_for(others_done, 30, "the other key groups to finish")
        assert worker.failed_key_groups == [1]
        health = worker.health()
        assert health["status"] == "degraded"
        assert health["failed_key_groups"] == {
            "1": {"reason": "store", "offset": None, "error": "StoreCorrupt"}
        }
        assert worker.metrics.key_groups_failed._value.get() == 1
        failure = worker.store_failures.get(1)
        assert failure is not None and failure.attempts >= 2, "not retried"
        assert "wrong type" in failure.error and "wrong type" in stopped_logs(caplog, 1)[0]
        assert len(stopped_logs(caplog, 1)) == 1, "logged more than once"
        assert "never retrieved" not in caplog.text

        await store._client.delete(keys.meta(job, 1))  # repaired: a key group never run
        await wait_for(lambda: all_done(store, job, K, LIMIT), 30, "key group 1 after repair")
        await wait_for(lambda: worker.failed_key_groups == [], 5, "the failure to clear")
        assert worker.metrics.key_groups_failed._value.get() == 0
    await assert_exact_counter_state(store, job, SOURCE, K, LIMIT)


async def test_a_garbled_epoch_stops_the_key_group_with_the_field_named(
    store: RedisStateStore, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keyshift")
    async with worker_of(manifest(job, store.url), store) as worker:

        async def started() -> bool:
            return (await positions(store, job, K))[1] > 0

        await wait_for(started, 20, "key group 1 to commit")
        epoch = (await store.key_group_info(job, 1)).epoch
        await store._client.hset(keys.meta(job, 1), "epoch", "garbage")
        await wait_for(lambda: worker.failed_key_groups == [1], 10, "key group 1 to fail")
        assert worker.health()["failed_key_groups"]["1"]["error"] == "StoreCorrupt"
        assert "field epoch is not a whole number" in caplog.text
        stalled_at = (await store._client.hget(keys.meta(job, 1), "position")).decode()
        await wait_for(
            lambda: (failure := worker.store_failures.get(1)) is not None and failure.attempts >= 2,
            10,
            "a second attempt, after the back-off",
        )
        assert len(stopped_logs(caplog, 1)) == 1, "logged more than once"
        assert (await store._client.hget(keys.meta(job, 1), "position")).decode() == stalled_at

        await store._client.hset(keys.meta(job, 1), "epoch", epoch)  # repaired
        await wait_for(lambda: all_done(store, job, K, LIMIT), 30, "every record after repair")
    await assert_exact_counter_state(store, job, SOURCE, K, LIMIT)


async def test_deleted_metadata_is_refused_not_replayed_onto_the_state(
    store: RedisStateStore, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the worker re-claimed key group 1 as new, at position 0, and counted
    every record of it twice on top of the state still there."""
    async with worker_of(manifest(job, store.url), store) as worker:

        async def started() -> bool:
            return (await positions(store, job, K))[1] > LIMIT // 10

        await wait_for(started, 20, "key group 1 to commit some progress")
        await store._client.delete(keys.meta(job, 1))
        state_after_delete = {k: v async for k, v in store.scan_all(job, 1, "count")}
        await wait_for(lambda: worker.failed_key_groups == [1], 10, "key group 1 to fail")
        assert worker.health()["failed_key_groups"]["1"]["reason"] == "store"
        assert "metadata is missing" in caplog.text

        async def others_done() -> bool:
            done = await positions(store, job, K)
            return all(done[kg] == LIMIT for kg in (0, 2, 3))

        await wait_for(others_done, 30, "the other key groups to finish")
        assert await store._client.exists(keys.meta(job, 1)) == 0, "metadata re-created"
        assert {k: v async for k, v in store.scan_all(job, 1, "count")} == state_after_delete


@pytest.mark.parametrize("allow", [False, True])
async def test_a_store_that_evicts_is_refused_unless_allowed(
    standalone_server: LocalServer, job: str, allow: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with standalone_server.client() as c:
        c.config_set("maxmemory-policy", "allkeys-lru")
    store = open_store(standalone_server.url, retry_seconds=10)
    try:
        m = manifest(job, store.url, allowEviction=allow)
        if not allow:
            with pytest.raises(StoreMisconfigured, match="maxmemory-policy is 'allkeys-lru'"):
                async with worker_of(m, store):
                    pass
        else:
            async with worker_of(m, store) as worker:
                await wait_for(lambda: worker.ready, 10, "the worker to run")
            assert "may evict keys" in caplog.text
    finally:
        with standalone_server.client() as c:
            c.config_set("maxmemory-policy", "noeviction")
        await store.close()
