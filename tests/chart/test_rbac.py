"""The operator does its whole job with the chart's Role, and the Role grants nothing more.

The real operator, run with the chart's watch and peering options, drives a StreamJob
through create, scale, drift correction, failover and delete against the API emulator.
The emulator logs each request with the token of the client that made it and enforces
the Role the chart renders on the operator's token (403 Forbidden otherwise, as RBAC
would). The test then checks both ways: every call the operator made was allowed (but
for kopf's optional cluster scanning, which it does without), and every grant was used.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshift.api.names import API_VERSION
from keyshift.controller.kubernetes.api import SECRET_LABEL
from keyshift.store.server import LocalServer
from tests.chart.rbac import Grant, grants, needed, role_allows
from tests.chart.render import chart_crds, one, render
from tests.e2e.harness import OperatorProcess
from tests.e2e.kubelet import PodRunner
from tests.k8s.emulator import ApiRequest, KubernetesEmulator
from tests.support import REPO

NAMESPACE = "default"
OPERATOR = "operator"  # the token of the operator's kubeconfig


@dataclass(frozen=True)
class Scope:
    """How the chart runs the operator: its values, its peering object's and Role's kinds."""

    values: dict[str, Any]
    peering: str
    role: str


NAMESPACED = Scope(
    {"operator": {"replicas": 2, "scope": "namespace", "namespaces": [NAMESPACE]}},
    "KopfPeering", "Role",
)  # fmt: skip
CLUSTER = Scope(
    {"operator": {"replicas": 2, "scope": "cluster"}}, "ClusterKopfPeering", "ClusterRole"
)

# The chart's operator options that decide its API calls: what it watches, its peering.
CHART_OPTIONS = ("--namespace=", "--all-namespaces", "--peering=")


def chart_options(scope: Scope) -> list[str]:
    """The rendered Deployment's watch and peering options, with a fixed priority and a
    short peering lifetime (a prompt exit) in place of the chart's."""
    deployment = one(render(scope.values), "Deployment")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    kept = [a for a in args if a.startswith(CHART_OPTIONS)]
    assert any(a.startswith("--peering=") for a in kept), args
    return [*kept, "--priority=100", "--peering-lifetime=4"]


class Operator(OperatorProcess):
    """``keyshift operator`` with the chart's options (the harness always adds a namespace)."""

    def start(self, **extra_env: str) -> Operator:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **extra_env}
        cmd = [sys.executable, "-m", "keyshift.controller.cli", "operator", *self.options]
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        return self


# Made but not granted, on purpose: kopf observes the cluster's namespaces (for glob
# patterns) and CRDs (for resources that appear later). Refused, it falls back to the
# namespaces and resources it was started with, which is all the operator needs, but
# only after retrying the namespace list for about a minute (its error backoffs);
# ``settings.scanning.disabled = True`` at the operator's startup skips these calls.
KOPF_CLUSTER_SCANNING = {
    Grant("", "namespaces", "list"),
    Grant("", "namespaces", "watch"),
    Grant("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    Grant("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalServer]:
    """A store with a password, so that the operator reads the StreamJob's Secret."""
    server = LocalServer(tmp_path / "valkey", password=secrets.token_hex(8)).start()
    yield server
    server.stop()


def streamjob(name: str, store: LocalServer, parallelism: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": name},
        "spec": {
            "job": "examples.counter:job",
            "keyGroups": 4,
            "parallelism": parallelism,
            "source": {"type": "generator", "keys": 100, "rate": {"recordsPerSecond": 200}},
            "sink": {"type": "null"},
            "stateStore": {"url": store.url, "secretRef": "store"},
            "failoverAfter": "2s",
        },
    }


def apply(k8s: KubernetesEmulator, obj: dict[str, Any]) -> None:
    k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(obj))


