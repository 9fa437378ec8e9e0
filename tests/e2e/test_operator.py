"""The operator end to end: kubectl apply, scale, failover, operator restart, delete.

Runs against the emulator here (real worker processes, a real Valkey, the real
operator as a subprocess) and, unchanged, against a real cluster when
``KEYSHIFT_E2E_IMAGE`` and friends are set (see ``tests/e2e/harness.py``).
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from keyshift.api.names import API_VERSION
from keyshift.controller.core.assignment import plan_assignment
from keyshift.store import Assignment, RedisStateStore, open_store
from keyshift.store.server import LocalServer, free_port
from tests.e2e.harness import Cluster, OperatorProcess, real_cluster_settings
from tests.e2e.kubelet import PodRunner
from tests.k8s.emulator import KubernetesEmulator
from tests.support import (
    REPO,
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    wait_for,
)

KEY_GROUPS = 12
LIMIT = 2500  # records per key group: the job ends, so the final state is exact
SOURCE = {"keys": 600, "rate": {"recordsPerSecond": 1000}, "limit": LIMIT, "seed": 11}


@pytest.fixture(params=["emulator", "real-cluster"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    settings = real_cluster_settings()
    if request.param == "real-cluster":
        if settings is None:
            pytest.skip("no real cluster: set KUBECONFIG, KEYSHIFT_E2E_IMAGE, "
                        "KEYSHIFT_E2E_STORE_URL and KEYSHIFT_E2E_LOCAL_STORE_URL")  # fmt: skip
        yield from _real_cluster(settings)
        return
    if settings is not None:
        pytest.skip("a real cluster is configured: the emulator run is skipped")
    k8s: KubernetesEmulator = request.getfixturevalue("k8s")
    runner: PodRunner = request.getfixturevalue("pod_runner")
    server: LocalServer = request.getfixturevalue("standalone_server")
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    metrics_port = free_port()
    options = ("--standalone", "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port))
    operator = OperatorProcess(k8s.kubeconfig, tmp_path / "operator.log", options=options).start()

    def crash_operator_during(start_rescale: Callable[[], None]) -> None:
        # the crash point kills the operator right after it publishes the new assignment
        operator.kill()
        operator.start(KEYSHIFT_CRASH_POINTS="executor.publish.after@1")
        start_rescale()
        assert operator.wait_exit(60) == -signal.SIGKILL, operator.output()
        operator.start()

    def delete_worker_pod(pod: str, hold: float) -> None:
        runner.hold(pod, hold)
        k8s.kubectl("delete", "pod", pod, "--wait=false")

    def diagnostics() -> str:
        return f"--- operator\n{operator.output()}\n--- pods\n{runner.logs(tail=30)}"

    try:
        yield Cluster(
            k8s.kubectl,
            store_url=server.url,
            local_store_url=server.url,
            image="keyshift/keyshift:dev",
            delete_worker_pod=delete_worker_pod,
            crash_operator_during=crash_operator_during,
            diagnostics=diagnostics,
            operator_metrics=lambda: httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text,
        )
    finally:
        operator.stop()


def _discard(_: object) -> None:
    return None


def _real_cluster(settings: dict[str, str]) -> Iterator[Cluster]:  # pragma: no cover - no cluster
    import subprocess

    def kubectl(*args: str, input: str | None = None, check: bool = True) -> Any:
        return subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True,
                              check=check, timeout=120)  # fmt: skip

    def delete_worker_pod(pod: str, hold: float) -> None:
        kubectl("delete", "pod", pod, "--wait=false")

    def crash_operator_during(start_rescale: Callable[[], None]) -> None:
        start_rescale()  # best effort: the rescale may be over before the pod goes
        kubectl("delete", "pod", "-A", "-l", "app.kubernetes.io/name=keyshift-operator")

    yield Cluster(
        kubectl,
        store_url=settings["KEYSHIFT_E2E_STORE_URL"],
        local_store_url=settings["KEYSHIFT_E2E_LOCAL_STORE_URL"],
        image=settings["KEYSHIFT_E2E_IMAGE"],
        delete_worker_pod=delete_worker_pod,
        crash_operator_during=crash_operator_during,
        diagnostics=lambda: kubectl("get", "pods,sts,sj", "-o", "wide", check=False).stdout,
    )


@pytest.fixture
async def store(cluster: Cluster) -> AsyncIterator[RedisStateStore]:
    s = open_store(cluster.local_store_url, retry_seconds=10)
    yield s
    await s.close()


def manifest(name: str, cluster: Cluster, parallelism: int, **spec: Any) -> str:
    doc = {
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": name},
        "spec": {
            "image": cluster.image,
            "job": "examples.counter:job",
            "keyGroups": KEY_GROUPS,
            "parallelism": parallelism,
            "source": {"type": "generator", **SOURCE},
            "sink": {"type": "null"},
            "stateStore": {"url": cluster.store_url},
            "checkpointInterval": "200ms",
            "failoverAfter": "2s",
            **spec,
        },
    }
    return yaml.safe_dump(doc)


def job_status(cluster: Cluster, name: str) -> dict[str, Any]:
    obj = cluster.get("streamjob", name)
    status: dict[str, Any] = (obj or {}).get("status") or {}
    return status


def settled_at(cluster: Cluster, name: str, parallelism: int, rescales: int) -> dict[str, Any]:
    """Wait until the job runs ``parallelism`` workers, all Ready, after ``rescales`` rescales."""

    def settled() -> dict[str, Any] | None:
        s = job_status(cluster, name)
        ok = (
            s.get("phase") == "Running"
            and s.get("parallelism") == parallelism
            and len(s.get("rescales") or []) >= rescales
            and s.get("rescale") is None
        )
        return s if ok else None

    status: dict[str, Any] = cluster.wait(f"{name} running at {parallelism}", settled, 60)
    return status


async def assert_sound(store: RedisStateStore, name: str, parallelism: int) -> Assignment:
    """The published assignment is the plain ranges and the store agrees on every owner."""
    assignment = await store.get_assignment(name)
    assert assignment is not None
    assert assignment.owners == plan_assignment(KEY_GROUPS, parallelism)
    await assert_owned_as_assigned(store, name, assignment)
    return assignment


def metric(text: str, name: str, job: str) -> float:
    """The sum of a metric's samples for one job in Prometheus text format."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("streamjob") == job:
                total += sample.value
    return total


