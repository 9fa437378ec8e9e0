"""Exactly-once under faults: SIGKILL at random moments and at precise crash points
(during commits and handoffs), rescales meanwhile, and a paused (zombie) worker.

Each test ends by comparing the store with the exactly computed expectation.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

from keyshift.api.names import worker_name
from keyshift.controller.core.assignment import plan_assignment
from keyshift.store import Assignment, RedisStateStore, open_store
from keyshift.store.server import LocalServer
from tests.support import (
    WorkerProcess,
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    counter_manifest,
    ready,
    wait_for,
    write_manifest,
)

KEY_GROUPS = 12


async def _chaos(
    store: RedisStateStore,
    job: str,
    workers: list[WorkerProcess],
    *,
    limit: int,
    kill_every: tuple[float, float] | None,
    rescale_every: float,
    rng: random.Random,
    deadline: float = 90.0,
) -> Assignment:
    """Kill (if asked) and restart workers, rescale 3 <-> 2, until every record is processed.

    Workers that die by themselves (crash points) are restarted too.  Returns
    the last published assignment.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    generation = 1
    assignment = Assignment(generation, 3, plan_assignment(KEY_GROUPS, 3))
    await store.publish_assignment(job, assignment, expected_generation=0)
    next_kill = started + (rng.uniform(*kill_every) if kill_every else float("inf"))
    next_rescale = started + rescale_every
    while not await all_done(store, job, KEY_GROUPS, limit):
        now = loop.time()
        if now - started > deadline:
            infos = await store.list_key_groups(job)
            acks = await store.worker_generations(job)
            raise AssertionError(
                f"the job did not finish under faults; assignment {assignment}, acks {acks}, "
                + "; ".join(f"{i.key_group}: {i.owner or '-'} @{i.position}" for i in infos)
            )
        for worker in workers:
            if worker.died_by_itself():
                worker.start()
        if kill_every and now >= next_kill:
            victim = rng.choice(workers)
            victim.kill()
            # restart at once or after a short outage (the assignment keeps its key groups)
            await asyncio.sleep(rng.choice([0.0, 0.0, 0.2, 0.5]))
            victim.start()
            next_kill = loop.time() + rng.uniform(*kill_every)
        if now >= next_rescale:
            parallelism = 2 if assignment.parallelism == 3 else 3
            assignment = Assignment(
                generation + 1, parallelism, plan_assignment(KEY_GROUPS, parallelism)
            )
            await store.publish_assignment(job, assignment, expected_generation=generation)
            generation += 1
            next_rescale = now + rescale_every
        await asyncio.sleep(0.05)
    return assignment


async def _settled(store: RedisStateStore, job: str, assignment: Assignment) -> bool:
    try:
        await assert_owned_as_assigned(store, job, assignment)
    except AssertionError:
        return False
    return True


async def test_random_sigkills_during_rescales_keep_state_exact(
    standalone_server: LocalServer,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    limit = 4000
    source = {
        "seed": 3, "keys": 3000, "distribution": "zipf", "limit": limit,
        "rate": {"recordsPerSecond": 4000},
    }  # fmt: skip
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        counter_manifest(job, key_groups=KEY_GROUPS, parallelism=3, store_url=url, source=source),
    )
    store = open_store(url, retry_seconds=10)
    try:
        await store.init_job(job, KEY_GROUPS)
        workers = [spawn(manifest, i, url, http=False) for i in range(3)]
        rng = random.Random(20261202)
        final = await _chaos(
            store, job, workers, limit=limit, kill_every=(0.3, 0.9), rescale_every=2.0, rng=rng
        )
        kills = sum(w.kills for w in workers)
        assert kills >= 12, f"only {kills} kills"

        await wait_for(lambda: _settled(store, job, final), 30, "the last assignment to settle")
        await assert_exact_counter_state(store, job, source, KEY_GROUPS, limit)
        print(f"random SIGKILLs: {kills}")
    finally:
        await store.close()


