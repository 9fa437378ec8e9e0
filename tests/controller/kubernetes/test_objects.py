"""The owned objects, the pool's view of pods and the status: pure functions."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from keyshift.api.names import API_VERSION
from keyshift.api.spec import StreamJob, StreamJobSpec
from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.core.records import ControllerRecord
from keyshift.controller.kubernetes.objects import (
    SECRET_DIR,
    drift,
    label_selector,
    owned_objects,
    worker_statefulset,
)
from keyshift.controller.kubernetes.pool import pod_ordinal, worker_info
from keyshift.controller.kubernetes.status import job_status
from keyshift.store import Assignment


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": "counter", "namespace": "team", "uid": "u-1", "generation": 3},
        "spec": {
            "job": "examples.counter:job",
            "keyGroups": 8,
            "parallelism": 2,
            "stateStore": {"url": "redis://valkey:6379"},
            **spec,
        },
    }


def parse(b: dict[str, Any]) -> StreamJobSpec:
    return StreamJobSpec.model_validate(b["spec"])


def test_workers_run_locked_down_without_an_api_token() -> None:
    b = body()
    sts = worker_statefulset(b, parse(b), replicas=2)
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert not sts["spec"].get("volumeClaimTemplates")
    # only the config, a scratch /tmp and (when asked) the store's Secret are mounted
    assert {v["name"] for v in pod["volumes"]} == {"config", "tmp"}


def test_the_store_password_comes_from_the_named_secret_not_the_spec() -> None:
    b = body(stateStore={"url": "redis://valkey:6379", "secretRef": "valkey-auth"})
    sts = worker_statefulset(b, parse(b), replicas=1)
    pod = sts["spec"]["template"]["spec"]
    secret = next(v for v in pod["volumes"] if v["name"] == "store-secret")
    # the password (required: the pod waits for it) and the CA of a TLS store if the
    # Secret has one (`ca.crt`, optional), nothing else of the Secret
    password, ca = secret["projected"]["sources"]
    assert password["secret"] == {
        "name": "valkey-auth", "items": [{"key": "password", "path": "password"}],
    }  # fmt: skip
    assert ca["secret"] == {
        "name": "valkey-auth", "items": [{"key": "ca.crt", "path": "ca.crt"}], "optional": True,
    }  # fmt: skip
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["KEYSHIFT_STORE_PASSWORD_FILE"]["value"].endswith("/password")
    assert env["KEYSHIFT_STORE_CA_FILE"]["value"] == f"{SECRET_DIR}/ca.crt"
    assert "KEYSHIFT_STORE_PASSWORD" not in env  # never a value in the pod spec


def test_every_owned_object_points_at_its_streamjob() -> None:
    b = body()
    objs = owned_objects(b, parse(b), replicas=0)
    assert [o["kind"] for o in objs] == [
        "ConfigMap", "Service", "PodDisruptionBudget", "StatefulSet",
    ]  # fmt: skip
    for o in objs:
        (ref,) = o["metadata"]["ownerReferences"]
        assert ref["uid"] == "u-1" and ref["controller"] is True
        assert o["metadata"]["namespace"] == "team"
    manifest = StreamJob.model_validate(yaml.safe_load(objs[0]["data"]["job.yaml"]))
    assert manifest.name == "counter" and manifest.spec.key_groups == 8


def test_user_pod_settings_pass_through() -> None:
    b = body(
        env=[{"name": "MODE", "value": "fast"}],
        nodeSelector={"pool": "stream"},
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
        podLabels={"team": "data"},
        resources={"requests": {"cpu": "500m"}},
    )
    sts = worker_statefulset(b, parse(b), replicas=1)
    template = sts["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "data"
    assert template["spec"]["nodeSelector"] == {"pool": "stream"}
    assert template["spec"]["tolerations"][0]["key"] == "dedicated"
    container = template["spec"]["containers"][0]
    assert {"name": "MODE", "value": "fast"} in container["env"]
    assert container["resources"] == {"requests": {"cpu": "500m"}}


def test_drift_restores_edits_but_leaves_replicas_to_the_executor() -> None:
    b = body()
    desired = worker_statefulset(b, parse(b), replicas=0)
    actual = copy.deepcopy(desired)
    actual["spec"]["replicas"] = 4  # the executor's business
    actual["metadata"]["resourceVersion"] = "17"  # the API server's
    actual["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"  # a server default
    assert drift(desired, actual) is None

    actual["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:latest"
    patch = drift(desired, actual)
    assert patch is not None and set(patch) == {"spec"}
    assert patch["spec"]["template"] == desired["spec"]["template"]
    assert "replicas" not in patch["spec"]


def test_a_spec_change_changes_the_pod_template() -> None:
    b1, b2 = body(), body(checkpointInterval="500ms")
    t1 = worker_statefulset(b1, parse(b1), 1)["spec"]["template"]
    t2 = worker_statefulset(b2, parse(b2), 1)["spec"]["template"]
    assert t1["metadata"]["annotations"] != t2["metadata"]["annotations"]


def pod(i: int, ready: bool, since: str = "2026-12-03T10:00:00Z", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"counter-worker-{i}",
            "labels": {"apps.kubernetes.io/pod-index": str(i)},
            "creationTimestamp": "2026-12-03T09:00:00Z",
            **meta,
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [
                {"type": "Ready", "status": str(ready), "lastTransitionTime": since},
            ],
        },
    }


def test_pool_reads_readiness_and_the_time_it_was_lost() -> None:
    assert pod_ordinal(pod(3, True), "counter") == 3
    assert pod_ordinal({"metadata": {"name": "counter-worker-5"}}, "counter") == 5
    assert pod_ordinal({"metadata": {"name": "other-worker-5"}}, "counter") is None
    up = worker_info(0, "counter", pod(0, True), None)
    assert up.ready and up.running and up.not_ready_since is None
    assert up.metrics_url == "http://10.0.0.7:8080/metrics"
    down = worker_info(1, "counter", pod(1, False, "2026-12-03T10:00:05Z"), None)
    assert not down.ready and down.not_ready_since == 1796292005.0
    going = worker_info(2, "counter", pod(2, True, deletionTimestamp="x"), None)
    assert not going.ready and not going.running
    crashed = pod(1, False)
    crashed["status"]["containerStatuses"] = [{
        "name": "worker", "ready": False, "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "message": "JobLoadError: no module"}},
    }]  # fmt: skip
    assert worker_info(1, "counter", crashed, None).detail.endswith("JobLoadError: no module")
    missing = worker_info(3, "counter", None, 1234.0)
    assert not missing.running and missing.not_ready_since == 1234.0


def test_status_phases_and_conditions() -> None:
    workers = {
        0: WorkerInfo(0, "counter-worker-0", running=True, ready=True, not_ready_since=None),
        1: WorkerInfo(1, "counter-worker-1", running=True, ready=False, not_ready_since=5.0),
    }
    a = Assignment(4, 2, (0, 0, 0, 0, 1, 1, 1, 1))
    record = ControllerRecord(job="counter")
    common: dict[str, Any] = {
        "record": record, "selector": label_selector("counter"), "observed_generation": 3,
        "error": None,
    }  # fmt: skip
    pending = job_status(assignment=None, workers={}, previous_conditions=[], at=100.0, **common)
    assert pending["phase"] == "Pending" and pending["parallelism"] == 0
    degraded = job_status(assignment=a, workers=workers, previous_conditions=[], at=100.0,
                          **common)  # fmt: skip
    assert degraded["phase"] == "Degraded"
    conds = {c["type"]: c for c in degraded["conditions"]}
    assert conds["Degraded"]["status"] == "True" and "[1]" in conds["Degraded"]["message"]
    assert degraded["workers"][1]["keyRanges"] == "4-7"
    assert degraded["selector"] == "app.kubernetes.io/name=keyshift-worker,keyshift.dev/job=counter"

    healthy = {o: WorkerInfo(o, w.name, True, True, None) for o, w in workers.items()}
    later = job_status(assignment=a, workers=healthy, previous_conditions=degraded["conditions"],
                       at=200.0, **common)  # fmt: skip
    assert later["phase"] == "Running"
    conds2 = {c["type"]: c for c in later["conditions"]}
    # a condition that did not change keeps its transition time; one that did gets a new one
    assert conds2["Rescaling"]["lastTransitionTime"] == conds["Rescaling"]["lastTransitionTime"]
    assert conds2["Ready"]["lastTransitionTime"] != conds["Ready"]["lastTransitionTime"]

    typo = job_status(assignment=a, workers=healthy, previous_conditions=[], at=300.0,
                      invalid="spec.parallelism: too high", **common)  # fmt: skip
    assert typo["phase"] == "Running" and typo["parallelism"] == 2
    invalid = {c["type"]: c for c in typo["conditions"]}["InvalidSpec"]
    assert invalid["status"] == "True" and invalid["message"].startswith("spec.parallelism")


def test_the_kubernetes_examples_are_valid_and_render() -> None:
    from tests.support import REPO

    examples = sorted((REPO / "examples" / "kubernetes").glob("*.yaml"))
    assert examples
    for path in examples:
        doc = yaml.safe_load(path.read_text())
        job = StreamJob.model_validate(doc)
        doc["metadata"].update(namespace="default", uid="u-2")
        objs = owned_objects(doc, job.spec, replicas=0)
        assert objs[-1]["spec"]["template"]["spec"]["containers"][0]["image"] == job.spec.image


# ------------------------------------------------------------------ the pod template

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "data", "tier": "t"}, "annotations": {"a": "template"}},
    "spec": {
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccountName": "stream-jobs",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "ScheduleAnyway"},
        ],
        "priorityClassName": "streaming",
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "nodeSelector": {"pool": "template", "disk": "ssd"},
        "volumes": [
            {"name": "certs", "secret": {"secretName": "kafka-certs"}},
            {"name": "both", "projected": {"sources": [
                {"secret": {"name": "proj-a"}}, {"configMap": {"name": "cm"}},
                {"secret": {"name": "proj-b", "optional": True}}]}},
            {"name": "lookup", "configMap": {"name": "lookup-tables"}},
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
        ],
        "containers": [{
            "name": "worker",
            "volumeMounts": [
                {"name": "certs", "mountPath": "/etc/kafka", "readOnly": True},
                {"name": "lookup", "mountPath": "/data/lookup"},
            ],
            "envFrom": [{"configMapRef": {"name": "settings"}},
                        {"secretRef": {"name": "api-keys"}, "prefix": "API_"}],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": 2}},
        }],
    },
}  # fmt: skip


def test_the_pod_template_is_merged_under_the_operators_settings() -> None:
    b = body(podTemplate=TEMPLATE, stateStore={"url": "redis://v:6379", "secretRef": "store"})
    sts = worker_statefulset(b, parse(b), replicas=1)
    meta, pod = sts["spec"]["template"]["metadata"], sts["spec"]["template"]["spec"]
    assert meta["labels"] == {
        "team": "data", "tier": "t",
        "app.kubernetes.io/name": "keyshift-worker", "keyshift.dev/job": "counter",
    }  # fmt: skip
    assert (
        meta["annotations"]["a"] == "template" and "keyshift.dev/config-hash" in meta["annotations"]
    )
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "stream-jobs"
    assert pod["priorityClassName"] == "streaming"
    assert pod["affinity"] == TEMPLATE["spec"]["affinity"]
    # a spread constraint without a selector spreads this job's workers
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["labelSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "keyshift-worker", "keyshift.dev/job": "counter"}
    }
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["nodeSelector"] == {"pool": "template", "disk": "ssd"}
    # the operator's volumes first, then the template's, as written
    names = [v["name"] for v in pod["volumes"]]
    assert names == ["config", "tmp", "store-secret", "certs", "both", "lookup", "scratch"]
    assert pod["volumes"][3] == {"name": "certs", "secret": {"secretName": "kafka-certs"}}
    (container,) = pod["containers"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == [
        "/etc/keyshift", "/tmp", "/var/run/secrets/keyshift/store", "/etc/kafka", "/data/lookup",
    ]  # fmt: skip
    assert container["volumeMounts"][4] == {"name": "lookup", "mountPath": "/data/lookup"}
    assert container["envFrom"] == TEMPLATE["spec"]["containers"][0]["envFrom"]
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2"},
    }  # fmt: skip
    # what the operator keeps: no API token, the restricted security context, its command
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "runAsUser": 10001, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert container["command"] == ["python", "-m", "keyshift.runtime"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_shorthands_win_over_the_template() -> None:
    b = body(
        podTemplate=TEMPLATE,
        nodeSelector={"pool": "stream"},
        tolerations=[
            {"key": "spot", "operator": "Exists"},
            {"key": "dedicated", "operator": "Exists"},
        ],
        podLabels={"team": "platform"},
        podAnnotations={"a": "shorthand"},
        env=[{"name": "MODE", "value": "fast"}],
        resources={"requests": {"cpu": "500m"}, "limits": {"cpu": 2}},
    )
    sts = worker_statefulset(b, parse(b), replicas=1)
    meta, pod = sts["spec"]["template"]["metadata"], sts["spec"]["template"]["spec"]
    assert meta["labels"]["team"] == "platform" and meta["labels"]["tier"] == "t"
    assert meta["annotations"]["a"] == "shorthand"
    assert pod["nodeSelector"] == {"pool": "stream", "disk": "ssd"}
    # added to the template's, each once
    assert [t["key"] for t in pod["tolerations"]] == ["dedicated", "spot"]
    container = pod["containers"][0]
    assert container["env"][-1] == {"name": "MODE", "value": "fast"}
    assert container["env"][0]["name"] == "KEYSHIFT_WORKER_ORDINAL"  # the operator's first
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2", "cpu": "2"},
    }  # fmt: skip


def test_the_operator_wins_over_template_labels_and_no_token_unless_asked() -> None:
    b = body(podLabels={"keyshift.dev/job": "other", "app.kubernetes.io/name": "x"})
    labels = worker_statefulset(b, parse(b), 1)["spec"]["template"]["metadata"]["labels"]
    assert labels["keyshift.dev/job"] == "counter"
    assert labels["app.kubernetes.io/name"] == "keyshift-worker"
    for given, mounted in [(None, False), (False, False), (True, True)]:
        template: dict[str, Any] = {"spec": {"serviceAccountName": "reader"}}
        if given is not None:
            template["spec"]["automountServiceAccountToken"] = given
        b = body(podTemplate=template)
        pod = worker_statefulset(b, parse(b), 1)["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is mounted, given


def test_without_a_template_the_pod_is_as_before() -> None:
    b = body()
    pod = worker_statefulset(b, parse(b), 1)["spec"]["template"]["spec"]
    # no empty fields: the API server would drop them, and drift would see them missing
    assert set(pod) == {
        "automountServiceAccountToken", "enableServiceLinks", "terminationGracePeriodSeconds",
        "securityContext", "containers", "volumes",
    }  # fmt: skip
    assert set(pod["containers"][0]) == {
        "name", "image", "imagePullPolicy", "command", "args", "env", "ports",
        "readinessProbe", "livenessProbe", "volumeMounts", "securityContext",
    }  # fmt: skip


def stored(obj: Any, key: str = "") -> Any:
    """``obj`` as an API server stores it: quantities canonical, defaults added, empty
    fields and false booleans dropped."""
    canonical = {"1": "1", "0.5": "500m", "2": "2", 2: "2", "1Gi": "1Gi", "1024Mi": "1Gi"}
    if isinstance(obj, dict):
        out = {k: stored(v, k) for k, v in obj.items() if v not in ({}, [], False) or k in (
            "emptyDir", "automountServiceAccountToken", "enableServiceLinks",
            "allowPrivilegeEscalation",
        )}  # fmt: skip
        if key in ("requests", "limits"):
            out = {k: canonical.get(v, v) for k, v in obj.items()}
        if key in ("secret", "configMap", "projected") and "sources" not in obj:
            out.setdefault("defaultMode", 420)
        if "mountPath" in obj:
            out.setdefault("mountPropagation", "None")
        return out
    if isinstance(obj, list):
        return [stored(v) for v in obj]
    return obj


def test_the_merged_template_does_not_drift_once_stored() -> None:
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["containers"][0]["volumeMounts"][1]["readOnly"] = False
    template["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "0.5"
    template["spec"]["containers"][0]["resources"]["limits"]["memory"] = "1024Mi"
    b = body(podTemplate=template, resources={"limits": {"cpu": 2}}, tolerations=[])
    desired = worker_statefulset(b, parse(b), replicas=0)
    actual = stored(copy.deepcopy(desired))
    assert actual["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "500m", "memory": "1Gi",
    }  # fmt: skip
    actual["spec"]["replicas"] = 3
    assert drift(desired, actual) is None

    # a template change (another mount) is restored over the stored object
    b2 = copy.deepcopy(b)
    b2["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"].pop()
    patch = drift(worker_statefulset(b2, parse(b2), replicas=0), actual)
    assert patch is not None and set(patch["spec"]) == {"template"}
    # and someone relaxing the security context is put back
    relaxed = copy.deepcopy(actual)
    relaxed["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = False
    assert drift(desired, relaxed) is not None


def test_every_secret_the_template_names_needs_the_label() -> None:
    from keyshift.controller.kubernetes.objects import secret_refs

    b = body(
        podTemplate={**TEMPLATE, "spec": {**TEMPLATE["spec"], "volumes": [
            *TEMPLATE["spec"]["volumes"],
            {"name": "vault", "csi": {"driver": "secrets-store.csi.k8s.io",
                                      "nodePublishSecretRef": {"name": "vault-creds"}}},
        ]}},
        stateStore={"url": "redis://v:6379", "secretRef": "store"},
    )  # fmt: skip
    refs = secret_refs(parse(b))
    assert refs == {
        "store": ["stateStore.secretRef"],
        "kafka-certs": ["podTemplate.spec.volumes[0] certs: secret"],
        "proj-a": ["podTemplate.spec.volumes[1] both: projected.sources[0].secret"],
        "proj-b": ["podTemplate.spec.volumes[1] both: projected.sources[2].secret"],
        "vault-creds": ["podTemplate.spec.volumes[4] vault: csi.nodePublishSecretRef"],
        "api-keys": ["podTemplate.spec.containers[0].envFrom[1].secretRef"],
    }
    assert "regcred" not in refs  # the kubelet's, to pull the image: never in a worker


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({"spec": {"securityContext": {"runAsNonRoot": False}}},
         "podTemplate.spec.securityContext cannot be set"),
        ({"spec": {"containers": [{"name": "worker", "securityContext": {"privileged": True}}]}},
         "containers[].securityContext cannot be set"),
        ({"spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}},
         "hostPath is not a volume type the workers may use"),
        ({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}},
         "volume name 'tmp' is the operator's"),
        ({"spec": {"volumes": [{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]}},
         "give exactly one volume type"),
        ({"spec": {"containers": [{"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]}},
         "volumeMounts name volumes ['nope']"),
        ({"spec": {"volumes": [{"name": "v", "emptyDir": {}}],
                   "containers": [{"volumeMounts": [{"name": "v", "mountPath": "/tmp/x"}]}]}},
         "overlaps /tmp"),
        ({"spec": {"containers": [{"name": "sidecar"}]}}, "Input should be 'worker'"),
        ({"spec": {"containers": [{"envFrom": [{"prefix": "X_"}]}]}},
         "give exactly one of configMapRef and secretRef"),
        ({"metadata": {"labels": {"keyshift.dev/job": "other"}}}, "are the operator's"),
        ({"spec": {"hostNetwork": True}}, "Extra inputs are not permitted"),
        ({"spec": {"serviceAccountName": "Not_A_Name"}}, "should match pattern"),
    ],
)  # fmt: skip
def test_the_model_refuses_a_template_that_would_relax_or_break_the_pod(
    template: dict[str, Any], message: str
) -> None:
    from keyshift.api.spec import InvalidSpec, validate_spec

    with pytest.raises(InvalidSpec) as refused:
        validate_spec(body(podTemplate=template)["spec"])
    assert message in str(refused.value), refused.value
