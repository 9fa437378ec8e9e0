"""A Redis Cluster master dies while a job runs, and its replica takes over.

Three masters with one replica each; two worker processes run the counter. First the
victim master's replica falls behind: it is stopped (SIGSTOP) and the master drops it
(``repl-timeout`` 1 s), so the commits the master acknowledges from then on exist on
the master alone, as with a lagging replica. Then the master is SIGKILLed and the
replica resumed: it is promoted (``cluster-node-timeout`` 2 s) without those commits.
The workers' clients follow the new topology; each key group whose last commits the
failover lost is fenced by its sequence, reloads and replays, never applies a commit
on a gap. The final state is exact; every key group has the one owner the assignment
names.

In the ``idle`` variant the input has ended before the failover: every key group is
caught up with nothing to commit, so no commit can be fenced; the owners notice the loss
by confirming their fence (every 2 s, and when they reconnect) and replay.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keyshift.store import keys, open_store
from keyshift.store.server import LocalCluster, LocalServer
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

pytestmark = pytest.mark.slow

K = 8
LIMIT = 8000
SOURCE = {"seed": 17, "keys": 3000, "distribution": "zipf", "limit": LIMIT,
          "rate": {"shape": "constant", "recordsPerSecond": 4000}}  # fmt: skip
"""16 s of input: the failover comes in the middle of it."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster", masters=3, replicas=1).start()
    yield c
    for node in c.nodes:  # a test that failed midway may leave one stopped
        if node.pid is not None:
            os.kill(node.pid, signal.SIGCONT)
    c.stop()


def info(node: LocalServer, section: str) -> dict[str, str]:
    with node.client() as c:
        return {k: str(v) for k, v in c.info(section).items()}


def master_of(cluster: LocalCluster, key: str) -> int:
    """The index (in ``cluster.nodes``) of the master serving ``key``'s slot."""
    with cluster.nodes[0].client() as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        for first, last, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                port = int(primary[1])
                return next(i for i, n in enumerate(cluster.nodes) if n.port == port)
    raise AssertionError(f"no master serves slot {slot}")


@pytest.mark.parametrize("idle", [False, True], ids=["processing", "idle"])
async def test_a_master_killed_its_replica_promoted_without_the_last_commits(
    cluster: LocalCluster,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
    idle: bool,
) -> None:
    masters = cluster.nodes[: cluster.masters]
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in masters)
    served_by = {kg: master_of(cluster, keys.meta(job, kg)) for kg in range(K)}
    victim_index = max(set(served_by.values()), key=list(served_by.values()).count)
    victim = cluster.nodes[victim_index]
    replica = cluster.nodes[cluster.masters + victim_index]  # LocalCluster's pairing
    on_victim = [kg for kg, m in served_by.items() if m == victim_index]
    assert info(replica, "replication")["role"] == "slave"

    manifest = write_manifest(
        tmp_path,
        counter_manifest(job, key_groups=K, parallelism=2, store_url=url,
                         source=SOURCE, checkpoint_interval="100ms"),
    )  # fmt: skip
    store = open_store(url, retry_seconds=60)
    try:
        assignment, workers = await deploy(store, job, K, 2, manifest, url, spawn)

        async def progress() -> bool:
            return min(await positions(store, job, K)) > LIMIT // 10

        await wait_for(progress, 30, "every key group to commit some progress")

        # the replica falls behind: stopped, then dropped by its master
        with replica.client() as c:
            c.config_set("cluster-replica-validity-factor", 0)  # may fail over however late
        with victim.client() as c:
            c.config_set("repl-timeout", 1)
        assert replica.pid is not None
        os.kill(replica.pid, signal.SIGSTOP)

        async def replica_dropped() -> bool:
            return info(victim, "replication")["connected_slaves"] == "0"

        await wait_for(replica_dropped, 20, "the master to drop its stopped replica")
        dropped_at = await positions(store, job, K)

        async def committed_on_the_master_alone() -> bool:
            now = await positions(store, job, K)
            return all(now[kg] > dropped_at[kg] for kg in on_victim)

        if idle:
            assert min(dropped_at[kg] for kg in on_victim) < LIMIT, "the replica fell too late"
            await wait_for(lambda: all_done(store, job, K, LIMIT), 60, "the end of the input")
        else:
            await wait_for(committed_on_the_master_alone, 20, "commits the replica never gets")
            assert max(await positions(store, job, K)) < LIMIT, "the failover came too late"

        victim.kill()
        os.kill(replica.pid, signal.SIGCONT)

        async def promoted() -> bool:
            return info(replica, "replication")["role"] == "master" and all(
                cluster.info(n)["cluster_state"] == "ok"
                for n in cluster.nodes
                if n.process is not None
            )

        await wait_for(promoted, 30, "the replica to be promoted")

        await wait_for(
            lambda: all_done(store, job, K, LIMIT), 90, "every record after the failover"
        )
        await assert_exact_counter_state(store, job, SOURCE, K, LIMIT)
        await assert_owned_as_assigned(store, job, assignment)
        # the lost commits were found: the key groups' next commits (or, idle, their fence
        # checks) were fenced by the sequence
        lost = sum(w.metric("keyshift_store_lost_commits_total") for w in workers)
        assert lost >= 1, "no worker found a lost commit: the failover lost nothing"
    finally:
        await store.close()
