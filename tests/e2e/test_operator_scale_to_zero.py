"""Scale to zero on Kubernetes: the StreamJob goes ``Idle`` at parallelism 0 (the
StatefulSet at 0 replicas, no pod) when its input stops, and wakes when input comes back,
with exact state.

Emulator only, like the autoscaler's test (Prometheus scrapes the pod runner's local
ports).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshift.api.names import API_VERSION
from keyshift.store import open_store
from keyshift.store.server import LocalServer
from tests.e2e.harness import OperatorProcess, real_cluster_settings
from tests.e2e.kubelet import PodRunner
from tests.k8s.emulator import KubernetesEmulator
from tests.prometheus_server import PrometheusServer
from tests.support import REPO, all_done, assert_exact_counter_state, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        real_cluster_settings() is not None, reason="needs the pod runner's local ports"
    ),
]

K, LIMIT, WAKE_AT = 4, 300, 55.0
SOURCE: dict[str, Any] = {
    "seed": 3, "keys": 400, "limit": LIMIT,
    "rate": {"shape": "points", "points": [[0, 400], [2, 400], [2, 0], [WAKE_AT, 0],
                                           [WAKE_AT, 800], [WAKE_AT + 60, 800]]},
}  # fmt: skip


def test_the_operator_scales_a_job_to_zero_and_wakes_it_on_input(
    k8s: KubernetesEmulator, pod_runner: PodRunner, prometheus: PrometheusServer,
    standalone_server: LocalServer, pod_targets: None, tmp_path: Path,
) -> None:  # fmt: skip
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    operator = OperatorProcess(k8s.kubeconfig, tmp_path / "operator.log").start()
    name = f"e2e-{secrets.token_hex(3)}"
    doc = {
        "apiVersion": API_VERSION, "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "job": "examples.counter:job", "keyGroups": K, "parallelism": 1,
            "source": {"type": "generator", **SOURCE}, "sink": {"type": "null"},
            "stateStore": {"url": standalone_server.url}, "checkpointInterval": "200ms",
            "autoscaler": {
                "enabled": True, "minParallelism": 0, "maxParallelism": 2,
                "scaleToZeroAfter": "3s", "wakeCheckSeconds": "500ms",
                "metricsWindowSeconds": 4, "intervalSeconds": 1, "cooldownSeconds": 2,
                "prometheus": {"url": prometheus.url},
            },
        },
    }  # fmt: skip

    def status() -> dict[str, Any]:
        s: dict[str, Any] = (k8s.get("streamjobs.keyshift.dev", name) or {}).get("status") or {}
        return s

    def wakes(s: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for r in s.get("rescales") or []
                if r["from"] == 0 and r["reason"] == "autoscaler"]  # fmt: skip

    try:
        k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(doc))
        started = time.time()
        try:
            idle = k8s.wait_for(lambda: (s := status()).get("phase") == "Idle" and s,
                                WAKE_AT - 10, "the job to scale to zero")  # fmt: skip
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{status().get('autoscaler', {}).get('last')}\n"
                                 f"{operator.output()}") from exc  # fmt: skip
        assert time.time() - started < WAKE_AT, "idle too late: the test proves nothing"
        assert idle["parallelism"] == 0
        ready = next(c for c in idle["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True" and "scaled to zero" in ready["message"]
        k8s.wait_for(lambda: not k8s.list("pods", "default"), 30, "every worker pod gone")
        sts = k8s.get("statefulset", f"{name}-worker") or {}
        assert sts["spec"]["replicas"] == 0

        woken = k8s.wait_for(lambda: (s := status()).get("phase") == "Running" and wakes(s) and s,
                             WAKE_AT + 60, "the job to wake on input")  # fmt: skip
        assert wakes(woken)[0]["outcome"] == "succeeded"
        assert any(d["reason"] == "input_waiting" for d in woken["autoscaler"]["decisions"])

        async def check() -> None:
            store = open_store(standalone_server.url)
            try:
                await wait_for(lambda: all_done(store, name, K, LIMIT), 60, "the whole input")
                await assert_exact_counter_state(store, name, SOURCE, K, LIMIT)
            finally:
                await store.close()

        asyncio.run(check())
    finally:
        operator.stop()