def event_reasons(cluster: Cluster, name: str) -> list[str]:
    events = cluster.list("events")
    return [e.get("reason", "") for e in events
            if (e.get("involvedObject") or {}).get("name") == name]  # fmt: skip


async def test_apply_scale_failover_restart_delete(
    cluster: Cluster, store: RedisStateStore
) -> None:
    name = f"e2e-{secrets.token_hex(3)}"
    cluster.kubectl("apply", "--validate=false", "-f", "-", input=manifest(name, cluster, 2))

    # it comes up: owned objects, two Ready workers, the plain ranges
    status = settled_at(cluster, name, 2, rescales=1)
    assert [w["keyRanges"] for w in status["workers"]] == ["0-5", "6-11"]
    sts = cluster.get("statefulset", f"{name}-worker")
    assert sts is not None
    assert sts["metadata"]["ownerReferences"][0]["name"] == name
    assert sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    for kind, obj_name in (("configmap", f"{name}-config"), ("service", f"{name}-workers"),
                           ("pdb", f"{name}-workers")):  # fmt: skip
        assert cluster.get(kind, obj_name) is not None, (kind, obj_name)
    await assert_sound(store, name, 2)

    if cluster.operator_metrics is not None:
        assert metric(cluster.operator_metrics(), "keyshift_job_parallelism", name) == 2.0

    # kubectl scale: 2 -> 4 -> 3, through the scale subresource
    for before, parallelism in ((2, 4), (4, 3)):
        cluster.kubectl("scale", f"streamjob/{name}", f"--replicas={parallelism}")
        status = settled_at(cluster, name, parallelism, rescales=len(status["rescales"]) + 1)
        last = status["rescales"][-1]
        assert (last["from"], last["to"], last["outcome"]) == (before, parallelism, "succeeded")
        assert last["reason"] == "manual"
        assert len(cluster.list("pods", f"keyshift.dev/job={name}")) == parallelism
        await assert_sound(store, name, parallelism)

    # failover: worker 1's pod is deleted and stays away past failoverAfter; its key
    # groups move to the survivors, and come back to it in a rebalance once it is Ready
    done = len(status["rescales"])
    cluster.delete_worker_pod(f"{name}-worker-1", 8.0)
    status = cluster.wait(
        "the failover and the rebalance",
        lambda: (
            (s := job_status(cluster, name)).get("phase") == "Running"
            and [r["reason"] for r in (s.get("rescales") or [])[done:]][-2:]
            == ["failover", "rebalance"]
            and s
        ),
        60,
    )
    failover, rebalance = status["rescales"][-2:]
    assert failover["outcome"] == rebalance["outcome"] == "succeeded"
    await assert_sound(store, name, 3)
    assert "Failover" in event_reasons(cluster, name)

    # the operator dies in the middle of a rescale; a new one completes it
    cluster.crash_operator_during(
        lambda: _discard(cluster.kubectl("scale", f"streamjob/{name}", "--replicas=2"))
    )
    status = settled_at(cluster, name, 2, rescales=len(status["rescales"]) + 1)
    assert status["rescales"][-1]["to"] == 2
    await assert_sound(store, name, 2)

    # every record processed exactly once, whatever happened on the way
    await wait_for(lambda: all_done(store, name, KEY_GROUPS, LIMIT), 90, "every record")
    await assert_exact_counter_state(store, name, SOURCE, KEY_GROUPS, LIMIT)
    assert "Rescale" in event_reasons(cluster, name)
    if cluster.operator_metrics is not None:  # rescales since the operator's last restart
        text = cluster.operator_metrics()
        assert metric(text, "keyshift_rescale_duration_seconds_count", name) >= 1

    # delete: the workers stop, the state stays in the store
    cluster.kubectl("delete", "streamjob", name, "--wait=false")
    cluster.wait("the job's objects and pods to go",
                 lambda: cluster.get("streamjob", name) is None
                 and not cluster.list("pods", f"keyshift.dev/job={name}"), 60)  # fmt: skip
    assert await store.job_info(name) is not None


