"""The operator uses only the Secrets that opt in with ``keyshift.dev/streamjob-secret:
"true"``, says so on the StreamJob, and goes on by itself once the Secret is labelled.

Each test runs the real operator against the emulator with the pod runner and a real
Valkey: a StreamJob whose store Secret is not labelled gets ``Ready=False`` (reason
``SecretNotAllowed``) and an Event, and no workers, until the Secret is labelled; an
unlabelled Secret in ``spec.env`` does not reach the StatefulSet of a running job; the
autoscaler reads nothing from an unlabelled ``prometheus.secretRef`` (a recording
stand-in for Prometheus sees no credentials until the label is added).

Emulator only: the tests patch Secrets' labels and read the recording server's requests.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    real_cluster_settings() is not None, reason="patches Secrets in the emulator"
)

REFUSAL = "SecretNotAllowed"
OPERATOR = "operator"  # the token of the operator's kubeconfig: its requests are logged


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalServer]:
    """A store with a password: the job's store Secret is needed to open it."""
    server = LocalServer(tmp_path / "valkey", password=secrets.token_hex(8)).start()
    yield server
    server.stop()


@pytest.fixture
def operator(k8s: KubernetesEmulator, pod_runner: PodRunner, tmp_path: Path) -> Iterator[Any]:
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    kubeconfig = k8s.kubeconfig_for(OPERATOR)
    process = OperatorProcess(kubeconfig, tmp_path / "operator.log").start()
    try:
        yield process
    finally:
        process.stop()


def make_secret(k8s: KubernetesEmulator, name: str, data: dict[str, str]) -> None:
    """A Secret without the label, as a user (or someone else) made it for other uses."""
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded,
    }))  # fmt: skip


def label(k8s: KubernetesEmulator, secret: str) -> None:
    """What the refusal tells the user to run."""
    k8s.kubectl("label", "secret", secret, f"{SECRET_LABEL}=true")


def apply_job(k8s: KubernetesEmulator, name: str, store: LocalServer, **spec: Any) -> None:
    doc = {
        "apiVersion": API_VERSION, "kind": "StreamJob", "metadata": {"name": name},
        "spec": {
            "job": "examples.counter:job", "keyGroups": 4, "parallelism": 1,
            "source": {"type": "generator", "keys": 100, "rate": {"recordsPerSecond": 200}},
            "sink": {"type": "null"}, "stateStore": {"url": store.url},
            "checkpointInterval": "200ms", "failoverAfter": "2s", **spec,
        },
    }  # fmt: skip
    k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(doc))


def status(k8s: KubernetesEmulator, name: str) -> Obj:
    s: Obj = (k8s.get("streamjobs.keyshift.dev", name) or {}).get("status") or {}
    return s


def ready(k8s: KubernetesEmulator, name: str) -> Obj:
    return next((c for c in status(k8s, name).get("conditions") or [] if c["type"] == "Ready"), {})


def events(k8s: KubernetesEmulator, name: str, reason: str) -> list[Obj]:
    return [e for e in k8s.list("events", "default")
            if (e.get("involvedObject") or {}).get("name") == name
            and e.get("reason") == reason]  # fmt: skip


