"""One StreamJob's controller inside the operator (run by a kopf daemon per job).

Every tick it validates the live spec, runs the shared
:class:`~keyshift.controller.core.loop.Controller` (assignment, rescales,
failover) over a :class:`KubernetesWorkerPool`, and every second writes
``status``; every ``drift_seconds`` it restores owned objects someone edited.
The executor's record lives in ``status.controller``, so a restarted operator
(or the next leader) resumes a rescale where the last one stopped.

Secrets: the operator reads and mounts only the Secrets that opt in with the label
``keyshift.dev/streamjob-secret: "true"`` (:class:`SecretNotAllowed` otherwise). While a
Secret the spec names is refused nothing of the job is created or changed (a job that
already runs keeps running as it was), the StreamJob says why (``Ready=False``, reason
``SecretNotAllowed``, and an Event), and the check is repeated every
``secret_retry_seconds`` (both in :class:`ControllerSettings`): labelling the Secret
lets the job go on by itself.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from keyshift.api.spec import InvalidSpec, StreamJobSpec, validate_spec
from keyshift.controller.autoscaling.decision import Decision
from keyshift.controller.autoscaling.metrics.base import FailedKeyGroup, MetricsProvider
from keyshift.controller.autoscaling.runner import event_kind, history_from
from keyshift.controller.core import metrics as metrics
from keyshift.controller.core.loop import Controller, ControllerSettings
from keyshift.controller.core.reconcile import Desired
from keyshift.controller.core.records import ControllerRecord
from keyshift.controller.core.status import finished as input_finished
from keyshift.controller.kubernetes.api import (
    SECRET_LABEL,
    Conflict,
    KubeApi,
    Obj,
    RefusedSecret,
    SecretKeyMissing,
    SecretNotAllowed,
)
from keyshift.controller.kubernetes.objects import drift, label_selector, owned_objects, secret_refs
from keyshift.controller.kubernetes.pool import KubernetesWorkerPool, PodView
from keyshift.controller.kubernetes.status import (
    invalid_status,
    job_status,
    record_from_status,
    record_to_status,
    refused_status,
)
from keyshift.controller.supervisor import (
    ManualRequest,
    Supervisor,
    idle_probe,
    metrics_provider,
)
from keyshift.errors import KeyshiftError
from keyshift.runtime.kafka.client import ENV_PREFIX as KAFKA_ENV_PREFIX
from keyshift.store import StateStore, StoreError, open_store

log = logging.getLogger("keyshift.operator")

EventPoster = Callable[[str, str, str], None]
"""``(type, reason, message)``: posts a Kubernetes Event on the StreamJob."""


def kubernetes_problem(spec: StreamJobSpec) -> str | None:
    """What a spec that ``keyshift run`` accepts still lacks on Kubernetes (reported in
    ``status`` like any invalid spec, before anything is deployed)."""
    if not spec.state_store.url:
        return (
            "spec.stateStore.url: required on Kubernetes (keyshift run starts a store of its "
            "own; on a cluster the workers need the URL of the store, e.g. the Helm chart's)"
        )
    if spec.autoscaler.enabled and not spec.autoscaler.prometheus.url:
        return (
            "spec.autoscaler.prometheus.url: required on Kubernetes when the autoscaler is "
            "enabled (the load metrics come from Prometheus)"
        )
    return None


def check_spec(raw: Mapping[str, Any]) -> StreamJobSpec:
    """The parsed spec; :class:`InvalidSpec` saying why it cannot run on Kubernetes."""
    checked = validate_spec(raw)
    problem = kubernetes_problem(checked)
    if problem is not None:
        raise InvalidSpec(problem)
    return checked


def event_reason(message: str) -> str:
    return "Failover" if "(failover)" in message else "Rescale"


class StatusRecordStore:
    """The executor's record in ``status.controller``; saved before each step goes on."""

    def __init__(self, api: KubeApi, namespace: str, name: str, record: ControllerRecord) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.record = record

    def load(self) -> ControllerRecord:
        return self.record

    async def save(self, record: ControllerRecord) -> None:
        self.record = record
        await self.api.patch_job_status(
            self.namespace, self.name, {"controller": record_to_status(record)}
        )


async def check_secrets(api: KubeApi, namespace: str, spec: StreamJobSpec) -> None:
    """:class:`SecretNotAllowed` naming every Secret of the spec (:func:`secret_refs`) that
    does not opt in with the label, or does not exist."""
    refused: list[RefusedSecret] = []
    for name, uses in secret_refs(spec).items():
        try:
            await api.read_allowed_secret(namespace, name, ", ".join(uses))
        except SecretNotAllowed as exc:
            refused.extend(exc.refused)
    if refused:
        raise SecretNotAllowed(namespace, refused)