async def test_a_scale_up_takes_the_standby_pod_and_refills_the_standby(
    cluster: Cluster, store: RedisStateStore
) -> None:
    """``standbyWorkers: 1``: a third pod of the StatefulSet runs, Ready and owning nothing;
    2 -> 3 gives it key groups without starting a pod (the same pod, not a new one), and a
    fourth pod is the standby after it; every record is counted exactly once."""
    name = f"e2e-{secrets.token_hex(3)}"
    limit = 1000  # records per key group: enough to outlast the rescale, and no more
    source = {**SOURCE, "limit": limit}
    doc = manifest(name, cluster, 2, standbyWorkers=1, source={"type": "generator", **source})
    cluster.kubectl("apply", "--validate=false", "-f", "-", input=doc)

    def standby_ready(ordinal: int) -> dict[str, Any] | None:
        s = job_status(cluster, name)
        standby = [w for w in s.get("workers") or [] if w["ordinal"] == ordinal]
        return s if standby and standby[0]["ready"] and standby[0]["keyGroups"] == 0 else None

    status = settled_at(cluster, name, 2, rescales=1)
    status = cluster.wait("the standby worker Ready", lambda: standby_ready(2), 60)
    assert [w["keyGroups"] for w in status["workers"]] == [6, 6, 0]
    sts = cluster.get("statefulset", f"{name}-worker")
    assert sts is not None and sts["spec"]["replicas"] == 3
    standby_pod = cluster.get("pod", f"{name}-worker-2")
    assert standby_pod is not None

    cluster.kubectl("scale", f"streamjob/{name}", "--replicas=3")
    status = settled_at(cluster, name, 3, rescales=len(status["rescales"]) + 1)
    last = status["rescales"][-1]
    assert (last["from"], last["to"], last["outcome"]) == (2, 3, "succeeded")
    taken = cluster.get("pod", f"{name}-worker-2")
    assert taken is not None
    assert taken["metadata"]["uid"] == standby_pod["metadata"]["uid"]  # no new pod for it
    await assert_sound(store, name, 3)
    status = cluster.wait("the standby refilled", lambda: standby_ready(3), 60)
    assert [w["keyGroups"] for w in status["workers"]] == [4, 4, 4, 0]

    await wait_for(lambda: all_done(store, name, KEY_GROUPS, limit), 90, "every record")
    await assert_exact_counter_state(store, name, source, KEY_GROUPS, limit)
    cluster.kubectl("delete", "streamjob", name, "--wait=false")
    cluster.wait("the job's pods to go",
                 lambda: not cluster.list("pods", f"keyshift.dev/job={name}"), 60)  # fmt: skip


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


