"""The Kubernetes objects a StreamJob owns, as pure functions of the job.

- a ConfigMap ``<job>-config`` with the manifest the workers run (``job.yaml``);
- a headless Service ``<job>-workers`` (stable pod DNS names, metrics scraping);
- a StatefulSet ``<job>-worker`` whose pod ``<job>-worker-<i>`` is worker ``i``
  (``podManagementPolicy: Parallel``, no volumes but the config, a scratch
  ``/tmp`` and the store's Secret; no API token; non-root; read-only root);
- a PodDisruptionBudget allowing one voluntary disruption at a time.

The StatefulSet's ``replicas`` is not part of the desired state: the rescale
executor owns it (through :class:`~keyshift.controller.k8s_pool.KubernetesWorkerPool`),
so :func:`drift` never touches it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Final

import yaml

from keyshift.runtime.config import API_VERSION, KIND, StreamJobSpec

Obj = dict[str, Any]

APP_LABEL: Final = "app.kubernetes.io/name"
JOB_LABEL: Final = "keyshift.dev/job"
WORKER_APP: Final = "keyshift-worker"
POD_INDEX_LABEL: Final = "apps.kubernetes.io/pod-index"
CONFIG_HASH: Final = "keyshift.dev/config-hash"
DELETE_STATE_ANNOTATION: Final = "keyshift.dev/delete-state"
"""``"true"`` on a StreamJob: deleting it deletes its state from the store too."""

CONFIG_DIR: Final = "/etc/keyshift"
SECRET_DIR: Final = "/var/run/secrets/keyshift/store"
HTTP_PORT: Final = 8080
WORKER_UID: Final = 10001


def statefulset_name(job: str) -> str:
    return f"{job}-worker"


def service_name(job: str) -> str:
    return f"{job}-workers"


def configmap_name(job: str) -> str:
    return f"{job}-config"


def selector_labels(job: str) -> dict[str, str]:
    return {APP_LABEL: WORKER_APP, JOB_LABEL: job}


def label_selector(job: str) -> str:
    """The pods' label selector as a string (``status.selector``, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(job).items())


def owner_reference(body: Obj) -> Obj:
    meta = body["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(name: str, body: Obj, job: str) -> Obj:
    return {
        "name": name,
        "namespace": body["metadata"].get("namespace", "default"),
        "labels": {**selector_labels(job), "app.kubernetes.io/managed-by": "keyshift"},
        "ownerReferences": [owner_reference(body)],
    }


def worker_manifest(body: Obj) -> str:
    """The manifest the workers load: the StreamJob's name and spec, nothing else."""
    meta = body["metadata"]
    doc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "default")},
        "spec": body["spec"],
    }
    return yaml.safe_dump(doc, sort_keys=True)


def config_map(body: Obj) -> Obj:
    job = body["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(configmap_name(job), body, job),
        "data": {"job.yaml": worker_manifest(body)},
    }


def headless_service(body: Obj) -> Obj:
    job = body["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(job), body, job),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job),
            "ports": [{"name": "metrics", "port": HTTP_PORT, "targetPort": HTTP_PORT}],
        },
    }


def disruption_budget(body: Obj) -> Obj:
    job = body["metadata"]["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(f"{job}-workers", body, job),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(job)}},
    }


def _config_hash(body: Obj) -> str:
    return hashlib.sha256(worker_manifest(body).encode()).hexdigest()[:16]


def worker_container(raw: Obj, spec: StreamJobSpec) -> Obj:
    """The worker container; ``raw`` is the StreamJob's spec as written (pass-through fields)."""
    env: list[Obj] = [
        {
            "name": "KEYSHIFT_WORKER_ORDINAL",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}},
        },
        {"name": "KEYSHIFT_HTTP_HOST", "value": "0.0.0.0"},
        {"name": "KEYSHIFT_HTTP_PORT", "value": str(HTTP_PORT)},
    ]
    mounts: list[Obj] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if spec.state_store.secret_ref:
        env.append({"name": "KEYSHIFT_STORE_PASSWORD_FILE", "value": f"{SECRET_DIR}/password"})
        # the CA of a TLS store with its own (the chart's managed Valkey); the worker
        # ignores the file when the Secret has no `ca.crt`
        env.append({"name": "KEYSHIFT_STORE_CA_FILE", "value": f"{SECRET_DIR}/ca.crt"})
        mounts.append({"name": "store-secret", "mountPath": SECRET_DIR, "readOnly": True})
    env.extend(copy.deepcopy(raw.get("env") or []))
    container: Obj = {
        "name": "worker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "keyshift.runtime"],
        "args": ["--manifest", f"{CONFIG_DIR}/job.yaml"],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": HTTP_PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": HTTP_PORT},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": HTTP_PORT},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": WORKER_UID,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if raw.get("resources"):
        container["resources"] = copy.deepcopy(raw["resources"])
    return container


