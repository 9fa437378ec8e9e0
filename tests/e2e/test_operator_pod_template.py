"""A StreamJob's ``spec.podTemplate`` reaches its StatefulSet, merged under the operator's
own settings, and needs the label on every Secret it names.

The real operator runs against the emulator with the pod runner and a real Valkey: a job
whose template mounts an unlabelled Secret is refused (``SecretNotAllowed``, naming the
volume) and nothing is deployed; once the Secret is labelled the job runs, and its
StatefulSet has the template's scheduling, registry credentials, ServiceAccount, volumes,
mounts, envFrom and resources, the shorthands over them, and the operator's restricted
security context and no API token; the operator's drift checks then leave it alone (the
merged template does not drift).

Emulator only: the test labels Secrets and counts the operator's requests.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshift.api.names import API_VERSION
from keyshift.controller.kubernetes.api import SECRET_LABEL
from keyshift.store.server import LocalServer
from tests.e2e.harness import OperatorProcess, real_cluster_settings
from tests.e2e.kubelet import PodRunner
from tests.k8s.emulator import KubernetesEmulator
from tests.support import REPO

Obj = dict[str, Any]

pytestmark = pytest.mark.skipif(
    real_cluster_settings() is not None, reason="labels Secrets in the emulator"
)

OPERATOR = "operator"  # the token of the operator's kubeconfig: its requests are logged


@pytest.fixture
def operator(k8s: KubernetesEmulator, pod_runner: PodRunner, tmp_path: Path) -> Iterator[Any]:
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    process = OperatorProcess(k8s.kubeconfig_for(OPERATOR), tmp_path / "operator.log").start()
    try:
        yield process
    finally:
        process.stop()


def apply(k8s: KubernetesEmulator, obj: Obj) -> None:
    k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(obj))


def status(k8s: KubernetesEmulator, name: str) -> Obj:
    s: Obj = (k8s.get("streamjobs.keyshift.dev", name) or {}).get("status") or {}
    return s


def ready(k8s: KubernetesEmulator, name: str) -> Obj:
    return next((c for c in status(k8s, name).get("conditions") or [] if c["type"] == "Ready"), {})


def wait(k8s: KubernetesEmulator, operator: OperatorProcess, what: str, cond: Any, t: float) -> Any:
    try:
        return k8s.wait_for(cond, t, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- operator\n{operator.output()}") from None


def statefulset_writes(k8s: KubernetesEmulator) -> list[str]:
    writes = ("create", "patch", "update")
    return [f"{r.verb} {r.name}" for r in k8s.requests_of(OPERATOR)
            if r.resource == "statefulsets" and r.verb in writes]  # fmt: skip


def secret_reads(k8s: KubernetesEmulator, secret: str) -> int:
    return sum(1 for r in k8s.requests_of(OPERATOR)
               if (r.verb, r.resource, r.name) == ("get", "secrets", secret))  # fmt: skip


TEMPLATE: Obj = {
    "metadata": {"labels": {"team": "data"}, "annotations": {"owner": "data@example.com"}},
    "spec": {
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccountName": "stream-jobs",
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"team": "data"}}}}]}},
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway"}],
        "priorityClassName": "streaming",
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "stream",
                         "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "template"},
        "volumes": [
            {"name": "certs", "secret": {"secretName": "pt-certs"}},
            {"name": "lookup", "configMap": {"name": "pt-lookup"}},
            {"name": "scratch", "emptyDir": {"sizeLimit": "256Mi"}},
        ],
        "containers": [{
            "name": "worker",
            "volumeMounts": [
                {"name": "certs", "mountPath": "/etc/certs", "readOnly": True},
                {"name": "lookup", "mountPath": "/data/lookup"},
                {"name": "scratch", "mountPath": "/scratch"},
            ],
            "envFrom": [{"configMapRef": {"name": "pt-lookup"}, "prefix": "LOOKUP_"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                          "limits": {"memory": "1Gi"}},
        }],
    },
}  # fmt: skip


def test_a_pod_template_reaches_the_statefulset_under_the_operators_settings(
    k8s: KubernetesEmulator, operator: OperatorProcess, standalone_server: LocalServer
) -> None:
    apply(k8s, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pt-lookup"},
                "data": {"REGION": "eu"}})  # fmt: skip
    apply(k8s, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pt-certs"},
                "data": {"ca.pem": base64.b64encode(b"not a real CA").decode()}})  # fmt: skip
    name = f"pt-{secrets.token_hex(3)}"
    apply(k8s, {
        "apiVersion": API_VERSION, "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "job": "examples.counter:job", "keyGroups": 4, "parallelism": 1,
            "source": {"type": "generator", "keys": 100, "rate": {"recordsPerSecond": 200}},
            "sink": {"type": "null"}, "stateStore": {"url": standalone_server.url},
            "checkpointInterval": "200ms", "failoverAfter": "2s",
            "podTemplate": TEMPLATE,
            # the shorthands, merged over the template
            "nodeSelector": {"pool": "stream"}, "podLabels": {"team": "platform"},
            "resources": {"limits": {"memory": "512Mi"}},
        },
    })  # fmt: skip

    # the template's Secret volume needs the label like any Secret the spec names
    def refused() -> Obj | None:
        condition = ready(k8s, name)
        return condition if condition.get("reason") == "SecretNotAllowed" else None

    condition = wait(k8s, operator, "the refusal", refused, 30)
    assert (
        "Secret default/pt-certs (podTemplate.spec.volumes[0] certs: secret)"
        in condition["message"]
    )
    assert k8s.get("statefulsets", f"{name}-worker") is None
    k8s.kubectl("label", "secret", "pt-certs", f"{SECRET_LABEL}=true")

    def running() -> bool:
        return (
            status(k8s, name).get("phase") == "Running" and ready(k8s, name).get("status") == "True"
        )

    wait(k8s, operator, "the job running", running, 60)
    sts = k8s.get("statefulsets", f"{name}-worker")
    assert sts is not None
    meta, pod = sts["spec"]["template"]["metadata"], sts["spec"]["template"]["spec"]
    assert meta["labels"]["team"] == "platform"  # podLabels wins over the template
    assert meta["labels"]["keyshift.dev/job"] == name  # the operator's win over both
    assert meta["annotations"]["owner"] == "data@example.com"
    template = TEMPLATE["spec"]
    for field in ("imagePullSecrets", "serviceAccountName", "affinity", "priorityClassName",
                  "tolerations"):  # fmt: skip
        assert pod[field] == template[field], field
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["keyshift.dev/job"] == name
    assert pod["nodeSelector"] == {"pool": "stream"}
    assert [v["name"] for v in pod["volumes"]] == ["config", "tmp", "certs", "lookup", "scratch"]
    (container,) = pod["containers"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == [
        "/etc/keyshift", "/tmp", "/etc/certs", "/data/lookup", "/scratch",
    ]  # fmt: skip
    assert container["envFrom"] == [{"configMapRef": {"name": "pt-lookup"}, "prefix": "LOOKUP_"}]
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"},
    }  # fmt: skip
    # kept whatever the template says: no API token, the restricted security context
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # the worker pod runs with it
    pods = k8s.list("pods", "default")
    assert any(p["metadata"]["name"] == f"{name}-worker-0" for p in pods)

    # the drift checks leave the merged template alone: no patch of the StatefulSet
    writes = statefulset_writes(k8s)
    checks = secret_reads(k8s, "pt-certs")
    wait(k8s, operator, "three more drift checks",
         lambda: secret_reads(k8s, "pt-certs") >= checks + 3, 40)  # fmt: skip
    assert statefulset_writes(k8s) == writes
