"""The operator's autoscaler: Prometheus scrapes the worker pods, the job scales itself,
and the decisions show in the StreamJob's status and events.

Emulator only (the pod runner's ports are local): the test points its Prometheus at
the pods' local ports, as a ServiceMonitor would at the pods.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshift.api.names import API_VERSION
from keyshift.store.server import LocalServer
from tests.e2e.harness import OperatorProcess, real_cluster_settings
from tests.e2e.kubelet import PodRunner
from tests.k8s.emulator import KubernetesEmulator
from tests.prometheus_server import PrometheusServer
from tests.support import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        real_cluster_settings() is not None, reason="needs the pod runner's local ports"
    ),
]

LOW, HIGH, STEP_AT = 400, 3600, 12  # records/s; busy_counter: ~0.1 and ~0.9 of a worker


def test_the_operator_scales_a_job_from_prometheus(
    k8s: KubernetesEmulator, pod_runner: PodRunner, prometheus: PrometheusServer,
    standalone_server: LocalServer, pod_targets: None, tmp_path: Path,
) -> None:  # fmt: skip
    """``pod_targets`` keeps Prometheus scraping the pods the operator starts."""
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    operator = OperatorProcess(k8s.kubeconfig, tmp_path / "operator.log").start()
    name = f"e2e-{secrets.token_hex(3)}"
    points = [[0, LOW], [STEP_AT, LOW], [STEP_AT + 1, HIGH]]
    doc = {
        "apiVersion": API_VERSION, "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "job": "examples.busy_counter:job", "keyGroups": 16, "parallelism": 1,
            "source": {"type": "generator", "keys": 2000,
                       "rate": {"shape": "points", "points": points}},
            "stateStore": {"url": standalone_server.url}, "checkpointInterval": "200ms",
            "autoscaler": {
                "enabled": True, "minParallelism": 1, "maxParallelism": 4,
                "metricsWindowSeconds": 8, "intervalSeconds": 3, "cooldownSeconds": 8,
                "catchUpSeconds": 20, "prometheus": {"url": prometheus.url},
            },
        },
    }  # fmt: skip
    try:
        k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(doc))

        def status() -> dict[str, Any]:
            obj = k8s.get("streamjobs.keyshift.dev", name) or {}
            s: dict[str, Any] = obj.get("status") or {}
            return s

        def scaled_up() -> dict[str, Any] | None:
            s = status()
            ups = [r for r in s.get("rescales") or []
                   if r["reason"] == "autoscaler" and r["to"] > 1]  # fmt: skip
            return s if ups and s.get("phase") == "Running" else None

        try:
            final = k8s.wait_for(scaled_up, 90, "the autoscaler to scale the job up")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\nautoscaler: {status().get('autoscaler', {}).get('last')}\n"
                f"{operator.output()}"
            ) from exc
        auto = final["autoscaler"]
        assert auto["enabled"] and auto["mode"] == "scale"
        assert any(d["action"] == "scale_up" for d in auto["decisions"])
        assert final["parallelism"] > 1
        # kubectl get's "Desired" column: the autoscaler's choice, not spec.parallelism (1)
        assert final["desiredParallelismSource"] == "autoscaler"
        assert final["desiredParallelism"] == final["parallelism"]
        # kubectl get's "Lag" column, from the autoscaler's last window
        k8s.wait_for(lambda: isinstance(status().get("lag"), int), 30, "status.lag")
        events = [e for e in k8s.list("events", "default")
                  if (e.get("involvedObject") or {}).get("name") == name]  # fmt: skip
        assert any(e.get("reason") == "ScalingDecision" for e in events)
    finally:
        operator.stop()