def worker_statefulset(body: Obj, spec: StreamJobSpec, replicas: int) -> Obj:
    job = body["metadata"]["name"]
    raw = body["spec"]
    volumes: list[Obj] = [
        {"name": "config", "configMap": {"name": configmap_name(job)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    if spec.state_store.secret_ref:
        # the password (the pod waits for it) and, when the Secret has one, the CA
        # (`ca.crt`) of a TLS store: nothing else of the Secret
        name = spec.state_store.secret_ref
        volumes.append({
            "name": "store-secret",
            "projected": {"sources": [
                {"secret": {"name": name, "items": [{"key": "password", "path": "password"}]}},
                {"secret": {"name": name, "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            "optional": True}},
            ]},
        })  # fmt: skip
    pod_spec: Obj = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": WORKER_UID,
            "runAsGroup": WORKER_UID,
            "fsGroup": WORKER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [worker_container(raw, spec)],
        "volumes": volumes,
    }
    if raw.get("nodeSelector"):
        pod_spec["nodeSelector"] = copy.deepcopy(raw["nodeSelector"])
    if raw.get("tolerations"):
        pod_spec["tolerations"] = copy.deepcopy(raw["tolerations"])
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(statefulset_name(job), body, job),
        "spec": {
            "replicas": replicas,
            "serviceName": service_name(job),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": selector_labels(job)},
            "template": {
                "metadata": {
                    "labels": {**(raw.get("podLabels") or {}), **selector_labels(job)},
                    "annotations": {
                        **(raw.get("podAnnotations") or {}),
                        CONFIG_HASH: _config_hash(body),
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def secret_refs(spec: StreamJobSpec) -> dict[str, list[str]]:
    """Every Secret the job's spec names, with where: what the operator reads
    (``stateStore.secretRef``; ``autoscaler.prometheus.secretRef`` when the autoscaler is
    on) and what it mounts into the workers (the store's Secret, the Secrets of
    ``env[*].valueFrom.secretKeyRef``). Each must opt in with the label
    :data:`~keyshift.controller.k8s_api.SECRET_LABEL` before the operator uses it."""
    refs: dict[str, list[str]] = {}
    if spec.state_store.secret_ref:
        refs.setdefault(spec.state_store.secret_ref, []).append("stateStore.secretRef")
    if spec.autoscaler.enabled and spec.autoscaler.prometheus.secret_ref:
        refs.setdefault(spec.autoscaler.prometheus.secret_ref, []).append(
            "autoscaler.prometheus.secretRef"
        )
    for i, var in enumerate(spec.env):
        ref = (var.value_from or {}).get("secretKeyRef")
        name = ref.get("name") if isinstance(ref, dict) else None
        if isinstance(name, str) and name:
            refs.setdefault(name, []).append(f"env[{i}] {var.name}: valueFrom.secretKeyRef")
    return refs


def owned_objects(body: Obj, spec: StreamJobSpec, replicas: int) -> list[Obj]:
    """Everything the job owns, in creation order (the workers' config first)."""
    return [
        config_map(body),
        headless_service(body),
        disruption_budget(body),
        worker_statefulset(body, spec, replicas),
    ]


def _subset_differs(desired: Any, actual: Any) -> bool:
    """Whether ``actual`` lacks or changes anything ``desired`` sets (extra fields are fine:
    the API server adds defaults)."""
    if isinstance(desired, dict):
        if not isinstance(actual, dict):
            return True
        return any(_subset_differs(v, actual.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(desired) != len(actual):
            return True
        return any(_subset_differs(d, a) for d, a in zip(desired, actual, strict=True))
    return json.dumps(desired) != json.dumps(actual)


def drift(desired: Obj, actual: Obj) -> Obj | None:
    """A merge patch that restores ``desired`` over ``actual``, or None if nothing drifted.

    Compares ``spec`` (without a StatefulSet's ``replicas``), ``data``, labels and
    owner references; whole top-level fields are replaced when they differ.
    """
    patch: Obj = {}
    for field in ("spec", "data"):
        want = copy.deepcopy(desired.get(field))
        if want is None:
            continue
        if desired["kind"] == "StatefulSet":
            want.pop("replicas", None)
        have = actual.get(field) or {}
        changed = {k: v for k, v in want.items() if _subset_differs(v, have.get(k))}
        if changed:
            patch[field] = changed
    meta_want = desired["metadata"]
    meta_have = actual.get("metadata", {})
    meta_patch: Obj = {}
    if _subset_differs(meta_want.get("labels", {}), meta_have.get("labels") or {}):
        meta_patch["labels"] = meta_want["labels"]
    if _subset_differs(meta_want["ownerReferences"], meta_have.get("ownerReferences") or []):
        meta_patch["ownerReferences"] = meta_want["ownerReferences"]
    if meta_patch:
        patch["metadata"] = meta_patch
    return patch or None
