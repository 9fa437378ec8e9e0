"""The store crashes while a job runs (two worker processes, a standalone Valkey with
AOF ``everysec``): SIGKILLed and restarted during processing, during a rescale, and
restarted from an AOF copy a second old (acknowledged commits lost, as after an OS crash
or a failover to a lagging replica).  The workers retry, and a key group whose last
commits the store lost is fenced by the sequence, reloads and replays: the final state
is exact, every key group has the one owner the assignment names.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keyshift.controller.core.assignment import plan_assignment
from keyshift.store import Assignment, RedisStateStore, open_store
from keyshift.store.server import LocalServer
from tests.support import (
    WorkerProcess,
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    counter_manifest,
    deploy,
    positions,
    wait_for,
    write_manifest,
)

K = 8
LIMIT = 6000
SOURCE = {"seed": 31, "keys": 3000, "distribution": "zipf", "limit": LIMIT,
          "rate": {"shape": "constant", "recordsPerSecond": 4000}}  # fmt: skip
"""12 s of input: the crash comes in the middle of it."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    srv = LocalServer(tmp_path / "valkey", appendfsync="everysec").start()
    yield srv
    srv.stop()


async def start_job(
    server: LocalServer, job: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> tuple[RedisStateStore, Path, Assignment, list[WorkerProcess]]:
    manifest = write_manifest(
        tmp_path,
        counter_manifest(job, key_groups=K, parallelism=2, store_url=server.url,
                         source=SOURCE, checkpoint_interval="100ms"),
    )  # fmt: skip
    store = open_store(server.url, retry_seconds=60)
    first, workers = await deploy(store, job, K, 2, manifest, server.url, spawn)

    async def progress() -> bool:
        return min(await positions(store, job, K)) > LIMIT // 10

    await wait_for(progress, 30, "every key group to commit some progress")
    return store, manifest, first, workers


async def finish(store: RedisStateStore, job: str, assignment: Assignment) -> None:
    await wait_for(
        lambda: all_done(store, job, K, LIMIT), 90, "every record after the store came back"
    )
    await assert_exact_counter_state(store, job, SOURCE, K, LIMIT)
    await assert_owned_as_assigned(store, job, assignment)


async def test_store_sigkilled_and_restarted_during_processing(
    server: LocalServer, job: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    store, _, first, _ = await start_job(server, job, tmp_path, spawn)
    try:
        assert max(await positions(store, job, K)) < LIMIT, "the crash came too late"
        server.kill()
        await asyncio.to_thread(server.start)
        await finish(store, job, first)
    finally:
        await store.close()


async def test_store_sigkilled_and_restarted_during_a_rescale(
    server: LocalServer, job: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    store, manifest, _, _ = await start_job(server, job, tmp_path, spawn)
    try:
        spawn(manifest, 2, server.url)
        rescaled = Assignment(2, 3, plan_assignment(K, 3))
        await store.publish_assignment(job, rescaled, expected_generation=1)
        server.kill()  # the handoffs are under way
        await asyncio.to_thread(server.start)
        await finish(store, job, rescaled)
    finally:
        await store.close()


async def test_store_restarted_without_its_last_acknowledged_commits(
    server: LocalServer, job: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    """The store comes back from an AOF copy taken a second before the crash: the
    commits of that second are lost although they were acknowledged."""
    store, _, first, workers = await start_job(server, job, tmp_path, spawn)
    try:
        snapshot = tmp_path / "aof-copy"
        shutil.copytree(server.directory / "appendonlydir", snapshot)
        copied = await positions(store, job, K)

        async def moved_on() -> bool:
            now = await positions(store, job, K)
            return all(n > c for n, c in zip(now, copied, strict=True))

        await wait_for(moved_on, 30, "every key group to commit after the copy")
        assert max(await positions(store, job, K)) < LIMIT, "the crash came too late"
        server.kill()
        shutil.rmtree(server.directory / "appendonlydir")
        shutil.copytree(snapshot, server.directory / "appendonlydir")
        await asyncio.to_thread(server.start)
        await finish(store, job, first)
        # the workers found the loss: their next commits were fenced by the sequence
        # (the positions cannot be read back in between: the workers resume at once)
        fenced = sum(w.metric("keyshift_commits_fenced_total") for w in workers)
        assert fenced >= 1, "no commit was fenced: the store lost nothing"
    finally:
        await store.close()


async def test_store_rewound_after_the_input_ended_is_noticed_by_idle_owners(
    server: LocalServer, job: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    """The AOF copy is put back after every key group has finished its bounded input: no
    commit is left to be fenced, so the owners must notice the loss by themselves (they
    confirm their fence every 2 s and when they reconnect) and replay the lost records."""
    store, _, first, workers = await start_job(server, job, tmp_path, spawn)
    try:
        snapshot = tmp_path / "aof-copy"
        shutil.copytree(server.directory / "appendonlydir", snapshot)
        copied = await positions(store, job, K)
        assert max(copied) < LIMIT, "the copy came too late"
        await wait_for(lambda: all_done(store, job, K, LIMIT), 60, "every record, once")
        server.kill()
        shutil.rmtree(server.directory / "appendonlydir")
        shutil.copytree(snapshot, server.directory / "appendonlydir")
        await asyncio.to_thread(server.start)
        rewound = await positions(store, job, K)
        assert max(rewound) < LIMIT, f"the store did not lose the commits: {rewound}"
        await finish(store, job, first)
        lost = sum(w.metric("keyshift_store_lost_commits_total") for w in workers)
        assert lost >= 1, "the workers replayed without saying the store lost commits"
    finally:
        await store.close()