async def test_invalid_specs_are_reported_and_nothing_is_lost(cluster: Cluster) -> None:
    name = f"e2e-{secrets.token_hex(3)}"
    too_wide = manifest(name, cluster, parallelism=KEY_GROUPS + 8)
    applied = cluster.run_kubectl("apply", "--validate=false", "-f", "-", input=too_wide)
    expected = f"parallelism ({KEY_GROUPS + 8}) must not exceed keyGroups ({KEY_GROUPS})"
    if applied.returncode != 0:  # a real API server evaluates the CRD's CEL rule
        assert expected in applied.stderr
    else:  # the emulator does not: the operator reports it, and deploys nothing
        status = cluster.wait(
            "InvalidSpec in status",
            lambda: (s := job_status(cluster, name)).get("phase") == "Failed" and s,
            30,
        )
        invalid = condition(status, "InvalidSpec")
        assert invalid["status"] == "True" and expected in invalid["message"]
        assert cluster.get("statefulset", f"{name}-worker") is None
    # fixed, it runs
    cluster.kubectl("apply", "--validate=false", "-f", "-", input=manifest(name, cluster, 1))
    status = settled_at(cluster, name, 1, rescales=1)
    assert condition(status, "InvalidSpec")["status"] == "False"

    # an entry point the image does not have: the workers say why, in the job's status
    broken = f"e2e-{secrets.token_hex(3)}"
    cluster.kubectl(
        "apply", "--validate=false", "-f", "-",
        input=manifest(broken, cluster, 1, job="examples.nope:job"),
    )  # fmt: skip

    def reported() -> str | None:
        message = str(condition(job_status(cluster, broken), "Degraded").get("message", ""))
        return message if "cannot be loaded" in message else None

    message = cluster.wait("the broken entry point in status", reported, 60)
    assert "examples.nope:job" in message and "No module named 'examples.nope'" in message


async def test_drift_is_corrected_and_delete_can_take_the_state(
    cluster: Cluster, store: RedisStateStore
) -> None:
    name = f"e2e-{secrets.token_hex(3)}"
    cluster.kubectl("apply", "--validate=false", "-f", "-", input=manifest(name, cluster, 1))
    settled_at(cluster, name, 1, rescales=1)

    # someone edits the StatefulSet the operator owns: the operator puts it back
    sts_name = f"{name}-worker"
    edit = '{"spec":{"template":{"spec":{"automountServiceAccountToken":true}}}}'
    cluster.kubectl("patch", "statefulset", sts_name, "--type=merge", "-p", edit)

    def restored() -> bool:
        sts = cluster.get("statefulset", sts_name) or {}
        return sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is False

    cluster.wait("the StatefulSet restored", restored, 30)
    assert (cluster.get("statefulset", sts_name) or {})["spec"]["replicas"] == 1

    # an invalid change to a running job: reported, and the job runs on as it was
    too_many = KEY_GROUPS + 28
    expected = f"parallelism ({too_many}) must not exceed keyGroups ({KEY_GROUPS})"
    scaled = cluster.run_kubectl("scale", f"streamjob/{name}", f"--replicas={too_many}")
    if scaled.returncode != 0:  # a real API server evaluates the CRD's CEL rule
        assert expected in scaled.stderr
    else:  # the emulator does not: the operator reports it and the job runs on

        def rejected() -> dict[str, Any] | None:
            s = job_status(cluster, name)
            return s if condition(s, "InvalidSpec").get("status") == "True" else None

        status = cluster.wait("the invalid scale reported", rejected, 30)
        assert expected in condition(status, "InvalidSpec")["message"]
        assert status["phase"] == "Running" and status["parallelism"] == 1
        cluster.kubectl("scale", f"streamjob/{name}", "--replicas=1")
        cluster.wait(
            "the fixed spec accepted",
            lambda: condition(job_status(cluster, name), "InvalidSpec").get("status") == "False",
            30,
        )

    # deleting with the annotation deletes the job's state from the store too
    assert await store.job_info(name) is not None
    cluster.kubectl("annotate", "streamjob", name, "keyshift.dev/delete-state=true")
    cluster.kubectl("delete", "streamjob", name, "--wait=false")
    cluster.wait("the job to go", lambda: cluster.get("streamjob", name) is None, 60)
    assert await store.job_info(name) is None
    assert await store.get_assignment(name) is None
