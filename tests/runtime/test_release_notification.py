"""The new owner of a key group learns of its release by notification, not by polling.

A worker waits to claim key groups that a stand-in old owner (the test) holds; its
claim poll is an hour long, so only the release's notification can make the claim
prompt. The release hands the key group to the waiting worker (it claims it with the
worker's token) and the notification carries that claim: the worker makes no claim of
its own. A release whose notification is lost still ends in a claim through the (here
shortened) poll, the handover's own; a key group handed to a worker that no longer waits
for it (a newer assignment) is released again. Against Valkey/Redis standalone, a real
Redis Cluster (sharded pub/sub on the job's slot, published by the releaser after its
script) and the in-process MemoryStore.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from examples.counter import job as counter_job
from keyshift.api.spec import StreamJob
from keyshift.runtime.config import settings_from
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, Claim, MemoryStore, keys
from tests.support import wait_for

KEY_GROUPS = 2
HOUR = 3600.0


def manifest(job: str) -> StreamJob:
    return StreamJob.model_validate(
        {
            "metadata": {"name": job},
            "spec": {
                "job": "examples.counter:job",
                "keyGroups": KEY_GROUPS,
                "source": {"seed": 4, "keys": 50, "limit": 1000,
                           "rate": {"recordsPerSecond": 200}},
                "checkpointInterval": "50ms",
            },
        }
    )  # fmt: skip


@asynccontextmanager
async def waiting_worker(
    store: Any, job: str, claim_poll_seconds: float
) -> AsyncIterator[tuple[Worker, list[Claim]]]:
    """Worker 0 of ``job``, given every key group at generation 1 while a stand-in old
    owner still holds them: it subscribes to their releases and waits."""
    await store.init_job(job, KEY_GROUPS)
    held = [await store.claim(job, kg, "old-owner", generation=0) for kg in range(KEY_GROUPS)]
    await store.publish_assignment(job, Assignment(1, 1, (0,) * KEY_GROUPS), expected_generation=0)
    m = manifest(job)
    worker = Worker(
        settings_from(m, ordinal=0, store_url="redis://unused"), counter_job, store,
        claim_poll_seconds=claim_poll_seconds,
    )  # fmt: skip
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(
            lambda: worker.releases_subscribed and worker.release_waits == set(range(KEY_GROUPS)),
            20,
            "the worker to subscribe to the job's releases and wait for both",
        )
        yield worker, held
    finally:
        worker.stop()
        async with asyncio.timeout(30):
            await task


async def claimed(store: Any, job: str, kg: int, worker: Worker) -> bool:
    return bool((await store.key_group_info(job, kg)).owner == worker.name)


async def test_the_claim_follows_the_release_without_waiting_for_the_poll(
    worker_store: Any, job: str
) -> None:
    async with waiting_worker(worker_store, job, HOUR) as (worker, held):
        for kg, claim in enumerate(held):
            released_at = time.time()
            await worker_store.release(job, kg, epoch=claim.epoch, token=claim.token, generation=1)
            # an hour-long poll: only the notification can bring the claim this soon
            await wait_for(partial(claimed, worker_store, job, kg, worker), 10,
                           f"key group {kg} claimed after its release")  # fmt: skip
            info = await worker_store.key_group_info(job, kg)
            assert info.claimed_at is not None and info.claimed_at >= released_at
            assert info.epoch == claim.epoch + 1  # the release's claim: the worker made none
        await wait_for(
            lambda: worker.acked_generation == 1 and worker.release_waits == set(),
            10,
            "the worker to run generation 1",
        )
        for kg in range(KEY_GROUPS):  # the new owner's timeline, as the controller reads it
            await wait_for(partial(has_mark, worker_store, job, kg, "loaded"), 10,
                           "the new owner's handoff marks")  # fmt: skip
            info = await worker_store.key_group_info(job, kg)
            assert info.claim_via == "handed"
            assert info.claim_marks["learned"] <= info.claim_marks["loaded"]


async def has_mark(store: Any, job: str, kg: int, mark: str) -> bool:
    return mark in (await store.key_group_info(job, kg)).claim_marks


async def release_silently(store: Any, job: str, kg: int, generation: int) -> None:
    """Release ``kg`` as the release does, but with its notification lost."""
    if isinstance(store, MemoryStore):
        group = store._kg(job, kg)
        group.token, group.owner, group.released_generation = "", "", generation
        return
    await store._client.hset(
        keys.meta(job, kg),
        mapping={"token": "", "owner": "", "released_generation": generation,
                 "released_at": repr(time.time())},
    )  # fmt: skip


async def test_a_lost_notification_still_ends_in_a_claim_by_the_poll(
    worker_store: Any, job: str
) -> None:
    async with waiting_worker(worker_store, job, 0.3) as (worker, _):
        await release_silently(worker_store, job, 0, 1)
        await wait_for(lambda: claimed(worker_store, job, 0, worker), 10,
                       "key group 0 claimed by the poll")  # fmt: skip
        await wait_for(lambda: has_mark(worker_store, job, 0, "loaded"), 10,
                       "the new owner's handoff marks")  # fmt: skip
        assert (await worker_store.key_group_info(job, 0)).claim_via == "polled"
        assert worker.release_waits == {1}  # still waiting, subscribed, for the other
        assert worker.releases_subscribed


async def hand_over_silently(store: Any, job: str, kg: int, claim: Claim, generation: int) -> None:
    """Release ``kg`` as the release does, handing it to the claimer waiting for it, with
    the announcement lost."""
    if isinstance(store, MemoryStore):
        watchers = store._release_watchers.pop(job)
        try:
            await store.release(
                job, kg, epoch=claim.epoch, token=claim.token, generation=generation
            )
        finally:
            store._release_watchers[job] = watchers
        return
    # release.lua with no channel (as on a cluster, where the caller publishes): unannounced
    args = [claim.epoch, claim.token, generation, repr(time.time()), "", kg, ""]
    await store._script("release", [keys.meta(job, kg), keys.names(job, kg)], args, job, kg)


async def test_a_handover_whose_notification_is_lost_is_found_by_the_poll(
    worker_store: Any, job: str
) -> None:
    async with waiting_worker(worker_store, job, 0.3) as (worker, held):
        await hand_over_silently(worker_store, job, 0, held[0], 1)
        info = await worker_store.key_group_info(job, 0)
        assert (info.owner, info.epoch) == (worker.name, held[0].epoch + 1)  # handed over
        await wait_for(lambda: has_mark(worker_store, job, 0, "loaded"), 10,
                       "the new owner's handoff marks")  # fmt: skip
        info = await worker_store.key_group_info(job, 0)
        # the poll's claim (same token) was answered with the handover's: no second epoch
        assert (info.claim_via, info.epoch) == ("polled", held[0].epoch + 1)
        assert worker.runners[0].epoch == info.epoch
        assert worker.release_waits == {1}


async def test_a_key_group_handed_to_a_worker_that_stopped_waiting_is_released_again(
    worker_store: Any, job: str
) -> None:
    async with waiting_worker(worker_store, job, HOUR) as (worker, held):
        # a newer assignment gives key group 0 to worker 1 (not running): 0 stops waiting
        await worker_store.publish_assignment(job, Assignment(2, 2, (1, 0)), expected_generation=1)
        await wait_for(lambda: worker.release_waits == {1}, 10, "worker 0 to stop waiting for 0")
        # the old owner, still on generation 1, releases: the store hands it to worker 0,
        # whose claim (generation 1) was the newest waiting
        await worker_store.release(job, 0, epoch=held[0].epoch, token=held[0].token, generation=1)
        # worker 0 releases it at generation 2, for worker 1
        await wait_for(
            lambda: released_at_generation(worker_store, job, 0, 2),
            10,
            "key group 0 released again",
        )
        info = await worker_store.key_group_info(job, 0)
        assert (info.owner, info.epoch) == ("", held[0].epoch + 2)  # handed over, re-claimed


async def released_at_generation(store: Any, job: str, kg: int, generation: int) -> bool:
    info = await store.key_group_info(job, kg)
    return bool(info.owner == "" and info.released_generation == generation)
