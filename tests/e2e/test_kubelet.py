"""Tests of the pod runner (tests/e2e/kubelet.py): StatefulSet pods as real local processes."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from keyshift.store.server import wait_until
from tests.e2e.kubelet import FINALIZER, PORT_ANNOTATION, REPO, PodRunner, expand, path_rewriter
from tests.k8s import KubernetesEmulator

Obj = dict[str, Any]


def statefulset(name: str, replicas: int) -> Obj:
    """A StatefulSet running the probe server with a ConfigMap, a Secret and an emptyDir."""
    labels = {"app": name}
    container = {
        "name": "main",
        "image": "example.invalid/probe:1",
        "command": ["python3", "-m", "tests.e2e.probe_server"],
        "args": ["--config", "/etc/probe/greeting.txt", "--data=/data", "--tag=$(POD_NAME)"],
        "workingDir": "/app",
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [
            {"name": "KEYSHIFT_HTTP_PORT", "value": "8080"},  # overridden by the runner
            {"name": "DATA_DIR", "value": "/data/sub"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_ORDINAL",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
                },
            },
            {
                "name": "PROBE_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "probe", "key": "token"}},
            },
            {
                "name": "GREETING",
                "valueFrom": {"configMapKeyRef": {"name": "probe", "key": "greeting.txt"}},
            },
        ],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/probe", "readOnly": True},
            {"name": "data", "mountPath": "/data"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": 8080},
            "periodSeconds": 5,
            "failureThreshold": 1,
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"note": "from the template"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "probe"}},
                        {"name": "data", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def setup(
    k8s: KubernetesEmulator, tmp_path: Path, name: str, replicas: int, config: bool = True
) -> None:
    if config:
        create_config(k8s)
    manifest = tmp_path / f"{name}.json"
    manifest.write_text(json.dumps(statefulset(name, replicas)))
    k8s.kubectl("apply", "-f", str(manifest), "--validate=false")


def create_config(k8s: KubernetesEmulator) -> None:
    k8s.create("configmaps", {"metadata": {"name": "probe"}, "data": {"greeting.txt": "hello"}})
    token = base64.b64encode(b"s3cret").decode()
    k8s.create("secrets", {"metadata": {"name": "probe"}, "data": {"token": token}})


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def wait(
    predicate: Callable[[], object], what: str, runner: PodRunner, timeout: float = 10
) -> None:
    try:
        wait_until(predicate, timeout, what)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{runner.logs()}") from None


def pod(k8s: KubernetesEmulator, name: str) -> Obj:
    found = k8s.get("pods", name)
    assert found is not None, name
    return found


def ready_condition(p: Obj) -> Obj:
    conditions = {c["type"]: c for c in p["status"]["conditions"]}
    ready: Obj = conditions["Ready"]
    return ready


def test_pure_helpers() -> None:
    assert expand("a-$(X)-$(Y)-$$(X)", {"X": "1"}) == "a-1-$(Y)-$(X)"
    rewrite = path_rewriter({"/etc/k": "/tmp/p/k", "/etc/k/deep": "/tmp/q"})
    assert rewrite("/etc/k") == "/tmp/p/k"
    assert rewrite("--manifest=/etc/k/job.yaml") == "--manifest=/tmp/p/k/job.yaml"
    assert rewrite("/etc/k/deep/x:/etc/k") == "/tmp/q/x:/tmp/p/k"
    assert rewrite("/etc/kx /other/etc/k") == "/etc/kx /other/etc/k"  # not a prefix of these


def test_statefulset_pods_run_ready_and_scale_down(
    k8s: KubernetesEmulator, pod_runner: PodRunner, tmp_path: Path
) -> None:
    setup(k8s, tmp_path, "web", replicas=3)
    names = ["web-0", "web-1", "web-2"]
    pod_runner.wait_ready(names, timeout=15)

    sts = k8s.get("sts", "web")
    assert sts is not None
    for i, name in enumerate(names):
        p = pod(k8s, name)
        meta = p["metadata"]
        assert meta["labels"]["app"] == "web"
        assert meta["labels"]["statefulset.kubernetes.io/pod-name"] == name
        assert meta["labels"]["apps.kubernetes.io/pod-index"] == str(i)
        assert meta["annotations"]["note"] == "from the template"
        [owner] = meta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "StatefulSet",
            "web",
            sts["metadata"]["uid"],
        )
        assert owner["controller"] is True
        assert FINALIZER in meta["finalizers"]
        status = p["status"]
        assert status["phase"] == "Running"
        assert status["podIP"] == "127.0.0.1"
        [cs] = status["containerStatuses"]
        assert cs["ready"] is True
        assert cs["restartCount"] == 0
        assert "running" in cs["state"]

        # The process got its env and volumes (what the probe server reports).
        port = int(meta["annotations"][PORT_ANNOTATION])
        assert port == pod_runner.http_port_of(name)
        info = httpx.get(f"http://127.0.0.1:{port}/info", timeout=5).json()
        assert info["pid"] == pod_runner.pid_of(name)
        assert info["config"] == "hello"
        assert info["env"]["PROBE_TOKEN"] == "s3cret"
        assert info["env"]["GREETING"] == "hello"
        assert info["env"]["POD_NAME"] == info["env"]["HOSTNAME"] == name
        assert info["env"]["POD_ORDINAL"] == str(i)
        assert info["tag"] == name  # $(POD_NAME) expanded in args
        assert info["cwd"] == str(REPO)
        assert info["executable"] == sys.executable
        data = Path(info["data"])
        assert data.is_dir() and data != Path("/data")
        assert (data / "hello").read_text() == f"written by {info['pid']}\n"
        assert info["env"]["DATA_DIR"] == f"{data}/sub"
        assert "serving on" in pod_runner.log_of(name).read_text()

    wait(
        lambda: (k8s.get("sts", "web") or {}).get("status", {}).get("readyReplicas") == 3,
        "readyReplicas 3",
        pod_runner,
    )
    status = (k8s.get("sts", "web") or {})["status"]
    assert status["observedGeneration"] == sts["metadata"]["generation"]
    assert status["replicas"] == status["availableReplicas"] == 3
    assert status["currentReplicas"] == status["updatedReplicas"] == 3
    assert status["currentRevision"] == status["updateRevision"]

    # Scale 3 -> 1: pods 1 and 2 are stopped gracefully (SIGTERM) and removed.
    pids = {name: pod_runner.pid_of(name) for name in names}
    k8s.kubectl("scale", "sts", "web", "--replicas=1")
    wait(
        lambda: k8s.get("pods", "web-1") is None and k8s.get("pods", "web-2") is None,
        "pods 1 and 2 gone",
        pod_runner,
    )
    for name in ("web-1", "web-2"):
        pid = pids[name]
        assert pid is not None
        assert not alive(pid)
        assert "SIGTERM" in pod_runner.log_of(name).read_text()
    assert pids["web-0"] is not None and alive(pids["web-0"])
    wait(
        lambda: (k8s.get("sts", "web") or {}).get("status", {}).get("replicas") == 1,
        "sts status replicas 1",
        pod_runner,
    )
    status = (k8s.get("sts", "web") or {})["status"]
    assert status["readyReplicas"] == 1
    assert status["observedGeneration"] == (k8s.get("sts", "web") or {})["metadata"]["generation"]


def test_deleted_pod_is_recreated_and_killed_process_restarts(
    k8s: KubernetesEmulator, pod_runner: PodRunner, tmp_path: Path
) -> None:
    setup(k8s, tmp_path, "solo", replicas=1)
    pod_runner.wait_ready(["solo-0"], timeout=10)
    first_uid = pod(k8s, "solo-0")["metadata"]["uid"]
    first_pid = pod_runner.pid_of("solo-0")
    assert first_pid is not None

    # Deleting the pod stops its process, then a new pod (new uid, new process) replaces it.
    # (The emulator's helper, not `kubectl delete`: kubectl's wait uses a WatchList watch
    # and waits for an initial-events bookmark the emulator does not send.)
    k8s.delete("pods", "solo-0")  # only marks it: the kubelet's finalizer holds it
    wait(lambda: not alive(first_pid), "the first process gone", pod_runner)
    wait(
        lambda: (
            (k8s.get("pods", "solo-0") or {}).get("metadata", {}).get("uid")
            not in (None, first_uid)
        ),
        "a new pod solo-0",
        pod_runner,
    )
    pod_runner.wait_ready(["solo-0"], timeout=10)
    second_pid = pod_runner.pid_of("solo-0")
    assert second_pid is not None and second_pid != first_pid

    # kill(hold=2): NotReady, container terminated (137), then Ready again with a restart.
    before = ready_condition(pod(k8s, "solo-0"))
    assert pod_runner.kill("solo-0", hold=2) == second_pid
    wait(lambda: not pod_runner.is_ready("solo-0"), "solo-0 NotReady", pod_runner)
    p = pod(k8s, "solo-0")
    [cs] = p["status"]["containerStatuses"]
    assert p["status"]["phase"] == "Running"
    assert cs["state"]["terminated"]["exitCode"] == 137
    assert cs["ready"] is False
    assert pod_runner.pid_of("solo-0") is None
    assert not alive(second_pid)
    pod_runner.wait_ready(["solo-0"], timeout=10)
    p = pod(k8s, "solo-0")
    [cs] = p["status"]["containerStatuses"]
    assert cs["restartCount"] == 1
    assert "running" in cs["state"]
    assert cs["lastState"]["terminated"]["exitCode"] == 137
    assert ready_condition(p)["lastTransitionTime"] >= before["lastTransitionTime"]
    third_pid = pod_runner.pid_of("solo-0")
    assert third_pid is not None and third_pid != second_pid

    # stop() kills what it started.
    pod_runner.stop()
    assert not alive(third_pid)
    pod_runner.stop()  # idempotent


def test_hold_delays_recreation(
    k8s: KubernetesEmulator, pod_runner: PodRunner, tmp_path: Path
) -> None:
    setup(k8s, tmp_path, "held", replicas=1)
    pod_runner.wait_ready(["held-0"], timeout=10)
    pod_runner.hold("held-0", 60)
    k8s.delete("pods", "held-0")
    # Not re-created while held: the controller has seen the delete once the status says so.
    wait(
        lambda: (k8s.get("sts", "held") or {}).get("status", {}).get("replicas") == 0,
        "sts status replicas 0",
        pod_runner,
    )
    assert k8s.get("pods", "held-0") is None
    pod_runner.hold("held-0", 0)
    pod_runner.wait_ready(["held-0"], timeout=10)


def test_missing_config_waits_and_deleting_the_statefulset_stops_its_pods(
    k8s: KubernetesEmulator, pod_runner: PodRunner, tmp_path: Path
) -> None:
    setup(k8s, tmp_path, "late", replicas=2, config=False)

    def waiting_reason() -> str | None:
        p = k8s.get("pods", "late-0") or {}
        [cs] = p.get("status", {}).get("containerStatuses") or [{}]
        reason: str | None = cs.get("state", {}).get("waiting", {}).get("reason")
        return reason

    wait(
        lambda: waiting_reason() == "ContainerCreating",
        "late-0 waits for its ConfigMap",
        pod_runner,
    )
    assert pod(k8s, "late-0")["status"]["phase"] == "Pending"
    assert pod_runner.pid_of("late-0") is None
    create_config(k8s)
    pod_runner.wait_ready(["late-0", "late-1"], timeout=10)

    pids = [pod_runner.pid_of("late-0"), pod_runner.pid_of("late-1")]
    k8s.delete("sts", "late")  # garbage collection deletes the pods; the kubelet stops them
    wait(lambda: not k8s.list("pods"), "the pods gone", pod_runner)
    for pid in pids:
        assert pid is not None and not alive(pid)
