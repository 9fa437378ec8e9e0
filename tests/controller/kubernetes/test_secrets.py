"""The operator reads and mounts only the Secrets that opt in with the label
``keyshift.dev/streamjob-secret: "true"``: which Secrets a spec names, the refusal and its
message, the status it gives, and the refusal at the API boundary (against the emulator).
The operator's whole reaction (status, Events, recovery) is in
``tests/e2e/test_operator_secrets.py``."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import kubernetes
import pytest

from keyshift.api.names import API_VERSION
from keyshift.api.spec import StreamJobSpec
from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.core.records import ControllerRecord
from keyshift.controller.kubernetes.api import (
    SECRET_LABEL,
    KubeApi,
    RefusedSecret,
    SecretKeyMissing,
    SecretNotAllowed,
    secret_allowed,
    secret_refusal,
)
from keyshift.controller.kubernetes.job import (
    apply_owned_objects,
    check_secrets,
    kafka_credentials,
)
from keyshift.controller.kubernetes.objects import secret_refs
from keyshift.controller.kubernetes.status import job_status, refused_status
from keyshift.store import Assignment
from tests.k8s.emulator import KubernetesEmulator

Obj = dict[str, Any]


def spec(**fields: Any) -> StreamJobSpec:
    return StreamJobSpec.model_validate({
        "job": "examples.counter:job", "keyGroups": 4,
        "stateStore": {"url": "redis://valkey:6379"}, **fields,
    })  # fmt: skip


def secret_key_ref(var: str, secret: str) -> Obj:
    return {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}


def test_every_secret_the_spec_names_is_found_with_where() -> None:
    s = spec(
        stateStore={"url": "redis://valkey:6379", "secretRef": "store"},
        autoscaler={"enabled": True, "prometheus": {"url": "http://p:9090", "secretRef": "prom"}},
        env=[
            {"name": "PLAIN", "value": "x"},
            secret_key_ref("API_KEY", "api"),
            {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
            secret_key_ref("STORE_AGAIN", "store"),
        ],
    )
    assert secret_refs(s) == {
        "store": ["stateStore.secretRef", "env[3] STORE_AGAIN: valueFrom.secretKeyRef"],
        "prom": ["autoscaler.prometheus.secretRef"],
        "api": ["env[1] API_KEY: valueFrom.secretKeyRef"],
    }


def test_an_unused_prometheus_secret_and_odd_env_refs_are_not_checked() -> None:
    s = spec(
        autoscaler={"enabled": False, "prometheus": {"url": "http://p:9090", "secretRef": "p"}},
        env=[{"name": "A", "valueFrom": {"secretKeyRef": "not-a-map"}},
             {"name": "B", "valueFrom": {"secretKeyRef": {"key": "no-name"}}}],
    )  # fmt: skip
    assert secret_refs(s) == {}
    assert secret_refs(spec()) == {}


def test_only_the_label_with_the_value_true_opts_in() -> None:
    assert secret_allowed({"metadata": {"labels": {SECRET_LABEL: "true"}}})
    for labels in ({}, {SECRET_LABEL: "false"}, {SECRET_LABEL: "yes"}, None):
        assert not secret_allowed({"metadata": {"labels": labels}})
    assert not secret_allowed({})


def test_the_refusal_says_which_secret_why_and_how_to_let_the_job_go_on() -> None:
    message = secret_refusal("team", [
        RefusedSecret("store", "stateStore.secretRef"),
        RefusedSecret("api", "env[0] API_KEY: valueFrom.secretKeyRef"),
        RefusedSecret("gone", "autoscaler.prometheus.secretRef", missing=True),
    ])  # fmt: skip
    assert f'Secret team/store (stateStore.secretRef) is not labelled {SECRET_LABEL}="true"' in (
        message
    )
    assert "Secret team/gone (autoscaler.prometheus.secretRef) does not exist" in message
    assert f"kubectl -n team label secret api store {SECRET_LABEL}=true" in message
    assert "create gone with that label" in message
    assert "goes on by itself" in message
    exc = SecretNotAllowed("team", [RefusedSecret("store", "stateStore.secretRef")])
    assert exc.reason == "SecretNotAllowed" and str(exc).startswith("Secret team/store")


def test_a_refused_secret_makes_the_job_not_ready_and_says_why() -> None:
    waiting = refused_status("SecretNotAllowed", "Secret t/s ... label", [], 7, at=100.0)
    assert waiting["phase"] == "Pending" and waiting["observedGeneration"] == 7
    ready = next(c for c in waiting["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False", "SecretNotAllowed", "Secret t/s ... label",
    )  # fmt: skip

    # a job that runs: it keeps running as it was, and Ready says why it is not
    workers = {0: WorkerInfo(0, "counter-worker-0", True, True, None)}
    common: dict[str, Any] = {
        "assignment": Assignment(4, 1, (0, 0, 0, 0)), "workers": workers,
        "record": ControllerRecord(job="counter"), "selector": "s", "previous_conditions": [],
        "observed_generation": 3, "error": None, "at": 100.0,
    }  # fmt: skip
    running = job_status(**common)
    assert next(c for c in running["conditions"] if c["type"] == "Ready")["status"] == "True"
    refused = job_status(**common, refused="Secret t/api (env[0] ...) is not labelled")
    assert refused["phase"] == "Running" and refused["parallelism"] == 1
    ready = next(c for c in refused["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "SecretNotAllowed"
    assert ready["message"].startswith("Secret t/api") and "1 workers run" in ready["message"]


# -- at the API boundary, against the emulator -------------------------------------------


@pytest.fixture
async def api(k8s: KubernetesEmulator) -> AsyncIterator[KubeApi]:
    client = kubernetes.config.new_client_from_config(config_file=str(k8s.kubeconfig))  # type: ignore[no-untyped-call]
    kube = KubeApi(client)
    yield kube
    await kube.close()


def make_secret(k8s: KubernetesEmulator, name: str, labels: dict[str, str] | None = None) -> None:
    k8s.create("secrets", {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "data": {"password": base64.b64encode(b"hunter2").decode()},
    }, "default")  # fmt: skip


async def test_the_api_reads_only_labelled_secrets(k8s: KubernetesEmulator, api: KubeApi) -> None:
    make_secret(k8s, "plain")
    make_secret(k8s, "no", {SECRET_LABEL: "false"})
    make_secret(k8s, "opted-in", {SECRET_LABEL: "true"})
    for name in ("plain", "no"):
        with pytest.raises(SecretNotAllowed) as info:
            await api.read_secret_key("default", name, "password", "stateStore.secretRef")
        assert info.value.refused == (RefusedSecret(name, "stateStore.secretRef"),)
        assert "hunter2" not in str(info.value)
    with pytest.raises(SecretNotAllowed) as info:
        await api.read_secret_key("default", "absent", "password", "stateStore.secretRef")
    assert info.value.refused[0].missing
    assert await api.read_secret_key("default", "opted-in", "password", "x") == "hunter2"
    with pytest.raises(SecretKeyMissing, match="has no key 'token'"):
        await api.read_secret_key("default", "opted-in", "token", "x")


async def test_the_kafka_credentials_of_the_workers_are_read_for_the_idle_probe(
    k8s: KubernetesEmulator, api: KubeApi
) -> None:
    """While a job is scaled to zero the operator reads its Kafka topic itself, with the
    credentials the workers get from ``spec.env``; nothing else of the env, and a Secret
    that does not opt in is refused as everywhere."""
    make_secret(k8s, "kafka", {SECRET_LABEL: "true"})
    make_secret(k8s, "other")
    s = spec(env=[
        {"name": "KEYSHIFT_KAFKA_SASL_USERNAME", "value": "keyshift"},
        {"name": "KEYSHIFT_KAFKA_SASL_PASSWORD",
         "valueFrom": {"secretKeyRef": {"name": "kafka", "key": "password"}}},
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "other", "key": "password"}}},
    ])  # fmt: skip
    assert await kafka_credentials(api, "default", s) == {
        "KEYSHIFT_KAFKA_SASL_USERNAME": "keyshift", "KEYSHIFT_KAFKA_SASL_PASSWORD": "hunter2",
    }  # fmt: skip
    refused = spec(
        env=[
            {
                "name": "KEYSHIFT_KAFKA_SASL_PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": "other", "key": "password"}},
            }
        ]
    )
    with pytest.raises(SecretNotAllowed):
        await kafka_credentials(api, "default", refused)


async def test_nothing_is_created_while_a_secret_is_refused(
    k8s: KubernetesEmulator, api: KubeApi
) -> None:
    make_secret(k8s, "store", {SECRET_LABEL: "true"})
    make_secret(k8s, "api")
    raw = {
        "job": "examples.counter:job", "keyGroups": 4,
        "stateStore": {"url": "redis://valkey:6379", "secretRef": "store"},
        "env": [secret_key_ref("API_KEY", "api"), secret_key_ref("OTHER", "absent")],
    }  # fmt: skip
    meta = {"name": "sj", "namespace": "default", "uid": "u-1"}
    body = {"apiVersion": API_VERSION, "kind": "StreamJob", "metadata": meta,
            "spec": raw}  # fmt: skip
    s = StreamJobSpec.model_validate(raw)
    with pytest.raises(SecretNotAllowed) as info:  # every refused Secret at once
        await apply_owned_objects(api, body, s)
    assert [(r.name, r.missing) for r in info.value.refused] == [("api", False), ("absent", True)]
    for kind in ("configmaps", "services", "pdb", "statefulsets"):
        assert not k8s.list(kind, "default"), kind

    k8s.patch("secrets", "api", {"metadata": {"labels": {SECRET_LABEL: "true"}}})
    make_secret(k8s, "absent", {SECRET_LABEL: "true"})
    await check_secrets(api, "default", s)
    changed = await apply_owned_objects(api, body, s)
    assert "created StatefulSet sj-worker" in changed
    sts = k8s.get("statefulsets", "sj-worker")
    assert sts is not None
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    assert secret_key_ref("API_KEY", "api") in env
