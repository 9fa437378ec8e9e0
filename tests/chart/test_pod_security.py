"""Every pod keyshift runs passes the "restricted" Pod Security Standard.

The operator's and the store's pods come from the rendered chart; the workers' pods
from the operator's own builder (``kubernetes.objects.worker_statefulset``), which is what
the operator creates for each StreamJob.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from keyshift.api.names import API_VERSION
from keyshift.api.spec import StreamJobSpec
from keyshift.controller.kubernetes.objects import worker_statefulset
from tests.chart.pod_security import violations
from tests.chart.render import find, one, render

Obj = dict[str, Any]

CLUSTER_STORE = {"stateStore": {"managed": {"mode": "cluster"}}}


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


def streamjob(**spec: Any) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": "counter", "namespace": "streams", "uid": "0000-1111"},
        "spec": {
            "job": "examples.counter:job",
            "keyGroups": 8,
            "parallelism": 2,
            "source": {"type": "generator"},
            "stateStore": {"url": "redis://keyshift-valkey.streams.svc:6379"},
            **spec,
        },
    }


def workers(body: Obj) -> Obj:
    return worker_statefulset(body, StreamJobSpec.model_validate(body["spec"]), 2)


WORKERS = {
    "plain": streamjob(),
    "with a store Secret and user pod fields": streamjob(
        stateStore={"url": "redis://keyshift-valkey.streams.svc:6379", "secretRef": "store"},
        podAnnotations={"prometheus.io/scrape": "true"},
        resources={"requests": {"cpu": "250m"}},
    ),
}


def test_worker_pods_with_a_full_pod_template_stay_restricted() -> None:
    """Everything ``spec.podTemplate`` takes, at once: the pod still passes, and a named
    ServiceAccount gets no token unless the template asks for one."""
    from tests.controller.kubernetes.test_objects import TEMPLATE

    pod = pod_spec(workers(streamjob(podTemplate=TEMPLATE)))
    assert violations(pod) == []
    assert pod["serviceAccountName"] == "stream-jobs"
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("body", WORKERS.values(), ids=WORKERS.keys())
def test_worker_pods_are_restricted_and_get_no_api_token(body: Obj) -> None:
    pod = pod_spec(workers(body))
    assert violations(pod) == []
    assert pod["automountServiceAccountToken"] is False
    assert not pod.get("serviceAccountName"), "workers talk to the store, never to the API"


@pytest.mark.parametrize("values", [{}, {"operator": {"replicas": 2, "scope": "cluster"}}])
def test_the_operator_pod_is_restricted(values: Obj) -> None:
    deployment = one(render(values), "Deployment")
    pod = pod_spec(deployment)
    assert violations(pod) == []
    # the operator does use the API, through its own ServiceAccount's token
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == one(render(values), "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("values", [{}, CLUSTER_STORE], ids=["standalone", "cluster"])
def test_the_store_pods_are_restricted(values: Obj) -> None:
    objects = render(values)
    pods = [pod_spec(o) for o in find(objects, "StatefulSet") + find(objects, "Job")]
    assert len(pods) == (2 if values else 1)
    for pod in pods:
        assert violations(pod) == []
        assert pod["automountServiceAccountToken"] is False


BREACHES: dict[str, tuple[str, Any, str]] = {
    "root": ("securityContext", {"runAsNonRoot": False}, "runAsNonRoot is not true"),
    "escalation": ("container", {"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation"),
    "capabilities": ("container", {"capabilities": {"drop": []}}, "capabilities not dropped"),
    "seccomp": ("container", {"seccompProfile": {"type": "Unconfined"}}, "seccomp profile"),
    "writable root": ("container", {"readOnlyRootFilesystem": False}, "root filesystem"),
    "privileged": ("container", {"privileged": True}, "privileged"),
}


@pytest.mark.parametrize(("where", "change", "message"), BREACHES.values(), ids=BREACHES.keys())
def test_the_check_finds_each_breach(where: str, change: Obj, message: str) -> None:
    pod = copy.deepcopy(pod_spec(workers(streamjob())))
    if where == "securityContext":
        pod["securityContext"].update(change)
        pod["containers"][0]["securityContext"].pop("runAsNonRoot")
    else:
        pod["containers"][0]["securityContext"].update(change)
    assert any(message in v for v in violations(pod)), violations(pod)
