"""The state store the chart deploys or points at, and how a StreamJob reaches it.

The store outlives every StreamJob and the release itself: its volumes and its
password Secret stay when the chart is uninstalled, and no StreamJob owns it.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
import yaml

from keyshift.api.names import API_VERSION
from keyshift.api.spec import StreamJobSpec
from keyshift.controller.kubernetes.api import SECRET_LABEL
from keyshift.controller.kubernetes.objects import worker_statefulset
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


def scripts(objects: list[Obj]) -> dict[str, str]:
    data: dict[str, str] = one(objects, "ConfigMap", "keyshift-valkey")["data"]
    return data


def volumes(obj: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in obj["spec"]["template"]["spec"].get("volumes") or []}


def auth_volume(obj: Obj) -> Obj:
    """The store's Secret as a pod mounts it (the file the password is read from)."""
    secret: Obj = volumes(obj)["auth"]["secret"]
    mounts = {m["name"]: m for m in container(obj)["volumeMounts"]}
    assert mounts["auth"] == {"name": "auth", "mountPath": "/run/secrets/valkey", "readOnly": True}
    return secret


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
    assert auth_volume(sts) == {"secretName": "keyshift-store", "defaultMode": 0o440,
                                "items": [{"key": "password", "path": "password"}]}  # fmt: skip


def test_the_managed_store_has_probes_and_spreads_over_nodes() -> None:
    sts = one(render(CLUSTER), "StatefulSet", "keyshift-valkey")
    valkey = container(sts)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # valkey-cli through cli.sh: the password from the Secret's file
        assert "/etc/valkey/cli.sh -h 127.0.0.1 ping" in " ".join(valkey[probe]["exec"]["command"])
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
    assert auth_volume(one(objects, "StatefulSet"))["secretName"] == "my-valkey"
    assert auth_volume(one(render({"stateStore": {"managed": {
        "mode": "cluster", "auth": {"existingSecret": "my-valkey"}}}}), "Job"))["secretName"] == (
        "my-valkey"
    )  # fmt: skip
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
    start = scripts(objects)["start.sh"]
    assert "masterauth" in start and "--cluster-announce-hostname" in start
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


# ---------------------------------------------------------------- hardening (issue 17 §2)

PASSWORD = "correct-horse-battery-staple"
TLS = {"stateStore": {"managed": {"tls": {"enabled": True}}}}
TLS_CLUSTER = {"stateStore": {"managed": {"mode": "cluster", "tls": {"enabled": True}}}}
SHAPES = {"standalone": {}, "cluster": CLUSTER, "standalone TLS": TLS, "cluster TLS": TLS_CLUSTER}


def with_password(values: Obj) -> Obj:
    store = values.get("stateStore", {}).get("managed", {})
    return {"stateStore": {"managed": {**store, "auth": {"password": PASSWORD}}}}


def pod_templates(objects: list[Obj]) -> list[tuple[str, Obj]]:
    return [
        (f"{o['kind']} {o['metadata']['name']}", o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("StatefulSet", "Deployment", "Job")
    ]


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (a reference to no variable stays as it is)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg)


def argv_strings(pod: Obj, objects: list[Obj]) -> list[str]:
    """Every string a container is started or probed with, as a process listing shows it:
    with Kubernetes' ``$(VAR)`` expansion of command and args, a variable from a rendered
    Secret's key resolved to its value."""
    secrets = {
        (o["metadata"]["name"], k): base64.b64decode(v).decode()
        for o in objects
        if o["kind"] == "Secret"
        for k, v in o["data"].items()
    }
    out: list[str] = []
    for c in pod.get("initContainers", []) + pod["containers"]:
        env: dict[str, str] = {}
        for var in c.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            env[var["name"]] = (
                secrets.get((ref["name"], ref["key"]), "") if ref else str(var.get("value", ""))
            )
        out += [expand(arg, env) for arg in c.get("command", []) + c.get("args", [])]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            out += c.get(probe, {}).get("exec", {}).get("command", [])
    return out


@pytest.mark.parametrize("values", SHAPES.values(), ids=SHAPES.keys())
def test_the_password_is_in_no_command_line_nor_environment(values: Obj) -> None:
    objects = render(with_password(values))
    assert base64.b64decode(one(objects, "Secret", "keyshift-store")["data"]["password"]) == (
        PASSWORD.encode()
    )
    pods = pod_templates(objects)
    assert {name for name, _ in pods} >= {"StatefulSet keyshift-valkey"}
    for name, pod in pods:
        argv = argv_strings(pod, objects)
        assert argv, name
        assert not [a for a in argv if PASSWORD in a], name
        for c in pod["containers"]:
            # no variable holds it (nor names the Secret's password): the store's
            # containers read it from the mounted file
            for var in c.get("env", []):
                assert PASSWORD not in str(var.get("value", "")), name
                ref = var.get("valueFrom", {}).get("secretKeyRef", {})
                assert ref.get("key") != "password" or "keyshift-valkey" not in name, name
    # nowhere but in the Secret
    shown = yaml.safe_dump_all([o for o in objects if o["kind"] != "Secret"])
    assert PASSWORD not in shown


