"""Two operator replicas with kopf peering: one acts, the other takes over when it dies.

Emulator only: on a real cluster the chart runs the replicas.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshift.store.server import LocalServer
from tests.e2e.harness import OperatorProcess, real_cluster_settings
from tests.e2e.kubelet import PodRunner
from tests.k8s.emulator import KubernetesEmulator
from tests.support import REPO

pytestmark = pytest.mark.skipif(
    real_cluster_settings() is not None, reason="operator replicas are the chart's on a cluster"
)

LIFETIME = 4  # seconds a silent peer counts as alive: the takeover delay


def streamjob(name: str, store_url: str, parallelism: int) -> str:
    return yaml.safe_dump({
        "apiVersion": "keyshift.dev/v1alpha1",
        "kind": "StreamJob",
        "metadata": {"name": name},
        "spec": {
            "job": "examples.counter:job", "keyGroups": 4, "parallelism": parallelism,
            "source": {"type": "generator", "keys": 100, "rate": {"recordsPerSecond": 200}},
            "stateStore": {"url": store_url}, "failoverAfter": "2s",
        },
    })  # fmt: skip


def test_one_replica_acts_and_the_other_takes_over(
    k8s: KubernetesEmulator, pod_runner: PodRunner, standalone_server: LocalServer,
    tmp_path: Path,
) -> None:  # fmt: skip
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "kopf-peering.yaml"))
    k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "default"},
    }))  # fmt: skip

    def replica(priority: int) -> OperatorProcess:
        options = ("--peering", "default", "--priority", str(priority),
                   "--peering-lifetime", str(LIFETIME))  # fmt: skip
        return OperatorProcess(k8s.kubeconfig, tmp_path / f"operator-{priority}.log",
                               options=options).start()  # fmt: skip

    leader, standby = replica(200), replica(100)
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

        leader.kill()
        k8s.patch("streamjobs.keyshift.dev", name, {"spec": {"parallelism": 2}})
        k8s.wait_for(
            lambda: status().get("phase") == "Running" and status().get("parallelism") == 2,
            60, "the standby to take over and rescale",
        )  # fmt: skip
        assert name in standby.output(tail=500)
    finally:
        leader.stop()
        standby.stop()
