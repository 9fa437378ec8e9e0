"""Two operator replicas with kopf peering: one acts; when it dies in the middle of a
rescale, the other takes over and completes the rescale, and nothing is lost.

Emulator only: on a real cluster the chart runs the replicas.
"""

from __future__ import annotations

import secrets
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshift.api.names import API_VERSION
from keyshift.controller.core.assignment import plan_assignment
from keyshift.store import open_store
from keyshift.store.server import LocalServer
from tests.e2e.harness import OperatorProcess, real_cluster_settings
from tests.e2e.kubelet import PodRunner
from tests.k8s.emulator import KubernetesEmulator
from tests.support import (
    REPO,
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    real_cluster_settings() is not None, reason="operator replicas are the chart's on a cluster"
)

LIFETIME = 4  # seconds a silent peer counts as alive: the takeover delay
KEY_GROUPS = 6
LIMIT = 6000  # records per key group: the job ends, so the final state is exact
SOURCE = {"type": "generator", "keys": 300, "rate": {"recordsPerSecond": 1200},
          "limit": LIMIT, "seed": 3}  # fmt: skip
"""30 s of input: the rescale comes in the middle of it."""


def streamjob(name: str, store_url: str, parallelism: int) -> str:
    return yaml.safe_dump({
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": name},
        "spec": {
            "job": "examples.counter:job", "keyGroups": KEY_GROUPS, "parallelism": parallelism,
            "source": SOURCE, "stateStore": {"url": store_url}, "failoverAfter": "2s",
            "checkpointInterval": "200ms",
        },
    })  # fmt: skip


async def test_the_leader_dies_during_a_rescale_and_the_standby_completes_it(
    k8s: KubernetesEmulator, pod_runner: PodRunner, standalone_server: LocalServer,
    tmp_path: Path,
) -> None:  # fmt: skip
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "kopf-peering.yaml"))
    k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "default"},
    }))  # fmt: skip

    def replica(priority: int, **env: str) -> OperatorProcess:
        options = ("--peering", "default", "--priority", str(priority),
                   "--peering-lifetime", str(LIFETIME))  # fmt: skip
        return OperatorProcess(k8s.kubeconfig, tmp_path / f"operator-{priority}.log",
                               options=options).start(**env)  # fmt: skip

    # the leader dies right after it publishes its second assignment (the first is the
    # deployment's): in the middle of the rescale 1 -> 3, its key groups handing off
    leader = replica(200, KEYSHIFT_CRASH_POINTS="executor.publish.after@2")
    standby = replica(100)
    store = open_store(standalone_server.url, retry_seconds=10)
    try:

        def peers() -> dict[str, Any]:
            obj = k8s.get("kopfpeerings.kopf.dev", "default") or {}
            return {k: v for k, v in (obj.get("status") or {}).items() if isinstance(v, dict)}

        both = k8s.wait_for(lambda: len(peers()) == 2 and peers(), 30, "both replicas to peer")
        assert sorted(p["priority"] for p in both.values()) == [100, 200]

        name = f"e2e-{secrets.token_hex(3)}"
        k8s.kubectl("apply", "--validate=false", "-f", "-",
                    input=streamjob(name, standalone_server.url, 1))  # fmt: skip

        def status() -> dict[str, Any]:
            obj = k8s.get("streamjobs.keyshift.dev", name) or {}
            s: dict[str, Any] = obj.get("status") or {}
            return s

        k8s.wait_for(lambda: status().get("phase") == "Running", 60, "the job to run")
        # the standby stays out of it: it never handled the job
        assert name not in standby.output(tail=500), standby.output()
        assert name in leader.output(tail=500)

        k8s.patch("streamjobs.keyshift.dev", name, {"spec": {"parallelism": 3}})
        assert leader.wait_exit(60) == -signal.SIGKILL, leader.output()
        done = k8s.wait_for(
            lambda: status().get("phase") == "Running" and status().get("parallelism") == 3
            and status().get("rescale") is None and status(),
            60, "the standby to take over and complete the rescale",
        )  # fmt: skip
        assert name in standby.output(tail=500)
        last = done["rescales"][-1]
        assert (last["from"], last["to"], last["outcome"]) == (1, 3, "succeeded"), last

        await wait_for(lambda: all_done(store, name, KEY_GROUPS, LIMIT), 90, "every record")
        spec = {k: v for k, v in SOURCE.items() if k != "type"}
        await assert_exact_counter_state(store, name, spec, KEY_GROUPS, LIMIT)
        assignment = await store.get_assignment(name)
        assert assignment is not None and assignment.owners == plan_assignment(KEY_GROUPS, 3)
        await assert_owned_as_assigned(store, name, assignment)
    finally:
        leader.stop()
        standby.stop()
        await store.close()