@pytest.mark.parametrize("values", SHAPES.values(), ids=SHAPES.keys())
def test_the_store_runs_in_protected_mode_and_starts_through_start_sh(values: Obj) -> None:
    objects = render(values)
    lines = config(objects)
    assert "protected-mode yes" in lines and "protected-mode no" not in lines
    valkey = container(one(objects, "StatefulSet", "keyshift-valkey"))
    assert valkey["command"] == ["sh", "/etc/valkey/start.sh"] and "args" not in valkey
    start = scripts(objects)["start.sh"]
    assert "exec valkey-server /etc/valkey/valkey.conf --include /tmp/auth.conf" in start
    assert "umask 077" in start and "/run/secrets/valkey/password" in start


@pytest.mark.parametrize("values", [TLS, TLS_CLUSTER], ids=["standalone", "cluster"])
def test_tls_serves_on_the_store_port_with_the_charts_certificate(values: Obj) -> None:
    cluster = values is TLS_CLUSTER
    objects = render({**values, "operator": {"namespaces": ["team-a"]}})
    for obj in objects:
        for version in VERSIONS:
            assert problems(obj, version) == []
    lines = config(objects)
    assert {"port 0", "tls-port 6379", "tls-auth-clients no",
            "tls-cert-file /run/valkey/tls/tls.crt", "tls-key-file /run/valkey/tls/tls.key",
            "tls-ca-cert-file /run/valkey/tls/ca.crt"} <= set(lines)  # fmt: skip
    assert ({"tls-cluster yes", "tls-replication yes"} <= set(lines)) == cluster
    assert "port 6379" not in lines

    tls = one(objects, "Secret", "keyshift-valkey-tls")
    assert tls["type"] == "kubernetes.io/tls" and set(tls["data"]) == {
        "tls.crt", "tls.key", "ca.crt",
    }  # fmt: skip
    assert tls["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # the workers' and the operator's trust: the CA in the Secret StreamJobs name, in
    # each namespace it is made in
    stores = find(objects, "Secret", "keyshift-store")
    assert sorted(s["metadata"]["namespace"] for s in stores) == [NAMESPACE, "team-a"]
    assert {s["data"]["ca.crt"] for s in stores} == {tls["data"]["ca.crt"]}

    sts = one(objects, "StatefulSet", "keyshift-valkey")
    assert volumes(sts)["tls"]["secret"]["secretName"] == "keyshift-valkey-tls"
    assert {i["key"] for i in volumes(sts)["tls"]["secret"]["items"]} == {
        "tls.crt", "tls.key", "ca.crt",
    }  # fmt: skip
    assert {"name": "tls", "mountPath": "/run/valkey/tls", "readOnly": True} in container(sts)[
        "volumeMounts"
    ]
    assert "valkey-cli --tls --cacert /run/valkey/tls/ca.crt" in scripts(objects)["cli.sh"]
    if cluster:  # the cluster-init Job verifies the servers with the CA alone
        job = one(objects, "Job")
        assert volumes(job)["tls"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]

    spec = StreamJobSpec.model_validate(notes_streamjob(values)["spec"])
    url = spec.state_store.url
    assert url is not None
    if cluster:
        assert url.startswith("rediss+cluster://keyshift-valkey-0.keyshift-valkey-headless.")
    else:
        assert url == f"rediss://keyshift-valkey.{NAMESPACE}.svc:6379"
    assert spec.state_store.secret_ref == "keyshift-store"


def test_tls_with_your_certificate_secret_makes_none() -> None:
    values = {"stateStore": {"managed": {"tls": {"enabled": True, "existingSecret": "valkey-tls"}}}}
    objects = render(values)
    assert not find(objects, "Secret", "keyshift-valkey-tls")
    sts = one(objects, "StatefulSet", "keyshift-valkey")
    assert volumes(sts)["tls"]["secret"]["secretName"] == "valkey-tls"
    # `helm template` cannot read your Secret: its CA is not copied (docs/install.md)
    assert "ca.crt" not in one(objects, "Secret", "keyshift-store")["data"]


def test_without_tls_there_is_no_certificate_and_no_ca() -> None:
    objects = render()
    assert not find(objects, "Secret", "keyshift-valkey-tls")
    assert set(one(objects, "Secret", "keyshift-store")["data"]) == {"password"}
    assert "tls" not in volumes(one(objects, "StatefulSet"))
    assert "--tls" not in scripts(objects)["cli.sh"]


# ---------------------------------------------------------------- the NetworkPolicy


def selects(selector: Obj, labels: dict[str, str], namespace: str) -> bool:
    """Whether a NetworkPolicyPeer's selectors admit a pod with ``labels`` in ``namespace``
    (a policy in the release's namespace)."""

    def matches(sel: Obj, have: dict[str, str]) -> bool:
        if any(have.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
            return False
        for e in sel.get("matchExpressions") or []:
            assert e["operator"] == "In"
            if have.get(e["key"]) not in e["values"]:
                return False
        return True

    if "namespaceSelector" in selector:
        ns_ok = matches(selector["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
    else:
        ns_ok = namespace == NAMESPACE
    return ns_ok and matches(selector.get("podSelector", {}), labels)


def admitted(policy: Obj, labels: dict[str, str], namespace: str = NAMESPACE) -> set[int]:
    ports: set[int] = set()
    for rule in policy["spec"]["ingress"]:
        if any(selects(peer, labels, namespace) for peer in rule["from"]):
            ports |= {p["port"] for p in rule["ports"]}
    return ports


def pod_labels(obj: Obj) -> dict[str, str]:
    labels: dict[str, str] = obj["spec"]["template"]["metadata"]["labels"]
    return labels


def worker_labels(namespace: str) -> dict[str, str]:
    """The labels of a StreamJob's worker pods, as the operator makes them."""
    body = {
        "apiVersion": API_VERSION, "kind": "StreamJob",
        "metadata": {"name": "counter", "namespace": namespace, "uid": "u"},
        "spec": {"job": "examples.counter:job", "podLabels": {"team": "a"},
                 "stateStore": {"url": "redis://keyshift-valkey.streams.svc:6379",
                                "secretRef": "keyshift-store"}},
    }  # fmt: skip
    return pod_labels(worker_statefulset(body, StreamJobSpec.model_validate(body["spec"]), 1))


@pytest.mark.parametrize("mode", ["standalone", "cluster"])
def test_the_network_policy_admits_workers_operator_servers_and_init_job_only(mode: str) -> None:
    values = {"stateStore": {"managed": {"mode": mode}}, "operator": {"namespaces": ["team-a"]}}
    objects = render(values)
    policy = one(objects, "NetworkPolicy", "keyshift-valkey")
    for version in VERSIONS:
        assert problems(policy, version) == []
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    sts = one(objects, "StatefulSet", "keyshift-valkey")
    assert policy["spec"]["podSelector"] == {"matchLabels": sts["spec"]["selector"]["matchLabels"]}

    bus = {16379} if mode == "cluster" else set()
    assert admitted(policy, pod_labels(sts)) == {6379} | bus
    assert admitted(policy, pod_labels(one(objects, "Deployment"))) == {6379}
    assert admitted(policy, worker_labels("team-a"), "team-a") == {6379}
    if mode == "cluster":
        assert admitted(policy, pod_labels(one(objects, "Job"))) == {6379}
    # workers of a namespace the operator does not watch; anything else
    assert admitted(policy, worker_labels("elsewhere"), "elsewhere") == set()
    assert admitted(policy, {"app": "curious"}) == set()
    assert admitted(policy, {"app.kubernetes.io/name": "keyshift-valkey"}, "team-a") == set()


def test_the_network_policy_follows_the_operators_scope() -> None:
    default = one(render(), "NetworkPolicy")
    assert admitted(default, worker_labels(NAMESPACE)) == {6379}
    assert admitted(default, worker_labels("team-a"), "team-a") == set()
    cluster_wide = one(render({"operator": {"scope": "cluster"}}), "NetworkPolicy")
    assert admitted(cluster_wide, worker_labels("any-team"), "any-team") == {6379}


def test_the_network_policy_takes_extra_peers_and_can_be_off() -> None:
    extra = {"podSelector": {"matchLabels": {"app": "keyshift-admin"}}}
    values = {"stateStore": {"managed": {"networkPolicy": {"enabled": True, "extraFrom": [extra]}}}}
    policy = one(render(values), "NetworkPolicy")
    assert admitted(policy, {"app": "keyshift-admin"}) == {6379}
    for version in VERSIONS:
        assert problems(policy, version) == []
    assert not find(render({"stateStore": {"managed": {"networkPolicy": {"enabled": False}}}}),
                    "NetworkPolicy")  # fmt: skip
    assert not find(render(EXTERNAL), "NetworkPolicy")
