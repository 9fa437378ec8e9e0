"""The few Kubernetes API calls the operator makes, as plain dicts, off the event loop.

A thin layer over the official ``kubernetes`` client: each call runs in a
thread (the client is synchronous) and returns the object as the API server
sent it (camelCase dicts), so the pure modules never see client models.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import kubernetes
from kubernetes.client.exceptions import ApiException

from keyshift.api.names import GROUP, PLURAL, VERSION
from keyshift.errors import KeyshiftError

Obj = dict[str, Any]
T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"


SECRET_LABEL: Final = f"{GROUP}/streamjob-secret"
"""The label (value ``"true"``) by which a Secret opts in to being read or mounted for
StreamJobs; the operator refuses every other Secret a StreamJob names."""


class KubeError(KeyshiftError):
    """An error of the Kubernetes side.  The ``kubernetes`` client's own exceptions are
    translated into this tree here, at the client's boundary, and never pass it."""


class KubeUnavailable(KubeError):
    """No Kubernetes API to talk to: no credentials, or the API server does not answer."""


class ApiError(KubeError):
    """The API server refused a request: ``status`` is its HTTP status, ``reason`` its
    reason (``NotFound``, ``Conflict``, ``Forbidden``, ...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"Kubernetes API: {status} {reason}: {message}")


class NotFound(ApiError):
    """404: the object does not exist."""


class Conflict(ApiError):
    """409: the object exists already, or changed meanwhile."""


class SecretKeyMissing(KubeError):
    """A Secret the StreamJob names (and that opts in) lacks the key it must hold."""


def api_error(exc: ApiException) -> ApiError:
    """The client's :class:`ApiException` as an :class:`ApiError` of its status."""
    status = int(exc.status or 0)
    message = _api_message(exc)
    kind = {404: NotFound, 409: Conflict}.get(status, ApiError)
    return kind(status, str(exc.reason or ""), message)


