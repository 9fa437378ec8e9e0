"""The owned objects, the pool's view of pods and the status: pure functions."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from keyshift.controller.k8s_objects import (
    SECRET_DIR,
    drift,
    label_selector,
    owned_objects,
    worker_statefulset,
)
from keyshift.controller.k8s_pool import pod_ordinal, worker_info
from keyshift.controller.k8s_status import job_status
from keyshift.controller.pool import WorkerInfo
from keyshift.controller.records import ControllerRecord
from keyshift.runtime.config import StreamJob, StreamJobSpec
from keyshift.store import Assignment


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "keyshift.dev/v1alpha1",
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