async def apply_owned_objects(api: KubeApi, body: Obj, spec: StreamJobSpec) -> list[str]:
    """Create what is missing and restore what drifted; the names of what changed.
    Nothing at all while a Secret the spec names is refused (:func:`check_secrets`)."""
    namespace = body["metadata"].get("namespace", "default")
    await check_secrets(api, namespace, spec)
    changed = []
    for desired in owned_objects(body, spec, replicas=0):
        kind, name = desired["kind"], desired["metadata"]["name"]
        actual = await api.read(kind, namespace, name)
        if actual is None:
            try:
                await api.create(desired)
                changed.append(f"created {kind} {name}")
                continue
            except Conflict:  # created meanwhile (the daemon and a handler race)
                actual = await api.read(kind, namespace, name)
                if actual is None:
                    raise
        patch = drift(desired, actual)
        if patch is not None:
            await api.patch(kind, namespace, name, patch)
            changed.append(f"restored {kind} {name} ({', '.join(sorted(patch))})")
    return changed


async def open_job_store(api: KubeApi, namespace: str, spec: StreamJobSpec) -> StateStore:
    url = spec.state_store.url
    if not url:
        raise InvalidSpec("spec.stateStore.url is required on Kubernetes")
    password = ca_data = None
    if spec.state_store.secret_ref:
        secret = spec.state_store.secret_ref
        password = await api.read_secret_key(namespace, secret, "password", "stateStore.secretRef")
        # the CA of a TLS store with its own (the chart's managed Valkey), if any
        with contextlib.suppress(SecretKeyMissing):
            ca_data = await api.read_secret_key(namespace, secret, "ca.crt", "stateStore.secretRef")
    return open_store(url, password=password, ca_data=ca_data)


async def kafka_credentials(api: KubeApi, namespace: str, spec: StreamJobSpec) -> dict[str, str]:
    """The ``KEYSHIFT_KAFKA_*`` variables of the workers' ``spec.env``, their Secrets read
    (the operator reads the job's Kafka topic itself while the job is scaled to zero)."""
    out: dict[str, str] = {}
    for var in spec.env:
        if not var.name.startswith(KAFKA_ENV_PREFIX):
            continue
        ref = (var.value_from or {}).get("secretKeyRef")
        if var.value is not None:
            out[var.name] = var.value
        elif ref:
            out[var.name] = await api.read_secret_key(
                namespace, ref["name"], ref["key"], f"env {var.name}"
            )
    return out