async def test_crashes_inside_commits_and_handoffs_keep_state_exact(
    standalone_server: LocalServer,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    """Workers SIGKILL themselves right before/after a commit reaches the store (the
    reply lost), between final commit and release, after release, after a claim."""
    limit = 3000
    source = {
        "seed": 5, "keys": 2000, "distribution": "uniform", "limit": limit,
        "rate": {"recordsPerSecond": 4000},
    }  # fmt: skip
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        counter_manifest(job, key_groups=KEY_GROUPS, parallelism=3, store_url=url, source=source),
    )
    crash = (
        "commit.before=0.004,commit.after=0.006,release.before=0.25,release.after=0.2,"
        "claim.after=0.05"
    )
    store = open_store(url, retry_seconds=10)
    try:
        await store.init_job(job, KEY_GROUPS)
        # each worker's first incarnation crashes at one given point for sure; later
        # incarnations at random points
        first = ["commit.after@4", "commit.before@3", "release.before@1"]
        workers = [
            spawn(manifest, i, url, http=False, env={"KEYSHIFT_CRASH_POINTS": first[i]})
            for i in range(3)
        ]
        for worker in workers:
            worker.env["KEYSHIFT_CRASH_POINTS"] = crash
        final = await _chaos(
            store, job, workers, limit=limit, kill_every=None, rescale_every=1.0,
            rng=random.Random(7),
        )  # fmt: skip

        # a worker may still crash on its last handoff: keep restarting until it settles
        async def settled() -> bool:
            for worker in workers:
                if worker.died_by_itself():
                    worker.start()
            return await _settled(store, job, final)

        await wait_for(settled, 40, "the last assignment to settle")
        await assert_exact_counter_state(store, job, source, KEY_GROUPS, limit)

        logs = "".join(w.log_path.read_text(errors="replace") for w in workers)
        points = ("commit.before", "commit.after", "release.before", "release.after", "claim.after")
        seen = {p: logs.count(f"crash point {p}:") for p in points}
        crashes = sum(w.self_kills for w in workers)
        print(f"crash points hit: {seen}")
        assert crashes >= 8, seen
        assert seen["commit.after"] >= 1 and seen["commit.before"] >= 1, seen
        assert seen["release.before"] >= 1, seen
    finally:
        await store.close()


async def test_paused_worker_is_fenced_when_it_resumes(
    standalone_server: LocalServer,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    key_groups, limit = 8, 6000
    source = {
        "seed": 9, "keys": 1000, "distribution": "zipf", "limit": limit,
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
        g1 = Assignment(1, 2, plan_assignment(key_groups, 2))
        await store.publish_assignment(job, g1, expected_generation=0)
        zombie, survivor = (spawn(manifest, i, url) for i in range(2))

        async def both_ready() -> bool:
            return ready(zombie) and ready(survivor)

        await wait_for(both_ready, 20, "both workers to run generation 1")
        moved = g1.owned_by(0)
        epochs_before = {kg: (await store.key_group_info(job, kg)).epoch for kg in moved}

        zombie.pause()
        # failover: every key group to worker 1, the zombie's claimed by force
        g2 = Assignment(
            generation=2, parallelism=1, owners=(1,) * key_groups, forced=frozenset(moved)
        )
        await store.publish_assignment(job, g2, expected_generation=1)

        async def survivor_runs_g2() -> bool:
            acks = await store.worker_generations(job)
            return acks.get(worker_name(job, 1)) == 2

        await wait_for(survivor_runs_g2, 20, "the survivor to claim the zombie's key groups")
        for kg in moved:
            info = await store.key_group_info(job, kg)
            assert info.epoch > epochs_before[kg]
            assert info.owner == worker_name(job, 1)

        zombie.resume()

        async def zombie_fenced() -> bool:
            try:
                return zombie.metric("keyshift_commits_fenced_total") >= 1
            except Exception:
                return False

        await wait_for(zombie_fenced, 20, "the zombie's commits to be rejected")

        async def zombie_stood_down() -> bool:
            return ready(zombie) and zombie.metric("keyshift_key_groups_owned") == 0

        await wait_for(zombie_stood_down, 20, "the zombie to run generation 2, owning nothing")

        await wait_for(
            lambda: all_done(store, job, key_groups, limit), 60, "all records to be processed"
        )
        await assert_exact_counter_state(store, job, source, key_groups, limit)
        await assert_owned_as_assigned(store, job, g2)
    finally:
        await store.close()
