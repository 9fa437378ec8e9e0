"""The state store the chart deploys or points at, and how a StreamJob reaches it.

The store outlives every StreamJob and the release itself: its volumes and its
password Secret stay when the chart is uninstalled, and no StreamJob owns it.
"""

from __future__ import annotations

import base64
from typing import Any

from keyshift.controller.k8s_api import SECRET_LABEL
from keyshift.runtime.config import StreamJobSpec
from tests.chart.render import NAMESPACE, find, notes, notes_streamjob, one, render
from tests.chart.validation import VERSIONS, problems

Obj = dict[str, Any]

CLUSTER = {"stateStore": {"managed": {"mode": "cluster", "cluster": {"replicasPerMaster": 1}}}}
EXTERNAL = {
    "stateStore": {
        "managed": {"enabled": False},
        "external": {"enabled": True, "url": "redis://valkey.data:6379", "password": "pw"},
    },
    "operator": {"namespaces": ["team-a", "team-b"]},
}


def config(objects: list[Obj]) -> list[str]:
    text: str = one(objects, "ConfigMap", "keyshift-valkey")["data"]["valkey.conf"]
    return [line.strip() for line in text.splitlines()]


def container(obj: Obj) -> Obj:
    found: Obj = obj["spec"]["template"]["spec"]["containers"][0]
    return found


def test_the_managed_store_is_durable_and_outlives_the_release() -> None:
    objects = render()
    lines = config(objects)
    assert {"appendonly yes", "appendfsync everysec", "maxmemory-policy noeviction"} <= set(lines)
    sts = one(objects, "StatefulSet", "keyshift-valkey")
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain", "whenScaled": "Retain",
    }  # fmt: skip
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    assert {"name": "data", "mountPath": "/data"} in container(sts)["volumeMounts"]
    assert "ownerReferences" not in sts["metadata"]

    secret = one(objects, "Secret", "keyshift-store")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # opted in: the operator reads and mounts no Secret without this label
    assert secret["metadata"]["labels"][SECRET_LABEL] == "true"
    assert len(base64.b64decode(secret["data"]["password"])) == 32
    env = {e["name"]: e.get("valueFrom") for e in container(sts)["env"]}
    assert env["VALKEY_PASSWORD"] == {"secretKeyRef": {"name": "keyshift-store", "key": "password"}}


def test_the_managed_store_has_probes_and_spreads_over_nodes() -> None:
    sts = one(render(CLUSTER), "StatefulSet", "keyshift-valkey")
    valkey = container(sts)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "valkey-cli" in " ".join(valkey[probe]["exec"]["command"]), probe
    terms = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = terms["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == (sts["spec"]["selector"]["matchLabels"])
    )


def test_a_given_password_is_the_secrets() -> None:
    values = {"stateStore": {"managed": {"auth": {"password": "correct-horse"}}}}
    secret = one(render(values), "Secret", "keyshift-store")
    assert base64.b64decode(secret["data"]["password"]) == b"correct-horse"


def test_an_existing_secret_is_used_and_none_is_made() -> None:
    objects = render({"stateStore": {"managed": {"auth": {"existingSecret": "my-valkey"}}}})
    assert not find(objects, "Secret")
    env = {e["name"]: e.get("valueFrom") for e in container(one(objects, "StatefulSet"))["env"]}
    assert env["VALKEY_PASSWORD"]["secretKeyRef"]["name"] == "my-valkey"
    assert (
        notes_streamjob({"stateStore": {"managed": {"auth": {"existingSecret": "my-valkey"}}}})[
            "spec"
        ]["stateStore"]["secretRef"]
        == "my-valkey"
    )
    # a Secret of the user's: the notes say to label it, or the operator will not use it
    text = notes({"stateStore": {"managed": {"auth": {"existingSecret": "my-valkey"}}}})
    assert f"label secret my-valkey {SECRET_LABEL}=true" in text


def test_cluster_mode_runs_masters_with_replicas_and_forms_the_cluster() -> None:
    objects = render(CLUSTER)
    assert {"cluster-enabled yes", "cluster-preferred-endpoint-type hostname"} <= set(
        config(objects)
    )
    sts = one(objects, "StatefulSet", "keyshift-valkey")
    assert sts["spec"]["replicas"] == 6  # 3 masters, 1 replica each
    assert "--masterauth" in container(sts)["args"]
    job = one(objects, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    script = container(job)["args"][0]
    assert "--cluster-replicas 1" in script
    for i in range(6):
        assert f"keyshift-valkey-{i}.keyshift-valkey-headless.{NAMESPACE}.svc" in script


def test_the_notes_streamjob_reaches_the_managed_store() -> None:
    job = notes_streamjob({})
    assert not [p for p in problems(job, VERSIONS[0])], problems(job, VERSIONS[0])
    spec = StreamJobSpec.model_validate(job["spec"])
    service = one(render(), "Service", "keyshift-valkey")
    assert spec.state_store.url == f"redis://keyshift-valkey.{NAMESPACE}.svc:6379"
    assert service["spec"]["ports"][0]["port"] == 6379
    assert spec.state_store.secret_ref == "keyshift-store"


def test_the_notes_streamjob_reaches_a_cluster_store_through_its_pods() -> None:
    url = StreamJobSpec.model_validate(notes_streamjob(CLUSTER)["spec"]).state_store.url
    assert url is not None and url.startswith("redis+cluster://")
    seeds = url.removeprefix("redis+cluster://").split(",")
    headless = one(render(CLUSTER), "Service", "keyshift-valkey-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert seeds == [
        f"keyshift-valkey-{i}.keyshift-valkey-headless.{NAMESPACE}.svc:6379" for i in range(3)
    ]


def test_an_external_store_gets_a_secret_in_each_watched_namespace_and_no_servers() -> None:
    objects = render(EXTERNAL)
    assert not find(objects, "StatefulSet") and not find(objects, "Job")
    secrets = find(objects, "Secret", "keyshift-store")
    assert sorted(s["metadata"]["namespace"] for s in secrets) == [NAMESPACE, "team-a", "team-b"]
    assert {base64.b64decode(s["data"]["password"]) for s in secrets} == {b"pw"}
    assert {s["metadata"]["labels"][SECRET_LABEL] for s in secrets} == {"true"}
    job = notes_streamjob(EXTERNAL)
    assert job["spec"]["stateStore"] == {"url": "redis://valkey.data:6379",
                                         "secretRef": "keyshift-store"}  # fmt: skip


def test_an_external_store_without_a_password_needs_no_secret() -> None:
    values = {"stateStore": {"managed": {"enabled": False},
                             "external": {"enabled": True, "url": "redis://v:6379"}}}  # fmt: skip
    assert not find(render(values), "Secret")
    assert notes_streamjob(values)["spec"]["stateStore"] == {"url": "redis://v:6379"}
