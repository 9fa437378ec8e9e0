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


def test_probe_timing_comes_from_the_values_and_the_endpoint_stays_the_charts() -> None:
    values = {"operator": {"probes": {"liveness": {"periodSeconds": 30, "failureThreshold": 5},
                                      "startup": {"initialDelaySeconds": 3}}}}  # fmt: skip
    deployment, _ = operator(values)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 5,
    }  # fmt: skip
    # the values merge over the defaults: the startup probe keeps its 2 minutes
    assert container["startupProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "initialDelaySeconds": 3, "periodSeconds": 2, "failureThreshold": 60,
    }  # fmt: skip


def test_spread_constraints_and_priority_class_of_the_operator() -> None:
    spread = [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
         "whenUnsatisfiable": "ScheduleAnyway"},
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"a": "b"}}},
    ]  # fmt: skip
    values = {"operator": {"replicas": 2, "topologySpreadConstraints": spread,
                           "priorityClassName": "system-cluster-critical"}}  # fmt: skip
    deployment, _ = operator(values)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    zone, host = pod["topologySpreadConstraints"]
    # without a selector: the operator's own pods; with one: as given
    assert zone["labelSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert zone["topologyKey"] == "topology.kubernetes.io/zone"
    assert host == spread[1]
    assert "topologySpreadConstraints" not in operator({})[0]["spec"]["template"]["spec"]


def test_disruption_budgets_only_where_a_drain_can_go_on() -> None:
    from tests.chart.render import find

    def budgets(values: Obj) -> dict[str, Obj]:
        objects = render(values)
        return {p["metadata"]["name"]: p for p in find(objects, "PodDisruptionBudget")}

    # one operator, a standalone store: none (a budget on a single pod blocks drains)
    assert budgets({}) == {}
    # replicas > 1: one operator pod at a time, selecting the operator's pods
    objects = render({"operator": {"replicas": 2}})
    deployment = one(objects, "Deployment")
    (pdb,) = find(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    # a Redis Cluster: one server at a time, selecting the store's servers
    objects = render({"stateStore": {"managed": {"mode": "cluster"}}})
    store = one(objects, "StatefulSet")
    (pdb,) = find(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": store["spec"]["selector"]}
    # and they can be turned off
    assert budgets({
        "operator": {"replicas": 2, "podDisruptionBudget": {"enabled": False}},
        "stateStore": {"managed": {"mode": "cluster", "podDisruptionBudget": {"enabled": False}}},
    }) == {}  # fmt: skip
