"""``helm install`` rejects bad values with a message that names the value and the problem.

Every case goes through the Helm engine's own schema validation (as ``helm install
--set ...`` does), so the messages are the ones a user sees.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from tests.chart.render import loaded, render

REJECTED: dict[str, tuple[dict[str, Any], str]] = {
    "wrong type": (
        {"operator": {"replicas": "two"}},
        "at '/operator/replicas': got string, want integer",
    ),
    "unknown key": (
        {"operator": {"replica": 2}},
        "at '/operator': additional properties 'replica' not allowed",
    ),
    "unknown top-level key (a typo)": (
        {"stateStor": {}},
        "additional properties 'stateStor' not allowed",
    ),
    "negative replica count": (
        {"operator": {"replicas": -1}},
        "at '/operator/replicas': minimum: got -1, want 1",
    ),
    "unknown scope": (
        {"operator": {"scope": "global"}},
        "at '/operator/scope'",
    ),
    "too small a Redis Cluster": (
        {"stateStore": {"managed": {"mode": "cluster", "cluster": {"masters": 2}}}},
        "at '/stateStore/managed/cluster/masters': minimum: got 2, want 3",
    ),
    "appendfsync other than Valkey's": (
        {"stateStore": {"managed": {"appendfsync": "sometimes"}}},
        "at '/stateStore/managed/appendfsync'",
    ),
    "a password in the store URL": (
        {"stateStore": {"external": {"url": "redis://:hunter2@valkey:6379"}}},
        "at '/stateStore/external/url'",
    ),
    "an external store without a URL": (
        {"stateStore": {"managed": {"enabled": False}, "external": {"enabled": True}}},
        "at '/stateStore/external/url': minLength: got 0, want 1",
    ),
    "a bad resource quantity": (
        {"operator": {"resources": {"requests": {"memory": "lots"}}}},
        "at '/operator/resources/requests/memory'",
    ),
    "an imagePullSecret object without a name": (
        {"imagePullSecrets": [{"nam": "regcred"}]},
        "at '/imagePullSecrets/0'",
    ),
    "an empty imagePullSecret name": (
        {"imagePullSecrets": [""]},
        "at '/imagePullSecrets/0'",
    ),
    "a probe field the chart does not set": (
        {"operator": {"probes": {"liveness": {"httpGet": {"path": "/"}}}}},
        "at '/operator/probes/liveness': additional properties 'httpGet' not allowed",
    ),
    "a probe period of zero": (
        {"operator": {"probes": {"readiness": {"periodSeconds": 0}}}},
        "at '/operator/probes/readiness/periodSeconds': minimum: got 0, want 1",
    ),
    "a relabeling with an unknown action": (
        {"metrics": {"podMonitor": {"relabelings": [{"action": "rename"}]}}},
        "at '/metrics/podMonitor/relabelings/0/action'",
    ),
    "a bad scrape timeout": (
        {"metrics": {"serviceMonitor": {"scrapeTimeout": "soon"}}},
        "at '/metrics/serviceMonitor/scrapeTimeout'",
    ),
    "a spread constraint without its topology key": (
        {
            "operator": {
                "topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]
            }
        },
        "at '/operator/topologySpreadConstraints/0'",
    ),
    "a bad scrape interval": (
        {"metrics": {"podMonitor": {"enabled": True, "interval": "often"}}},
        "at '/metrics/podMonitor/interval'",
    ),
}


@pytest.mark.parametrize(("values", "message"), REJECTED.values(), ids=REJECTED.keys())
def test_bad_values_are_rejected_with_a_specific_message(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    assert message in str(caught.value)


CONTRADICTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "two stores": (
        {"stateStore": {"external": {"enabled": True, "url": "redis://valkey:6379"}}},
        "stateStore: enable either managed or external, not both",
    ),
    "namespaces with scope cluster": (
        {"operator": {"scope": "cluster", "namespaces": ["a"]}},
        "operator.namespaces is for scope namespace",
    ),
    "an existing Secret and a password": (
        {"stateStore": {"managed": {"auth": {"existingSecret": "s", "password": "p"}}}},
        "give either existingSecret or password, not both",
    ),
    "no ServiceAccount to use": (
        {"serviceAccount": {"create": False}},
        "serviceAccount.name is required when serviceAccount.create is false",
    ),
}


@pytest.mark.parametrize(("values", "message"), CONTRADICTIONS.values(), ids=CONTRADICTIONS.keys())
def test_contradictory_values_fail_the_render_with_the_reason(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(values)
    assert message in str(caught.value)


def _paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Every value path the schema describes (objects with properties, recursively)."""
    out: set[str] = set()
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        out.add(path)
        out |= _paths(sub, f"{path}.")
    return out


def _value_paths(values: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, value in values.items():
        path = f"{prefix}{name}"
        out.add(path)
        if isinstance(value, dict) and value and name not in FREE_FORM:
            out |= _value_paths(value, f"{path}.")
    return out


FREE_FORM = {"resources", "labels", "annotations", "podAnnotations", "podLabels",
             "nodeSelector", "affinity"}  # fmt: skip


def test_the_schema_covers_every_value_and_describes_it() -> None:
    with loaded() as chart:
        schema = chart.schema
        defaults = chart.values
    assert schema is not None
    described = _paths(schema)
    missing = _value_paths(defaults) - described
    assert not missing, f"values.yaml has values the schema does not describe: {sorted(missing)}"

    def undescribed(node: dict[str, Any], path: str) -> list[str]:
        found = [] if node.get("description") or not path else [path]
        for name, sub in node.get("properties", {}).items():
            found += undescribed(sub, f"{path}.{name}".lstrip("."))
        return found

    assert not undescribed(schema, ""), "values without a description"


def test_the_defaults_pass_the_schema() -> None:
    with loaded() as chart:
        chart.validate_schema(chart.values)


ACCEPTED: dict[str, dict[str, Any]] = {
    "imagePullSecrets as names": {"imagePullSecrets": ["regcred"]},
    "imagePullSecrets as Kubernetes has them": {"imagePullSecrets": [{"name": "regcred"}]},
    "both kinds of imagePullSecrets": {"imagePullSecrets": ["a", {"name": "b"}]},
}


@pytest.mark.parametrize("values", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_both_shapes_of_image_pull_secrets_are_accepted(values: dict[str, Any]) -> None:
    pods = [o["spec"]["template"]["spec"] for o in render(values)
            if o["kind"] in ("Deployment", "StatefulSet")]  # fmt: skip
    names = [s if isinstance(s, str) else s["name"] for s in values["imagePullSecrets"]]
    assert pods and all(pod["imagePullSecrets"] == [{"name": n} for n in names] for pod in pods)
