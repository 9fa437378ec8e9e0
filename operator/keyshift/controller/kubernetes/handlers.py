"""The kopf handlers of the operator: a thin layer over :mod:`keyshift.controller.kubernetes.job`.

- create / update / resume: validate the spec (an invalid one is reported in
  ``status.conditions`` and nothing is deployed) and apply the owned objects (not
  while a Secret the spec names lacks the opt-in label: the daemon reports that, and
  applies them once it is labelled);
- a daemon per StreamJob: the controller loop (rescales, failover, status,
  drift correction), stopped by kopf when the job is deleted or the operator
  exits or loses leadership;
- delete: stop the workers gracefully (they commit), and delete the job's
  state from the store only if the annotation ``keyshift.dev/delete-state:
  "true"`` asks for it; otherwise the state stays for a later job of the
  same name to resume from.

``keyshift operator`` runs these through :func:`run_operator`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Collection
from typing import Any

import kopf

from keyshift.api.names import GROUP, PLURAL, VERSION
from keyshift.api.spec import InvalidSpec
from keyshift.controller.kubernetes.api import KubeApi, SecretNotAllowed, load_credentials
from keyshift.controller.kubernetes.job import (
    JobRunner,
    apply_owned_objects,
    check_spec,
    delete_job_state,
    stop_job,
)
from keyshift.controller.kubernetes.objects import (
    APP_LABEL,
    DELETE_STATE_ANNOTATION,
    JOB_LABEL,
    WORKER_APP,
)

log = logging.getLogger("keyshift.operator")
RESOURCE = (GROUP, VERSION, PLURAL)


def _api(memo: Any) -> KubeApi:
    api: KubeApi = memo.api
    return api


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.peering.lifetime = int(memo.get("peering_lifetime", 60))
    settings.peering.mandatory = bool(memo.get("peering_mandatory", False))
    # With exact namespace names (or all namespaces) kopf needs no cluster-wide scanning of
    # namespaces and CRDs, which the chart's RBAC does not grant (refused, kopf retries the
    # namespace list for about a minute before it falls back to the names it was given).
    settings.scanning.disabled = not memo.get("namespace_patterns", False)
    await asyncio.to_thread(load_credentials)
    memo.api = KubeApi()


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    if "api" in memo:
        await _api(memo).close()


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
async def apply(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    raw = dict(body)
    try:
        spec = check_spec(raw.get("spec") or {})
    except InvalidSpec:
        return  # the daemon reports it in status; fixing the spec calls this again
    try:
        changes = await apply_owned_objects(_api(memo), raw, spec)
    except SecretNotAllowed:
        return  # the daemon says why in status and an Event, and applies them once labelled
    for change in changes:
        kopf.info(body, reason="Reconciled", message=change)


WORKERS = {APP_LABEL: WORKER_APP}


def _by_job(namespace: str | None, labels: kopf.Labels, body: kopf.Body) -> Any:
    """An index entry: a copy of the object under ``(namespace, job)``."""
    return {(namespace, labels.get(JOB_LABEL)): copy.deepcopy(dict(body))}


@kopf.index("pods", labels=WORKERS)
def worker_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    """The workers' pods by ``(namespace, job)``: a watch cache, so ticks cost no requests."""
    return _by_job(namespace, labels, body)


@kopf.index("apps", "v1", "statefulsets", labels=WORKERS)
def worker_statefulsets(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> Any:
    return _by_job(namespace, labels, body)


class IndexedPodView:
    """A job's StatefulSet and pods as kopf's indexes hold them."""

    def __init__(self, pods: kopf.Index[Any, Any], sets: kopf.Index[Any, Any], key: Any) -> None:
        self._pods = pods
        self._sets = sets
        self._key = key

    async def statefulset(self) -> dict[str, Any] | None:
        found = list(self._sets.get(self._key, []))
        return found[-1] if found else None

    async def pods(self) -> list[dict[str, Any]]:
        return list(self._pods.get(self._key, []))


@kopf.daemon(*RESOURCE, cancellation_timeout=30.0)
async def run_job(
    body: kopf.Body, name: str, namespace: str | None, memo: Any, stopped: kopf.DaemonStopped,
    **indexes: Any,
) -> None:  # fmt: skip
    """The job's controller loop; ``indexes`` holds ``worker_pods`` and ``worker_statefulsets``."""

    def post(kind: str, reason: str, message: str) -> None:
        kopf.event(body, type=kind, reason=reason, message=message)

    view = IndexedPodView(indexes["worker_pods"], indexes["worker_statefulsets"], (namespace, name))
    runner = JobRunner(_api(memo), body, post, view)  # type: ignore[arg-type]  # a live view
    await runner.run(stopped)


@kopf.on.delete(*RESOURCE)
async def delete(
    body: kopf.Body, name: str, namespace: str | None, annotations: kopf.Annotations,
    memo: Any, **_: Any,
) -> None:  # fmt: skip
    namespace = namespace or "default"
    api = _api(memo)
    await stop_job(api, namespace, name)
    if annotations.get(DELETE_STATE_ANNOTATION, "").lower() == "true":
        try:
            deleted = await delete_job_state(api, namespace, name, dict(body.get("spec") or {}))
        except SecretNotAllowed as exc:  # the store's password is needed to delete the state
            raise kopf.TemporaryError(str(exc), delay=10) from None
        log.info("%s/%s: deleted %d state keys from the store", namespace, name, deleted)


def run_operator(
    *,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    standalone: bool = False,
    peering: str | None = None,
    priority: int = 0,
    liveness: str | None = None,
    peering_lifetime: int = 60,
) -> None:
    """Run the operator until it is stopped (SIGTERM/SIGINT): what ``keyshift operator`` does."""
    kopf.configure(verbose=False, log_prefix=True)
    kopf.run(
        clusterwide=clusterwide,
        namespaces=list(namespaces),
        standalone=standalone,
        peering_name=peering,
        priority=priority,
        liveness_endpoint=liveness,
        # with peering asked for by name, its object must exist: no silent fallback to
        # standalone (which would make two replicas both active)
        memo=kopf.Memo(
            peering_lifetime=peering_lifetime,
            peering_mandatory=peering is not None,
            namespace_patterns=any(_is_pattern(ns) for ns in namespaces),
        ),
    )


def _is_pattern(namespace: str) -> bool:
    """Whether a ``--namespace`` is a glob or a negation (kopf then watches the namespaces)."""
    return namespace.startswith("!") or any(c in namespace for c in "*?[")