def _api_message(exc: ApiException) -> str:
    """The ``message`` of the API server's Status body, else the body itself (cut short)."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str) and body:
        try:
            parsed = json.loads(body)
        except ValueError:
            return body[:300]
        if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
            return str(parsed["message"])
        return body[:300]
    return ""


@dataclass(frozen=True)
class RefusedSecret:
    """A Secret a StreamJob names that the operator will not use, and where it is named."""

    name: str
    use: str
    """Where the spec names it, e.g. ``stateStore.secretRef``."""
    missing: bool = False
    """True: it does not exist (else: it lacks the label)."""


class SecretNotAllowed(KubeError):
    """Secrets a StreamJob names but that do not opt in with :data:`SECRET_LABEL` (or do
    not exist): the operator neither reads them nor mounts them into the workers, since
    whoever may create a StreamJob would otherwise have any Secret of the namespace sent
    to a host (``stateStore.url``, ``autoscaler.prometheus.url``) or a pod of their own."""

    reason: Final = "SecretNotAllowed"

    def __init__(self, namespace: str, refused: Sequence[RefusedSecret]) -> None:
        self.namespace = namespace
        self.refused = tuple(refused)
        super().__init__(secret_refusal(namespace, self.refused))


def secret_refusal(namespace: str, refused: Sequence[RefusedSecret]) -> str:
    """Which Secrets are refused, why, and the command that lets the job go on."""
    what = "; ".join(
        f"Secret {namespace}/{r.name} ({r.use}) "
        + ("does not exist" if r.missing else f'is not labelled {SECRET_LABEL}="true"')
        for r in refused
    )
    unlabelled = sorted({r.name for r in refused if not r.missing})
    missing = sorted({r.name for r in refused if r.missing})
    todo = []
    if unlabelled:
        todo.append(
            f"kubectl -n {namespace} label secret {' '.join(unlabelled)} {SECRET_LABEL}=true"
        )
    if missing:
        todo.append(f"create {', '.join(missing)} with that label")
    return (
        f"{what}. The operator reads, and mounts into workers, only Secrets labelled "
        f"{SECRET_LABEL}=true, so that creating a StreamJob cannot send other Secrets of the "
        f"namespace to a host or pod of one's choosing; nothing of the job is created or "
        f"changed until then. If they are meant for StreamJobs: {' and '.join(todo)} "
        f"(the job goes on by itself within seconds)"
    )


def secret_allowed(secret: Obj) -> bool:
    """Whether a Secret (as the API server sends it) opts in to StreamJobs."""
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return labels.get(SECRET_LABEL) == "true"


def load_credentials() -> None:
    """In-cluster credentials when running in a pod, else the kubeconfig (``KUBECONFIG``);
    :class:`KubeUnavailable` when there are neither."""
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        try:
            kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise KubeUnavailable(
                "no Kubernetes credentials: not in a pod, and no usable kubeconfig "
                f"({exc}); set KUBECONFIG or run `kubectl config use-context`"
            ) from None


def check_reachable(timeout: float = 5.0) -> None:
    """Ask the API server for its version; :class:`KubeUnavailable` if it does not answer."""
    client = kubernetes.client.ApiClient()
    host = client.configuration.host
    try:
        kubernetes.client.VersionApi(client).get_code(_request_timeout=timeout)
    except Exception as exc:  # urllib3 and client errors alike: all mean "not reachable"
        raise KubeUnavailable(
            f"the Kubernetes API at {host} does not answer: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"
        ) from None
    finally:
        client.close()  # type: ignore[no-untyped-call]


class KubeApi:
    def __init__(self, api_client: kubernetes.client.ApiClient | None = None) -> None:
        self.client = api_client or kubernetes.client.ApiClient()
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.apps = kubernetes.client.AppsV1Api(self.client)
        self.policy = kubernetes.client.PolicyV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        """Call the client in a thread; its :class:`ApiException` becomes an :class:`ApiError`."""
        try:
            result = await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            raise api_error(exc) from None
        out: Obj = self.client.sanitize_for_serialization(result)  # type: ignore[no-untyped-call]
        return out

    # -- owned objects: create, read, patch -------------------------------------

    def _ops(self, kind: str) -> tuple[Callable[..., Any], ...]:
        """(create, read, patch) of a kind the operator owns."""
        table: dict[str, tuple[Callable[..., Any], ...]] = {
            "ConfigMap": (
                self.core.create_namespaced_config_map,
                self.core.read_namespaced_config_map,
                self.core.patch_namespaced_config_map,
            ),
            "Service": (
                self.core.create_namespaced_service,
                self.core.read_namespaced_service,
                self.core.patch_namespaced_service,
            ),
            "StatefulSet": (
                self.apps.create_namespaced_stateful_set,
                self.apps.read_namespaced_stateful_set,
                self.apps.patch_namespaced_stateful_set,
            ),
            "PodDisruptionBudget": (
                self.policy.create_namespaced_pod_disruption_budget,
                self.policy.read_namespaced_pod_disruption_budget,
                self.policy.patch_namespaced_pod_disruption_budget,
            ),
        }
        return table[kind]

    async def read(self, kind: str, namespace: str, name: str) -> Obj | None:
        _, read, _ = self._ops(kind)
        try:
            return await self._call(read, name, namespace)
        except NotFound:
            return None

    async def create(self, obj: Obj) -> Obj:
        create, _, _ = self._ops(obj["kind"])
        return await self._call(create, obj["metadata"]["namespace"], obj)

    async def patch(self, kind: str, namespace: str, name: str, patch: Obj) -> Obj:
        _, _, do_patch = self._ops(kind)
        return await self._call(do_patch, name, namespace, patch, _content_type=MERGE_PATCH)

    # -- pods and statefulsets ------------------------------------------------------

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        found = await self._call(self.core.list_namespaced_pod, namespace, label_selector=selector)
        items: list[Obj] = found.get("items") or []
        return items

    async def scale_statefulset(self, namespace: str, name: str, replicas: int) -> None:
        await self._call(
            self.apps.patch_namespaced_stateful_set, name, namespace,
            {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH,
        )  # fmt: skip

    async def read_allowed_secret(self, namespace: str, name: str, use: str) -> Obj:
        """The Secret, if it carries :data:`SECRET_LABEL`; else :class:`SecretNotAllowed`
        (also when it does not exist). ``use``: where the StreamJob names it."""
        try:
            secret = await self._call(self.core.read_namespaced_secret, name, namespace)
        except NotFound:
            missing = RefusedSecret(name, use, missing=True)
            raise SecretNotAllowed(namespace, [missing]) from None
        if not secret_allowed(secret):
            raise SecretNotAllowed(namespace, [RefusedSecret(name, use)])
        return secret

    async def read_secret_key(self, namespace: str, name: str, key: str, use: str) -> str:
        """A key of a Secret that opts in (:meth:`read_allowed_secret`);
        :class:`SecretKeyMissing` if absent."""
        secret = await self.read_allowed_secret(namespace, name, use)
        data = (secret.get("data") or {}).get(key)
        if data is None:
            raise SecretKeyMissing(f"Secret {namespace}/{name} ({use}) has no key {key!r}")
        return base64.b64decode(data).decode()

    # -- the StreamJob ------------------------------------------------------------------

    async def read_job(self, namespace: str, name: str) -> Obj | None:
        try:
            return await self._call(
                self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
            )
        except NotFound:
            return None

    async def patch_job_status(self, namespace: str, name: str, status: Obj) -> Obj:
        return await self._call(
            self.custom.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, PLURAL, name, {"status": status},
            _content_type=MERGE_PATCH,
        )  # fmt: skip

    async def close(self) -> None:
        await asyncio.to_thread(self.client.close)
