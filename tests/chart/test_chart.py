"""The chart renders, lints and validates for each kind of install.

The matrix is what platform teams choose between: the defaults (a managed standalone
Valkey), an external store, a managed Redis Cluster, the Prometheus Operator's monitors,
an operator watching a list of namespaces (with peering) and one watching the cluster.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from tests.chart.render import CHART, NAMESPACE, chart_crds, find, render
from tests.chart.validation import VERSIONS, problems
from tests.support import REPO

MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-store": {
        "stateStore": {
            "managed": {"enabled": False},
            "external": {"enabled": True, "url": "rediss://valkey.data:6380", "password": "pw"},
        }
    },
    "cluster-store": {"stateStore": {"managed": {"mode": "cluster"}}},
    "monitors": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "podMonitor": {"enabled": True},
            "scrapeAnnotations": True,
        }
    },
    "namespaced-rbac": {"operator": {"replicas": 2, "namespaces": ["team-a", "team-b"]}},
    "cluster-rbac": {"operator": {"replicas": 3, "scope": "cluster"}},
    "everything-configured": {
        "imagePullSecrets": ["regcred", {"name": "mirror"}],
        "operator": {
            "replicas": 2,
            "priorityClassName": "system-cluster-critical",
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "ScheduleAnyway",
                }
            ],
            "probes": {"liveness": {"initialDelaySeconds": 5, "periodSeconds": 20}},
        },
        "stateStore": {"managed": {"mode": "cluster"}},
        "metrics": {
            "serviceMonitor": {
                "enabled": True,
                "scrapeTimeout": "10s",
                "relabelings": [
                    {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
                ],
            },
            "podMonitor": {
                "enabled": True,
                "metricRelabelings": [
                    {"sourceLabels": ["__name__"], "regex": "python_gc_.*", "action": "drop"}
                ],
            },
        },
    },
}


@pytest.mark.parametrize("values", MATRIX.values(), ids=MATRIX.keys())
def test_lints_strictly_without_errors(values: dict[str, Any]) -> None:
    for kube in ("v1.30.0", f"v{VERSIONS[-1]}"):
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=kube)
        errors = [m for m in report["messages"] if m["severity"] >= 2]  # warning or error
        assert not errors and not report["errors"], (kube, report)


@pytest.mark.parametrize("values", MATRIX.values(), ids=MATRIX.keys())
def test_every_manifest_validates_strictly(values: dict[str, Any]) -> None:
    objects = render(values)
    assert objects
    found = [p for obj in objects for version in VERSIONS for p in problems(obj, version)]
    assert not found, "\n".join(found)


def test_validation_catches_a_misplaced_field() -> None:
    """The validators above do reject what an API server would (a field in the wrong place)."""
    deployment = find(render(), "Deployment")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["runAsNonRoot"] = True
    assert "runAsNonRoot" in " ".join(problems(deployment, VERSIONS[0]))
    monitors = render(MATRIX["monitors"])
    pod_monitor = find(monitors, "PodMonitor")[0]
    pod_monitor["spec"]["podMetricsEndpoints"][0]["honourLabels"] = True
    assert problems(pod_monitor, VERSIONS[0])


def test_objects_go_where_they_belong() -> None:
    objects = render(MATRIX["namespaced-rbac"])
    by_kind = {(o["kind"], o["metadata"].get("namespace")) for o in objects}
    for namespace in ("team-a", "team-b"):
        for kind in ("Role", "RoleBinding", "KopfPeering", "Secret"):
            assert (kind, namespace) in by_kind
    assert ("Deployment", NAMESPACE) in by_kind
    assert not find(objects, "ClusterRole")
    cluster = render(MATRIX["cluster-rbac"])
    assert find(cluster, "ClusterRole") and find(cluster, "ClusterKopfPeering")
    assert not find(cluster, "Role") and not find(cluster, "KopfPeering")


def test_chart_crds_are_the_repositorys_crds() -> None:
    """`helm install` installs the same CRDs as `kubectl apply -f crds/`, byte for byte."""
    chart = {name: path.read_bytes() for name, path in chart_crds().items()}
    repo = {p.name: p.read_bytes() for p in sorted((REPO / "crds").glob("*.yaml"))}
    assert chart.keys() == repo.keys()
    stale = [name for name in chart if chart[name] != repo[name]]
    assert not stale, f"charts/keyshift/crds differs from crds/ in {stale}: copy crds/*.yaml over"