class JobRunner:
    def __init__(
        self,
        api: KubeApi,
        body: Obj,
        post_event: EventPoster,
        view: PodView | None = None,
        settings: ControllerSettings | None = None,
    ) -> None:
        self.api = api
        self.settings = settings or ControllerSettings()
        self.body = body
        """The live body: kopf keeps it up to date while the daemon runs."""
        self.post_event = post_event
        meta = body["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace", "default")
        self.pool = KubernetesWorkerPool(api, self.namespace, self.name, view)
        self.store: StateStore | None = None
        self.supervisor: Supervisor | None = None
        self.key_groups = 0
        self.invalid: str | None = None
        self.spec: StreamJobSpec | None = None
        """The last valid spec: what the job runs by while a newer one is invalid."""
        self.error: str | None = None
        self.refused: str | None = None
        """Why Secrets the spec names are refused (:class:`SecretNotAllowed`), until they
        are labelled."""
        self._last_status: Obj | None = None
        self._failed_reported: set[tuple[int, str]] = set()
        self._last_status_at = 0.0
        self._last_drift_at = 0.0
        self._history_seen = 0
        self._provider: MetricsProvider | None = None
        """The autoscaler's metrics provider, kept once made (its Secret was read)."""

    # -- the loop ---------------------------------------------------------------------

    async def run(self, stopped: Any) -> None:
        try:
            while not stopped:
                try:
                    await self.tick()
                    self.error = None
                except (KeyshiftError, OSError) as exc:  # a bug is not caught here
                    self._fail(f"{type(exc).__name__}: {exc}")
                controller = self.controller
                await stopped.wait(
                    self.settings.tick_seconds if controller is None else controller.pause_seconds()
                )
        finally:
            if self.store is not None:
                await self.store.close()
            if self._provider is not None:
                await self._provider.close()

    def _fail(self, message: str) -> None:
        metrics.RECONCILE_ERRORS.labels(streamjob=self.name, namespace=self.namespace).inc()
        if message != self.error:
            log.warning("%s/%s: %s", self.namespace, self.name, message)
            self.post_event("Warning", "ReconcileError", message)
        self.error = message

    async def tick(self) -> None:
        try:
            checked = check_spec(self.body.get("spec") or {})
        except InvalidSpec as invalid:
            await self._report_invalid(str(invalid))
            if self.spec is None:
                return  # never deployed: nothing runs
            # A job that runs keeps running as its last valid spec says: failover and
            # handoffs must not stop because of a typo; the status says what is wrong.
            spec = self.spec
        else:
            self.invalid = None
            spec = self.spec = checked
        now = time.time()
        settings = self.settings
        every = settings.drift_seconds if self.refused is None else settings.secret_retry_seconds
        if self.invalid is None and now - self._last_drift_at >= every:
            self._last_drift_at = now
            try:
                changes = await apply_owned_objects(self.api, dict(self.body), spec)
            except SecretNotAllowed as exc:
                await self._report_refused(exc)
            else:
                self._secrets_allowed()
                for change in changes:
                    self.post_event("Normal", "Reconciled", change)
        if self.refused is not None and self.controller is None:
            return  # nothing runs until the Secrets are labelled (checked again above)
        try:
            supervisor = await self._supervisor(spec)
        except SecretNotAllowed as exc:  # e.g. the label was removed since the check
            await self._report_refused(exc)
            return
        outage = await supervisor.tick_through_outage()
        if outage is not None:
            raise outage  # reported by run(), as the job's reconcile error
        self._count_finished(supervisor.controller.executor.record)
        if now - self._last_status_at >= self.settings.status_seconds:
            self._last_status_at = now
            await self.write_status(supervisor)

    @property
    def controller(self) -> Controller | None:
        return None if self.supervisor is None else self.supervisor.controller

    async def _supervisor(self, spec: StreamJobSpec) -> Supervisor:
        if self.supervisor is not None:
            if spec.key_groups != self.key_groups:
                raise InvalidSpec("keyGroups cannot change for a running job")
            return self.supervisor
        scaler = spec.autoscaler
        if scaler.enabled and self._provider is None:
            self._provider = await self._metrics_provider(spec)
        if self.store is None:
            self.store = await open_job_store(self.api, self.namespace, spec)
        info = await self.store.init_job(self.name, spec.key_groups)
        self.key_groups = info.key_groups
        record = record_from_status(self.body.get("status"), self.name)
        self._history_seen = len(record.history)

        def on_decision(decision: Decision, notable: bool) -> None:
            if notable:
                message = f"({scaler.mode}) {decision.message}"
                self.post_event(event_kind(decision), "ScalingDecision", message)

        self.supervisor = Supervisor(
            self.name, info.key_groups, self.store, self.pool,
            StatusRecordStore(self.api, self.namespace, self.name, record),
            manual=self.manual, autoscaler=scaler, provider=self._provider,
            history=history_from((self.body.get("status") or {}).get("autoscaler")),
            on_decision=on_decision, settings=self.settings.for_spec(spec),
            on_event=lambda kind, message: self.post_event(kind, event_reason(message), message),
            namespace=self.namespace,
            idle_probe=idle_probe(self.store, self.name, spec,
                                  lambda: kafka_credentials(self.api, self.namespace, spec)),
        )  # fmt: skip
        return self.supervisor

    def manual(self) -> ManualRequest:
        """``spec.parallelism`` (``kubectl scale``): a change of it is a new request."""
        manual = 1 if self.spec is None else self.spec.parallelism
        return ManualRequest(Desired(manual, "manual"), manual)

    def desired(self) -> Desired:
        """What the job scales to: the autoscaler's wish, else ``spec.parallelism``."""
        if self.supervisor is None:
            return self.manual().desired
        return self.supervisor.desired()

    async def _metrics_provider(self, spec: StreamJobSpec) -> MetricsProvider:
        """Prometheus, with the credentials of ``prometheus.secretRef`` if it names one."""
        scaler = spec.autoscaler
        if not scaler.prometheus.url:
            raise InvalidSpec("spec.autoscaler.prometheus.url is required on Kubernetes")
        auth: dict[str, str] = {}
        if scaler.prometheus.secret_ref:
            # SecretNotAllowed when it lacks the label: nothing is read from it, and the
            # job waits (with the reason in its status) rather than scale without it
            secret = await self.api.read_allowed_secret(
                self.namespace, scaler.prometheus.secret_ref, "autoscaler.prometheus.secretRef"
            )
            data = secret.get("data") or {}
            auth = {key: base64.b64decode(data[key]).decode()
                    for key in ("token", "username", "password") if data.get(key)}  # fmt: skip
        return metrics_provider(scaler, namespace=self.namespace, credentials=auth)

    def _count_finished(self, record: ControllerRecord) -> None:
        finished = record.history[self._history_seen :] if self._history_seen else record.history
        if len(record.history) < self._history_seen:  # the history was trimmed
            finished = record.history[-1:]
        for r in finished:
            if r.duration_seconds is not None:
                metrics.RESCALE_DURATION.labels(
                    streamjob=self.name, namespace=self.namespace, reason=r.reason,
                    outcome=r.outcome or "unknown",
                ).observe(r.duration_seconds)  # fmt: skip
        self._history_seen = len(record.history)

    # -- status -------------------------------------------------------------------------

    def failed_key_groups(self) -> list[FailedKeyGroup]:
        """Stopped key groups, from the autoscaler's last window (Prometheus): without
        an autoscaler, the operator reads no worker metrics and cannot know."""
        window = None if self.supervisor is None else self.supervisor.last_window
        if window is None:
            return []
        return [f for w in window.per_worker for f in w.failed_key_groups]

    async def write_status(self, supervisor: Supervisor) -> None:
        controller = supervisor.controller
        workers = await self.pool.workers()
        previous = (self.body.get("status") or {}).get("conditions") or []
        window = supervisor.last_window
        status = job_status(
            assignment=controller.assignment,
            workers=workers,
            record=controller.executor.record,
            selector=label_selector(self.name),
            previous_conditions=previous,
            observed_generation=self.body["metadata"].get("generation"),
            error=self.error,
            invalid=self.invalid,
            refused=self.refused,
            at=time.time(),
            failed=self.failed_key_groups(),
            desired=self.desired(),
            lag=None if window is None else window.lag,
            finished=input_finished(window, controller.key_groups),
        )
        failed_now = {(f["key_group"], f["reason"]) for f in status["failedKeyGroups"]}
        if failed_now - self._failed_reported:
            degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
            self.post_event("Warning", "KeyGroupsFailed", degraded["message"])
        self._failed_reported = failed_now
        if supervisor.autoscaler is not None:
            status["autoscaler"] = supervisor.autoscaler.status()
        named = {"streamjob": self.name, "namespace": self.namespace}
        metrics.PARALLELISM.labels(**named).set(status["parallelism"])
        metrics.DESIRED_PARALLELISM.labels(**named).set(self.desired().parallelism)
        current = controller.executor.record.current
        metrics.RESCALE_IN_PROGRESS.labels(**named).set(
            0.0 if current is None or not current.started_at
            else max(0.0, time.time() - current.started_at)
        )  # fmt: skip
        if status != self._last_status:
            await self.api.patch_job_status(self.namespace, self.name, status)
            self._last_status = status

    async def _report_refused(self, exc: SecretNotAllowed) -> None:
        """A Secret the spec names is refused: an Event, and the status says why (for a job
        that runs, :meth:`write_status` does, with the job's state)."""
        message = str(exc)
        if message != self.refused:
            self.refused = message
            log.warning("%s/%s: %s", self.namespace, self.name, message)
            self.post_event("Warning", exc.reason, message)
        if self.controller is not None:
            return
        previous = (self.body.get("status") or {}).get("conditions") or []
        ready: Obj = next((c for c in previous if c.get("type") == "Ready"), {})
        if (ready.get("reason"), ready.get("message")) == (exc.reason, message):
            return  # already says so
        observed = self.body["metadata"].get("generation")
        await self.api.patch_job_status(
            self.namespace, self.name,
            refused_status(exc.reason, message, previous, observed, time.time()),
        )  # fmt: skip
        self._last_status = None

    def _secrets_allowed(self) -> None:
        if self.refused is None:
            return
        self.refused = None
        self._last_status = None
        message = f"the Secrets the spec names are labelled {SECRET_LABEL}=true: the job goes on"
        log.info("%s/%s: %s", self.namespace, self.name, message)
        self.post_event("Normal", "SecretsAllowed", message)

    async def _report_invalid(self, message: str) -> None:
        if message == self.invalid:
            return
        self.invalid = message
        self.post_event("Warning", "InvalidSpec", message)
        if self.spec is not None:
            return  # a running job: write_status reports it with the job's state
        previous = (self.body.get("status") or {}).get("conditions") or []
        observed = self.body["metadata"].get("generation")
        await self.api.patch_job_status(
            self.namespace, self.name, invalid_status(message, previous, observed, time.time())
        )
        self._last_status = None


async def stop_job(api: KubeApi, namespace: str, name: str) -> None:
    """Stop every worker of a job gracefully (they commit before exiting)."""
    pool = KubernetesWorkerPool(api, namespace, name)
    replicas = await pool.replicas()
    if replicas:
        await pool.stop(range(replicas))


async def delete_job_state(api: KubeApi, namespace: str, name: str, raw_spec: Obj) -> int:
    try:
        spec = validate_spec(raw_spec)
    except InvalidSpec as invalid:
        raise InvalidSpec(
            f"cannot delete the state of a job with an invalid spec: {invalid}"
        ) from None
    store = await open_job_store(api, namespace, spec)
    try:
        return await store.delete_job(name)
    finally:
        with contextlib.suppress(StoreError):
            await store.close()