def wait(k8s: KubernetesEmulator, operator: OperatorProcess, what: str, cond: Any, t: float) -> Any:
    try:
        return k8s.wait_for(cond, t, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- operator\n{operator.output()}") from None


def secret_reads(k8s: KubernetesEmulator, secret: str) -> int:
    """How often the operator has read (checked) the Secret so far."""
    return sum(1 for r in k8s.requests_of(OPERATOR)
               if (r.verb, r.resource, r.name) == ("get", "secrets", secret))  # fmt: skip


def worker_writes(k8s: KubernetesEmulator) -> list[str]:
    """The operator's creates and patches of StatefulSets."""
    writes = ("create", "patch", "update")
    return [f"{r.verb} {r.name}" for r in k8s.requests_of(OPERATOR)
            if r.resource == "statefulsets" and r.verb in writes]  # fmt: skip


def refused(k8s: KubernetesEmulator, name: str) -> Obj | None:
    """The Ready condition once it says the job waits for a Secret's label."""
    condition = ready(k8s, name)
    return condition if condition.get("status") == "False" and condition.get(
        "reason"
    ) == REFUSAL else None  # fmt: skip


def running(k8s: KubernetesEmulator, name: str) -> bool:
    s = status(k8s, name)
    return s.get("phase") == "Running" and ready(k8s, name).get("status") == "True"


def test_an_unlabelled_store_secret_is_refused_until_it_is_labelled(
    k8s: KubernetesEmulator, operator: OperatorProcess, store: LocalServer
) -> None:
    assert store.password is not None
    make_secret(k8s, "store", {"password": store.password})
    name = f"sec-{secrets.token_hex(3)}"
    apply_job(k8s, name, store, stateStore={"url": store.url, "secretRef": "store"})

    # refused: the status and an Event say which Secret, why, and the command to run
    condition = wait(k8s, operator, "the refusal in status", lambda: refused(k8s, name), 30)
    message = condition["message"]
    assert "Secret default/store (stateStore.secretRef)" in message
    assert f"kubectl -n default label secret store {SECRET_LABEL}=true" in message
    assert status(k8s, name)["phase"] == "Pending"
    (event,) = wait(k8s, operator, "the Event", lambda: events(k8s, name, REFUSAL), 15)
    assert event["type"] == "Warning" and event["message"] == message
    # nothing is deployed: no workers with the Secret mounted, nor anything else
    assert k8s.get("statefulsets", f"{name}-worker") is None
    assert k8s.get("configmaps", f"{name}-config") is None
    assert not k8s.list("pods", "default")
    # nor after a few more checks (the operator retries, and says it once)
    checks = secret_reads(k8s, "store")
    wait(k8s, operator, "three more checks", lambda: secret_reads(k8s, "store") >= checks + 3, 30)
    assert worker_writes(k8s) == []
    assert k8s.get("statefulsets", f"{name}-worker") is None
    assert len(events(k8s, name, REFUSAL)) == 1

    # labelled: the job goes on by itself, with the same operator
    label(k8s, "store")
    wait(k8s, operator, "the job running", lambda: running(k8s, name), 60)
    sts = k8s.get("statefulsets", f"{name}-worker")
    assert sts is not None
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    [mounted] = [v for v in volumes if v["name"] == "store-secret"]
    assert {s["secret"]["name"] for s in mounted["projected"]["sources"]} == {"store"}
    assert events(k8s, name, "SecretsAllowed")
    assert len(events(k8s, name, REFUSAL)) == 1  # one Event per refusal, not per retry


def test_an_unlabelled_env_secret_does_not_reach_the_workers_of_a_running_job(
    k8s: KubernetesEmulator, operator: OperatorProcess, standalone_server: LocalServer
) -> None:
    name = f"sec-{secrets.token_hex(3)}"
    apply_job(k8s, name, standalone_server)
    wait(k8s, operator, "the job running", lambda: running(k8s, name), 60)
    sts_name = f"{name}-worker"
    before = (k8s.get("statefulsets", sts_name) or {})["spec"]["template"]

    make_secret(k8s, "cloud", {"key": "s3cr3t"})
    ref = {"secretKeyRef": {"name": "cloud", "key": "key"}}
    apply_job(k8s, name, standalone_server, env=[{"name": "CLOUD_KEY", "valueFrom": ref}])

    condition = wait(k8s, operator, "the refusal in status", lambda: refused(k8s, name), 30)
    where = "Secret default/cloud (env[0] CLOUD_KEY: valueFrom.secretKeyRef)"
    assert where in condition["message"]
    assert "1 workers run" in condition["message"]  # and the job goes on as it was
    wait(k8s, operator, "the Event", lambda: events(k8s, name, REFUSAL), 15)
    s = status(k8s, name)
    assert s["phase"] == "Running" and s["parallelism"] == 1
    # the StatefulSet is left as it was, through a few more checks: no pod gets the Secret
    writes = worker_writes(k8s)
    checks = secret_reads(k8s, "cloud")
    wait(k8s, operator, "three more checks", lambda: secret_reads(k8s, "cloud") >= checks + 3, 30)
    assert worker_writes(k8s) == writes
    assert (k8s.get("statefulsets", sts_name) or {})["spec"]["template"] == before
    assert len(events(k8s, name, REFUSAL)) == 1

    label(k8s, "cloud")

    def env_applied() -> bool:
        sts = k8s.get("statefulsets", sts_name) or {}
        env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
        return {"name": "CLOUD_KEY", "valueFrom": ref} in env

    wait(k8s, operator, "the env in the StatefulSet", env_applied, 30)
    wait(k8s, operator, "the job Ready again", lambda: running(k8s, name), 60)


class RecordingPrometheus:
    """A stand-in for Prometheus on 127.0.0.1 that answers every query with an empty
    vector and records each request's Authorization header; stopped by the test."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        recorded = self.authorizations

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                recorded.append(self.headers.get("Authorization"))
                body = json.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": []}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingPrometheus:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_the_autoscaler_reads_nothing_from_an_unlabelled_prometheus_secret(
    k8s: KubernetesEmulator, operator: OperatorProcess, standalone_server: LocalServer
) -> None:
    token = secrets.token_hex(8)
    make_secret(k8s, "prom", {"token": token})
    name = f"sec-{secrets.token_hex(3)}"
    with RecordingPrometheus() as prometheus:
        apply_job(k8s, name, standalone_server, autoscaler={
            "enabled": True, "mode": "recommend", "intervalSeconds": 1,
            "prometheus": {"url": prometheus.url, "secretRef": "prom"},
        })  # fmt: skip
        condition = wait(k8s, operator, "the refusal in status", lambda: refused(k8s, name), 30)
        assert "Secret default/prom (autoscaler.prometheus.secretRef)" in condition["message"]
        wait(k8s, operator, "the Event", lambda: events(k8s, name, REFUSAL), 15)
        assert k8s.get("statefulsets", f"{name}-worker") is None
        assert f"Bearer {token}" not in prometheus.authorizations

        label(k8s, "prom")
        wait(k8s, operator, "the job running", lambda: running(k8s, name), 60)
        wait(k8s, operator, "a query with the token",
             lambda: f"Bearer {token}" in prometheus.authorizations, 30)  # fmt: skip
