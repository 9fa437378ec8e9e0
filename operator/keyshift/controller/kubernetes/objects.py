"""The Kubernetes objects a StreamJob owns, as pure functions of the job.

- a ConfigMap ``<job>-config`` with the manifest the workers run (``job.yaml``);
- a headless Service ``<job>-workers`` (stable pod DNS names, metrics scraping);
- a StatefulSet ``<job>-worker`` whose pod ``<job>-worker-<i>`` is worker ``i``
  (``podManagementPolicy: Parallel``, no volumes but the config, a scratch
  ``/tmp`` and the store's Secret; no API token; non-root; read-only root);
- a PodDisruptionBudget allowing one voluntary disruption at a time.

The StatefulSet's ``replicas`` is not part of the desired state: the rescale
executor owns it (through :class:`~keyshift.controller.kubernetes.pool.KubernetesWorkerPool`),
so :func:`drift` never touches it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from decimal import Decimal
from typing import Any, Final

import yaml

from keyshift.api.names import API_VERSION, GROUP, KIND
from keyshift.api.spec import StreamJobSpec

Obj = dict[str, Any]

APP_LABEL: Final = "app.kubernetes.io/name"
JOB_LABEL: Final = f"{GROUP}/job"
WORKER_APP: Final = "keyshift-worker"
POD_INDEX_LABEL: Final = "apps.kubernetes.io/pod-index"
CONFIG_HASH: Final = f"{GROUP}/config-hash"
DELETE_STATE_ANNOTATION: Final = f"{GROUP}/delete-state"
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


def _quantities(resources: Obj) -> Obj:
    """Resource requirements with integer quantities as strings (the API server's form)."""
    return {
        kind: {name: str(q) if isinstance(q, int) else q for name, q in amounts.items()}
        for kind, amounts in resources.items()
        if amounts
    }


def pod_settings(raw: Obj, spec: StreamJobSpec) -> Obj:
    """The user's part of the worker pod, as a Kubernetes pod template: ``spec.podTemplate``
    with the spec's shorthands merged over it (``podLabels``, ``podAnnotations`` and
    ``nodeSelector`` win per key; ``tolerations`` are added; ``env`` follows the
    operator's variables; ``resources`` win per resource name). ``raw`` is the StreamJob's
    spec as written (the shorthands pass through as given). Empty fields are left out:
    the API server drops them, and :func:`drift` would see them missing.

    :func:`worker_statefulset` lays the operator's settings over the result: this is the
    only way the worker pod is built."""
    template = spec.pod_template
    tps = template.spec
    worker = tps.worker
    labels = {**template.metadata.labels, **(raw.get("podLabels") or {})}
    annotations = {**template.metadata.annotations, **(raw.get("podAnnotations") or {})}
    resources: Obj = {}
    shorthand = raw.get("resources") or {}
    for kind in ("requests", "limits"):
        merged = {**getattr(worker.resources, kind), **(shorthand.get(kind) or {})}
        if merged:
            resources[kind] = merged
    container: Obj = {
        "name": "worker",
        "env": copy.deepcopy(raw.get("env") or []),
        "envFrom": [e.model_dump(by_alias=True, exclude_defaults=True) for e in worker.env_from],
        "volumeMounts": [
            m.model_dump(by_alias=True, exclude_defaults=True) for m in worker.volume_mounts
        ],
        "resources": _quantities(resources),
    }
    tolerations = copy.deepcopy(tps.tolerations)
    for toleration in raw.get("tolerations") or []:
        if toleration not in tolerations:
            tolerations.append(copy.deepcopy(toleration))
    pod: Obj = {
        "imagePullSecrets": [{"name": s.name} for s in tps.image_pull_secrets],
        "serviceAccountName": tps.service_account_name,
        "automountServiceAccountToken": tps.automount_service_account_token,
        "affinity": copy.deepcopy(tps.affinity),
        "topologySpreadConstraints": copy.deepcopy(tps.topology_spread_constraints),
        "priorityClassName": tps.priority_class_name,
        "tolerations": tolerations,
        "nodeSelector": {**tps.node_selector, **(raw.get("nodeSelector") or {})},
        "volumes": [v.model_dump(by_alias=True, exclude_defaults=True) for v in tps.volumes],
        "containers": [_given(container)],
    }
    return {
        "metadata": _given({"labels": labels, "annotations": annotations}),
        "spec": _given(pod),
    }


def _given(obj: Obj) -> Obj:
    """``obj`` without its empty and omitted (None) fields."""
    return {k: v for k, v in obj.items() if v is not None and v != {} and v != []}


RESTRICTED_CONTAINER: Final = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": WORKER_UID,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The worker container's security context: the restricted Pod Security Standard, with
a read-only root filesystem; no pod template relaxes it."""
RESTRICTED_POD: Final = {
    "runAsNonRoot": True,
    "runAsUser": WORKER_UID,
    "runAsGroup": WORKER_UID,
    "fsGroup": WORKER_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def worker_container(raw: Obj, spec: StreamJobSpec, user: Obj | None = None) -> Obj:
    """The worker container: the operator's settings over ``user``, the user's settings of
    the container (from :func:`pod_settings`, computed when not given)."""
    if user is None:
        user = pod_settings(raw, spec)["spec"]["containers"][0]
    env: list[Obj] = [
        {
            "name": "KEYSHIFT_WORKER_ORDINAL",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}},
        },
        # the metrics' `namespace` label (the StreamJob's: the pod's)
        {
            "name": "KEYSHIFT_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
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
    container: Obj = {
        "name": "worker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "keyshift.runtime"],
        "args": ["--manifest", f"{CONFIG_DIR}/job.yaml"],
        "env": env + copy.deepcopy(user.get("env", [])),
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
        "volumeMounts": mounts + copy.deepcopy(user.get("volumeMounts", [])),
        "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
    }
    if user.get("envFrom"):
        container["envFrom"] = copy.deepcopy(user["envFrom"])
    if user.get("resources"):
        container["resources"] = copy.deepcopy(user["resources"])
    return container


def worker_statefulset(body: Obj, spec: StreamJobSpec, replicas: int) -> Obj:
    """The workers' StatefulSet: the operator's settings laid over :func:`pod_settings`
    (they win: selector labels, the config hash, the restricted security context, no API
    token unless the template asks for one, the container's command, probes and the
    operator's volumes)."""
    job = body["metadata"]["name"]
    user = pod_settings(body["spec"], spec)
    user_pod = user["spec"]
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
    pod_spec: Obj = {k: copy.deepcopy(v) for k, v in user_pod.items() if k != "containers"}
    spreads = pod_spec.get("topologySpreadConstraints", [])
    for constraint in spreads:
        constraint.setdefault("labelSelector", {"matchLabels": selector_labels(job)})
    pod_spec.update({
        # The workers never call the Kubernetes API: a token would only be a credential
        # for the job's code (and whoever takes it over) to act as the ServiceAccount.
        # A template that needs one (e.g. code that reads ConfigMaps) says so explicitly.
        "automountServiceAccountToken": user_pod.get("automountServiceAccountToken") is True,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": copy.deepcopy(RESTRICTED_POD),
        "containers": [worker_container(body["spec"], spec, user_pod["containers"][0])],
        "volumes": volumes + pod_spec.get("volumes", []),
    })  # fmt: skip
    user_meta = user["metadata"]
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
                    "labels": {**user_meta.get("labels", {}), **selector_labels(job)},
                    "annotations": {
                        **user_meta.get("annotations", {}),
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
    ``env[*].valueFrom.secretKeyRef`` and of the pod template: its ``secret``,
    ``projected`` and ``csi`` volumes and its ``envFrom`` ``secretRef``). Each must opt in
    with the label :data:`~keyshift.controller.kubernetes.api.SECRET_LABEL` before the operator
    uses it. Not the template's ``imagePullSecrets``: the kubelet reads them to pull the
    image, and they never reach the workers."""
    refs: dict[str, list[str]] = {}

    def add(name: Any, where: str) -> None:
        if isinstance(name, str) and name:
            refs.setdefault(name, []).append(where)

    add(spec.state_store.secret_ref, "stateStore.secretRef")
    if spec.autoscaler.enabled:
        add(spec.autoscaler.prometheus.secret_ref, "autoscaler.prometheus.secretRef")
    for i, var in enumerate(spec.env):
        ref = (var.value_from or {}).get("secretKeyRef")
        name = ref.get("name") if isinstance(ref, dict) else None
        add(name, f"env[{i}] {var.name}: valueFrom.secretKeyRef")
    template = spec.pod_template.spec
    for i, volume in enumerate(template.volumes):
        where = f"podTemplate.spec.volumes[{i}] {volume.name}"
        add((volume.secret or {}).get("secretName"), f"{where}: secret")
        sources = (volume.projected or {}).get("sources")
        for j, source in enumerate(sources if isinstance(sources, list) else []):
            found = source.get("secret") if isinstance(source, dict) else None
            name = found.get("name") if isinstance(found, dict) else None
            add(name, f"{where}: projected.sources[{j}].secret")
        csi_ref = (volume.csi or {}).get("nodePublishSecretRef")
        add(csi_ref.get("name") if isinstance(csi_ref, dict) else None,
            f"{where}: csi.nodePublishSecretRef")  # fmt: skip
    for i, source in enumerate(template.worker.env_from):
        if source.secret_ref is not None:
            add(source.secret_ref.name, f"podTemplate.spec.containers[0].envFrom[{i}].secretRef")
    return refs


def owned_objects(body: Obj, spec: StreamJobSpec, replicas: int) -> list[Obj]:
    """Everything the job owns, in creation order (the workers' config first)."""
    return [
        config_map(body),
        headless_service(body),
        disruption_budget(body),
        worker_statefulset(body, spec, replicas),
    ]


_SUFFIXES: Final[dict[str, Decimal]] = {
    **{s: Decimal(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in [("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3),
                                         ("M", 6), ("G", 9), ("T", 12), ("P", 15), ("E", 18)]},
}  # fmt: skip
_QUANTITY: Final = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([KMGTPE]i|[numkMGTPE]?)$")


def _quantity(value: Any) -> Any:
    """A resource quantity as a number (``0.5``, ``500m`` and ``"1"``/``1`` alike: the API
    server stores its canonical form); anything else as it is."""
    match = _QUANTITY.match(str(value)) if isinstance(value, int | str) else None
    if match is None or isinstance(value, bool):
        return value
    try:
        number = Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except ArithmeticError:
        return value
    return str(number.normalize())


def _canonical(obj: Any, key: str = "") -> Any:
    """``obj`` with the quantities of ``resources`` and of ``sizeLimit`` canonical, for
    comparing: a worker container's ``cpu: 0.5`` is ``500m`` once stored."""
    if isinstance(obj, dict):
        if key in ("requests", "limits"):
            return {k: _quantity(v) for k, v in obj.items()}
        return {k: _canonical(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_canonical(v) for v in obj]
    return _quantity(obj) if key == "sizeLimit" else obj


def _subset_differs(desired: Any, actual: Any) -> bool:
    """Whether ``actual`` lacks or changes anything ``desired`` sets (extra fields are fine:
    the API server adds defaults; an empty map or list is fine missing: the API server
    drops them)."""
    if actual is None and (desired == {} or desired == []):
        return False
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
        changed = {
            k: v for k, v in want.items() if _subset_differs(_canonical(v), _canonical(have.get(k)))
        }
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