def run_the_operator_through_a_jobs_life(
    k8s: KubernetesEmulator, runner: PodRunner, store: LocalServer, tmp_path: Path, scope: Scope
) -> list[ApiRequest]:
    """What a user does to a StreamJob, with the operator as the chart runs it (peering);
    the operator's requests."""
    for crd in chart_crds().values():  # as `helm install` does
        k8s.kubectl("apply", "--validate=false", "-f", str(crd))
    apply(k8s, one(render(scope.values), scope.peering))
    assert store.password is not None
    password = base64.b64encode(store.password.encode()).decode()
    apply(k8s, {"apiVersion": "v1", "kind": "Secret", "data": {"password": password},
                "metadata": {"name": "store", "labels": {SECRET_LABEL: "true"}}})  # fmt: skip
    operator = Operator(
        k8s.kubeconfig_for(OPERATOR), tmp_path / "operator.log", options=tuple(chart_options(scope))
    ).start()
    name = f"rbac-{secrets.token_hex(3)}"

    def status() -> dict[str, Any]:
        s: dict[str, Any] = (k8s.get("streamjobs.keyshift.dev", name) or {}).get("status") or {}
        return s

    def running(parallelism: int, rescales: int) -> bool:
        s = status()
        return (
            s.get("phase") == "Running"
            and s.get("parallelism") == parallelism
            and len(s.get("rescales") or []) >= rescales
            and s.get("rescale") is None
        )

    def wait(condition: Callable[[], Any], timeout: float, what: str) -> None:
        try:
            k8s.wait_for(condition, timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- operator\n{operator.output()}") from None

    try:
        apply(k8s, streamjob(name, store, 1))
        # up to a minute more while kopf retries the refused namespace list (see above)
        wait(lambda: running(1, 1), 120, f"{name} running")
        k8s.kubectl("scale", f"streamjob/{name}", "--replicas=2")
        wait(lambda: running(2, 2), 60, f"{name} rescaled to 2")

        # drift: someone edits the Service and the budget; the operator puts them back
        k8s.patch("services", f"{name}-workers", {"spec": {"publishNotReadyAddresses": False}})
        k8s.patch("pdb", f"{name}-workers", {"spec": {"maxUnavailable": 2}})
        wait(
            lambda: (k8s.get("pdb", f"{name}-workers") or {})["spec"]["maxUnavailable"] == 1
            and (k8s.get("services", f"{name}-workers") or {})["spec"]["publishNotReadyAddresses"],
            30, "the drift corrected",
        )  # fmt: skip

        # failover: worker 1 stays away past failoverAfter, then comes back (a rebalance)
        runner.hold(f"{name}-worker-1", 5.0)
        k8s.kubectl("delete", "pod", f"{name}-worker-1", "--wait=false")
        wait(
            lambda: [r["reason"] for r in status().get("rescales") or []][-2:]
            == ["failover", "rebalance"] and running(2, 4),
            60, "the failover and the rebalance",
        )  # fmt: skip

        k8s.kubectl("annotate", "streamjob", name, "keyshift.dev/delete-state=true")
        k8s.kubectl("delete", "streamjob", name, "--wait=false")
        wait(lambda: k8s.get("streamjobs.keyshift.dev", name) is None, 60, f"{name} deleted")
    finally:
        operator.stop()
    return k8s.requests_of(OPERATOR)


@pytest.mark.parametrize("scope", [NAMESPACED, CLUSTER], ids=["namespace", "cluster"])
def test_the_role_allows_exactly_what_the_operator_does(
    k8s: KubernetesEmulator, pod_runner: PodRunner, store: LocalServer, tmp_path: Path,
    scope: Scope,
) -> None:  # fmt: skip
    role = one(render(scope.values), scope.role)
    allows = role_allows(role)
    k8s.handler.authorize = lambda request: request.user != OPERATOR or allows(request)

    requests = run_the_operator_through_a_jobs_life(k8s, pod_runner, store, tmp_path, scope)

    refused = sorted({str(needed(r)) for r in requests if not allows(r)})
    expected = sorted(str(g) for g in KOPF_CLUSTER_SCANNING)
    assert set(refused) <= set(expected), f"the {scope.role} refused the operator: {refused}"
    used = {needed(r) for r in requests if allows(r)}
    unused = sorted(str(g) for g in grants(role["rules"]) - used)
    assert not unused, f"the {scope.role} grants what the operator never did: {unused}"


def request(
    verb: str, group: str, resource: str, namespace: str | None, sub: str | None = None
) -> ApiRequest:
    return ApiRequest(OPERATOR, verb, group, resource, sub, namespace, None)


def test_the_check_is_rbacs_namespace_verb_and_subresource() -> None:
    allows = role_allows(one(render(NAMESPACED.values), "Role"))
    assert allows(request("patch", "keyshift.dev", "streamjobs", NAMESPACE, "status"))
    assert not allows(request("patch", "keyshift.dev", "streamjobs", "other", "status"))
    assert not allows(request("update", "keyshift.dev", "streamjobs", NAMESPACE, "status"))
    assert not allows(request("patch", "keyshift.dev", "streamjobs", NAMESPACE, "scale"))
    assert not allows(request("delete", "apps", "statefulsets", NAMESPACE))
    assert not allows(request("list", "", "secrets", NAMESPACE))
    assert not allows(request("watch", "", "secrets", NAMESPACE))  # get only: least privilege
    assert not allows(request("list", "", "pods", None))  # a Role has no cluster scope
    cluster = role_allows(one(render(CLUSTER.values), "ClusterRole"))
    assert cluster(request("list", "", "pods", None))
    assert cluster(request("patch", "kopf.dev", "clusterkopfpeerings", None))
