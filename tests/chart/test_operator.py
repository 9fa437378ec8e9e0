"""The operator's Deployment runs ``keyshift operator`` as the values ask.

Its command line is parsed by the CLI's own parser, so a flag the CLI does not know
fails here rather than in a crash-looping pod.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit

from keyshift.controller.cli import build_parser
from tests.chart.render import NAMESPACE, one, render

Obj = dict[str, Any]


def operator(values: Obj) -> tuple[Obj, argparse.Namespace]:
    deployment = one(render(values), "Deployment")
    container: Obj = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["keyshift"]
    return deployment, build_parser().parse_args(container["args"])


def test_one_standalone_operator_watches_the_release_namespace() -> None:
    deployment, args = operator({})
    assert deployment["spec"]["replicas"] == 1
    assert args.command == "operator"
    assert args.namespace == [NAMESPACE] and not args.all_namespaces
    assert args.standalone and args.peering is None


def test_listed_namespaces_are_watched() -> None:
    _, args = operator({"operator": {"namespaces": ["team-a", "team-b"]}})
    assert args.namespace == ["team-a", "team-b"]


def test_scope_cluster_watches_every_namespace() -> None:
    _, args = operator({"operator": {"scope": "cluster"}})
    assert args.all_namespaces and args.namespace == []


def test_probes_hit_kopfs_liveness_endpoint_and_the_service_the_metrics() -> None:
    values = {"operator": {"healthPort": 8181, "metricsPort": 9191}}
    deployment, args = operator(values)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    liveness = urlsplit(args.liveness)
    assert (liveness.port, liveness.path) == (ports["health"], "/healthz") == (8181, "/healthz")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert args.metrics_port == ports["metrics"] == 9191
    service = one(render(values), "Service", "keyshift-operator-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}


def test_replicas_elect_a_leader_through_the_charts_peering_object() -> None:
    values = {"operator": {"replicas": 3, "peeringLifetime": 30}}
    deployment, args = operator(values)
    assert deployment["spec"]["replicas"] == 3
    assert not args.standalone
    assert args.peering == one(render(values), "KopfPeering")["metadata"]["name"]
    assert args.peering_lifetime == 30
    assert isinstance(args.priority, int)
