"""Workers as the pods of a StatefulSet: the operator's WorkerPool.

A StatefulSet runs the ordinals ``[0, replicas)``: starting workers raises
``replicas`` to cover them, stopping workers lowers it (only the highest
ordinals can go, which is what a scale-down stops). The StatefulSet controller
re-creates a deleted pod under the same name; until it is Ready again, the
worker counts as not ready since its Ready condition last changed (or since
the pool first missed its pod), which is what failover measures.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable, Collection
from typing import Any, Protocol

from keyshift.api.names import ordinal_of, worker_name
from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.kubernetes.api import KubeApi, Obj
from keyshift.controller.kubernetes.objects import (
    HTTP_PORT,
    POD_INDEX_LABEL,
    label_selector,
    statefulset_name,
)

STOP_TIMEOUT = 60.0
POLL_SECONDS = 0.25


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pod_ordinal(pod: Obj, job: str) -> int | None:
    """The worker ordinal of a pod: its index label, else the suffix of its name."""
    meta = pod.get("metadata", {})
    index = (meta.get("labels") or {}).get(POD_INDEX_LABEL)
    if index is not None and str(index).isdigit():
        return int(index)
    return ordinal_of(job, str(meta.get("name", "")))  # pod names are worker names


def _condition(pod: Obj, kind: str) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def termination_message(pod: Obj) -> str:
    """Why the worker container last stopped, if it said (``terminationMessagePath``)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            if terminated.get("message"):
                return str(terminated["message"]).strip()
    return ""


def worker_info(ordinal: int, job: str, pod: Obj | None, missing_since: float | None) -> WorkerInfo:
    """What a pod (or its absence) says about worker ``ordinal``: a pure function."""
    name = worker_name(job, ordinal)
    if pod is None:
        return WorkerInfo(ordinal, name, running=False, ready=False,
                          not_ready_since=missing_since, detail="no pod")  # fmt: skip
    meta = pod.get("metadata", {})
    status = pod.get("status") or {}
    deleting = meta.get("deletionTimestamp") is not None
    phase = status.get("phase", "Pending")
    ready_cond = _condition(pod, "Ready")
    ready = not deleting and ready_cond is not None and ready_cond.get("status") == "True"
    since = None
    detail = ""
    if not ready:
        since = parse_time((ready_cond or {}).get("lastTransitionTime")) or parse_time(
            meta.get("creationTimestamp")
        )
        detail = "terminating" if deleting else f"pod {phase}, not ready"
        last_words = termination_message(pod)
        if last_words:
            detail = f"{detail}: {last_words}"
    pod_ip = status.get("podIP")
    return WorkerInfo(
        ordinal=ordinal,
        name=name,
        running=not deleting and phase in ("Pending", "Running"),
        ready=ready,
        not_ready_since=since,
        metrics_url=f"http://{pod_ip}:{HTTP_PORT}/metrics" if pod_ip else None,
        detail=detail,
    )


class PodView(Protocol):
    """Where the pool reads the job's StatefulSet and pods: the operator's watch caches
    (kopf indexes, no API request per tick), or the API itself."""

    async def statefulset(self) -> Obj | None: ...
    async def pods(self) -> list[Obj]: ...


class ApiPodView:
    """Reads straight from the API (each call is a request): for one-off uses."""

    def __init__(self, api: KubeApi, namespace: str, job: str) -> None:
        self.api = api
        self.namespace = namespace
        self.job = job

    async def statefulset(self) -> Obj | None:
        return await self.api.read("StatefulSet", self.namespace, statefulset_name(self.job))

    async def pods(self) -> list[Obj]:
        return await self.api.list_pods(self.namespace, label_selector(self.job))


class KubernetesWorkerPool:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        job: str,
        view: PodView | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.job = job
        self.name = statefulset_name(job)
        self.view = view or ApiPodView(api, namespace, job)
        self.clock = clock
        self._missing_since: dict[int, float] = {}

    async def replicas(self) -> int:
        """``spec.replicas`` as the view sees it (a watch cache may lag a write by a moment:
        scaling again to the same count is harmless)."""
        sts = await self.view.statefulset()
        return 0 if sts is None else int(sts["spec"].get("replicas") or 0)

    async def _scale(self, replicas: int) -> None:
        await self.api.scale_statefulset(self.namespace, self.name, replicas)

    async def start(self, ordinals: Collection[int]) -> None:
        if not ordinals:
            return
        current = await self.replicas()
        wanted = max(current, max(ordinals) + 1)
        if wanted != current:
            await self._scale(wanted)

    async def stop(self, ordinals: Collection[int]) -> None:
        """Lower ``replicas`` below the lowest of ``ordinals``; wait until their pods are gone."""
        if not ordinals:
            return
        current = await self.replicas()
        wanted = min(current, min(ordinals))
        if wanted != current:
            await self._scale(wanted)
        gone = set(ordinals)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline:
            pods = await self.view.pods()
            if not any(pod_ordinal(p, self.job) in gone for p in pods):
                break
            await asyncio.sleep(POLL_SECONDS)  # polling the API: no watch for one wait
        for ordinal in gone:
            self._missing_since.pop(ordinal, None)

    async def workers(self) -> dict[int, WorkerInfo]:
        replicas = await self.replicas()
        pods = await self.view.pods()
        by_ordinal = {o: p for p in pods if (o := pod_ordinal(p, self.job)) is not None}
        now = self.clock()
        out: dict[int, WorkerInfo] = {}
        for ordinal in sorted(set(range(replicas)) | set(by_ordinal)):
            pod = by_ordinal.get(ordinal)
            if pod is None:
                since = self._missing_since.setdefault(ordinal, now)
            else:
                self._missing_since.pop(ordinal, None)
                since = None
            out[ordinal] = worker_info(ordinal, self.job, pod, since)
        return out

    async def close(self) -> None:
        """Nothing to release: the pods belong to the StatefulSet, not to this process."""
