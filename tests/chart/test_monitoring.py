"""Prometheus scraping (monitors or annotations) and the Grafana dashboard.

The PodMonitor must find the pods the operator creates (their labels and port name
come from ``kubernetes.objects``), and the dashboard must ask only for series the workers
and the operator export.
"""

from __future__ import annotations

import json
import re
from typing import Any

import prometheus_client
from prometheus_client.registry import CollectorRegistry

from keyshift.api.spec import StreamJobSpec
from keyshift.controller.core import metrics as operator_metrics
from keyshift.controller.kubernetes.objects import HTTP_PORT, selector_labels, worker_container
from keyshift.runtime.metrics import NAMESPACE_ENV, WorkerMetrics
from tests.chart.render import NAMESPACE, find, one, render

Obj = dict[str, Any]

MONITORS = {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}


# Series the dashboard shows that nothing exports yet; each must really be missing
# (test_not_yet_exported_series_are_still_missing), so that this list shrinks.
def worker_port_names() -> dict[str, int]:
    spec = StreamJobSpec.model_validate(
        {"job": "examples.counter:job", "keyGroups": 2, "source": {"type": "generator"},
         "stateStore": {"url": "redis://v:6379"}}
    )  # fmt: skip
    return {p["name"]: p["containerPort"] for p in worker_container({}, spec)["ports"]}


def test_the_pod_monitor_scrapes_the_operators_worker_pods_keeping_their_labels() -> None:
    monitor = one(render(MONITORS), "PodMonitor")
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= selector_labels("any-job").items()
    (endpoint,) = spec["podMetricsEndpoints"]
    assert worker_port_names()[endpoint["port"]] == HTTP_PORT
    # the workers' `streamjob` and `namespace` labels need no honorLabels: the target's
    # `namespace` (the pod's) is the StreamJob's, which the worker reads from the pod
    assert "honorLabels" not in endpoint
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    cluster = one(render({**MONITORS, "operator": {"scope": "cluster"}}), "PodMonitor")
    assert cluster["spec"]["namespaceSelector"] == {"any": True}


def test_the_service_monitor_scrapes_the_operators_metrics_service() -> None:
    objects = render(MONITORS)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service", "keyshift-operator-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    # the operator's `namespace` label is the StreamJob's, not the operator pod's
    assert endpoint["honorLabels"] is True


def test_the_workers_name_their_namespace_from_the_pod() -> None:
    spec = StreamJobSpec.model_validate(
        {"job": "examples.counter:job", "keyGroups": 2, "source": {"type": "generator"},
         "stateStore": {"url": "redis://v:6379"}}
    )  # fmt: skip
    env = {e["name"]: e for e in worker_container({}, spec)["env"]}
    assert env[NAMESPACE_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_no_monitors_unless_asked_and_annotations_for_plain_prometheus() -> None:
    objects = render({"metrics": {"scrapeAnnotations": True}})
    assert not find(objects, "PodMonitor") and not find(objects, "ServiceMonitor")
    template = one(objects, "Deployment")["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    assert "annotations" not in one(render(), "Deployment")["spec"]["template"]["metadata"]


def dashboard(values: Obj | None = None) -> tuple[Obj, Obj]:
    configmap = one(render(values), "ConfigMap", "keyshift-dashboard")
    board: Obj = json.loads(configmap["data"]["keyshift.json"])
    return configmap, board


def test_the_dashboard_is_found_by_grafanas_sidecar() -> None:
    configmap, board = dashboard()
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["uid"] == "keyshift"
    labelled, _ = dashboard({"grafana": {"dashboard": {"labels": {"my_dashboards": "yes"}}}})
    assert labelled["metadata"]["labels"]["my_dashboards"] == "yes"
    assert not find(
        render({"grafana": {"dashboard": {"enabled": False}}}),
        "ConfigMap",
        configmap["metadata"]["name"],
    )


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    _, board = dashboard()
    titles = [p["title"] for p in board["panels"]]
    for wanted in ("Parallelism", "Input and processed rate", "Lag per key group",
                   "State cache hit ratio", "Commit latency"):  # fmt: skip
        assert wanted in titles
    parallelism = board["panels"][titles.index("Parallelism")]
    assert any("desired" in t["legendFormat"] for t in parallelism["targets"])
    lag = board["panels"][titles.index("Lag per key group")]
    assert "key_group" in lag["targets"][0]["expr"]
    annotations = {a["name"]: a["expr"] for a in board["annotations"]["list"]}
    assert "keyshift_rescale_duration_seconds_count" in annotations["Rescales"]
    assert "keyshift_scaling_decisions_total" in annotations["Scaling decisions"]


def exported(registry: CollectorRegistry) -> set[str]:
    """The series names of every metric family in ``registry``, with their suffixes."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {
        f"{family.name}{suffix}"
        for family in registry.collect()
        for suffix in suffixes.get(family.type, [""])
    }


def exported_series() -> set[str]:
    assert operator_metrics.PARALLELISM is not None  # the module registered its metrics
    return exported(WorkerMetrics("job", "worker").registry) | exported(prometheus_client.REGISTRY)


def dashboard_series() -> set[str]:
    _, board = dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in board["annotations"]["list"]]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    return set(re.findall(r"\bkeyshift_[a-z_]+", " ".join(exprs)))


def test_the_dashboard_filters_by_namespace_and_streamjob() -> None:
    """Two StreamJobs named alike in two namespaces are told apart; the variables come
    from a worker's series, so a `keyshift run` scraped through its
    prometheus-targets.json (namespace `local`, no operator) fills them too; no query
    names the scrape job's `job` label."""
    _, board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["namespace"]["definition"] == (
        "label_values(keyshift_records_processed_total, namespace)"
    )
    assert variables["streamjob"]["definition"] == (
        'label_values(keyshift_records_processed_total{namespace=~"$namespace"}, streamjob)'
    )
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in board["annotations"]["list"]]
    for expr in exprs:
        selectors = re.findall(r"keyshift_[a-z_]+(\{[^}]*\})?", expr)
        assert selectors and all(
            'namespace=~"$namespace"' in s and 'streamjob=~"$streamjob"' in s for s in selectors
        ), expr
        assert not re.search(r"\bjob\b", expr), expr
    titles = {p["title"]: p for p in board["panels"]}
    failed = " ".join(t["expr"] for t in titles["Failed key groups"]["targets"])
    assert "keyshift_key_groups_failed" in failed
    cache = " ".join(t["expr"] for t in titles["State cache size"]["targets"])
    assert "keyshift_state_cache_bytes" in cache and "keyshift_state_cache_max_bytes" in cache
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboard_queries_only_exported_series() -> None:
    unknown = dashboard_series() - exported_series()
    assert not unknown, f"the dashboard asks for series nothing exports: {sorted(unknown)}"


def test_relabelings_and_scrape_timeout_are_configurable() -> None:
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    drop = [{"sourceLabels": ["__name__"], "regex": "python_gc_.*", "action": "drop"}]
    settings = {"scrapeTimeout": "10s", "relabelings": relabel, "metricRelabelings": drop}
    objects = render({"metrics": {
        "serviceMonitor": {"enabled": True, **settings},
        "podMonitor": {"enabled": True, **settings},
    }})  # fmt: skip
    (service,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    (pod,) = one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    for endpoint in (service, pod):
        assert endpoint["scrapeTimeout"] == "10s"
        assert endpoint["relabelings"] == relabel
        assert endpoint["metricRelabelings"] == drop
    # none by default: the Prometheus' timeout, the targets' labels as they are
    (default,) = one(render(MONITORS), "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert not {"scrapeTimeout", "relabelings", "metricRelabelings"} & set(default)
