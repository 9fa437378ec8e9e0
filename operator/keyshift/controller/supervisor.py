"""One StreamJob's supervisor, the same on both hosts: the controller, the autoscaler and
the choice of the desired parallelism.

The operator (:class:`~keyshift.controller.kubernetes.job.JobRunner`) and ``keyshift
run`` (:class:`~keyshift.controller.local.run.LocalRun`) differ only in their adapters,
which they plug in here:

| adapter | Kubernetes | local |
|---|---|---|
| record store | ``status.controller`` | ``controller.json`` |
| worker pool | the StatefulSet's pods | worker processes |
| event sink | Kubernetes Events | the live view and the log |
| manual parallelism | ``spec.parallelism`` | ``desired.json`` (``keyshift scale``) |
| metrics provider | Prometheus | direct scrape, or Prometheus if the spec names one |
| autoscaler history | ``status.autoscaler`` | ``autoscaler.json`` |

Each :meth:`Supervisor.tick` runs the controller once and then, when its interval has
passed, the autoscaler (collect -> decide -> the wish the controller rescales to). While
the job is scaled to zero the autoscaler collects from the :class:`IdleProbe` instead
(the input and the timers, from the store and the job's source), to wake it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from keyshift.api.spec import AutoscalerSpec, StreamJobSpec
from keyshift.controller.autoscaling.decision import Decision, ScalingHistory
from keyshift.controller.autoscaling.metrics.base import (
    LoadSample,
    MetricsProvider,
    WorkerTarget,
    key_group_load,
)
from keyshift.controller.autoscaling.metrics.direct import DirectScrapeProvider
from keyshift.controller.autoscaling.metrics.idle import IdleProbe
from keyshift.controller.autoscaling.metrics.prometheus import PrometheusMetricsProvider
from keyshift.controller.autoscaling.runner import AutoscalerRunner, choose_desired
from keyshift.controller.core.executor import EventSink
from keyshift.controller.core.loop import Controller, ControllerSettings
from keyshift.controller.core.pool import WorkerPool
from keyshift.controller.core.reconcile import Desired
from keyshift.controller.core.records import RecordStore
from keyshift.runtime.metrics import LOCAL_NAMESPACE
from keyshift.store import StateStore, StoreError


@dataclass(frozen=True, slots=True)
class ManualRequest:
    """The parallelism the user asked for, and what identifies the request: a new request
    (even for the same parallelism) drops the autoscaler's pending wish."""

    desired: Desired
    asked: object


def metrics_provider(
    spec: AutoscalerSpec,
    *,
    namespace: str = LOCAL_NAMESPACE,
    credentials: Mapping[str, str] | None = None,
) -> MetricsProvider:
    """Prometheus when the spec names one (always on Kubernetes), else a direct scrape of
    the workers (local)."""
    if spec.prometheus.url:
        return PrometheusMetricsProvider.from_spec(
            spec, credentials=credentials, namespace=namespace
        )
    return DirectScrapeProvider(window_seconds=spec.metrics_window_seconds)


def idle_probe(
    store: StateStore,
    job: str,
    spec: StreamJobSpec,
    credentials: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
) -> IdleProbe | None:
    """What wakes the job from zero, if its autoscaler may scale it there
    (``minParallelism: 0``); ``credentials``: the Kafka ones (see :class:`IdleProbe`)."""
    scaler = spec.autoscaler
    if not scaler.enabled or scaler.min_parallelism > 0:
        return None
    return IdleProbe(store, job, spec, credentials)


_NOTHING_SEEN = object()
"""No request seen yet: the first one does not count as a change."""


class ParallelismChoice:
    """The desired parallelism: the user's unless the autoscaler wants another; a new
    request of the user drops the autoscaler's pending wish (manual scaling wins)."""

    def __init__(
        self, manual: Callable[[], ManualRequest], autoscaler: AutoscalerRunner | None
    ) -> None:
        self.manual = manual
        self.autoscaler = autoscaler
        self._seen: object = _NOTHING_SEEN

    def __call__(self) -> Desired:
        request = self.manual()
        if request.asked != self._seen:
            if self._seen is not _NOTHING_SEEN and self.autoscaler is not None:
                self.autoscaler.manual_change()
            self._seen = request.asked
        wish = None if self.autoscaler is None else self.autoscaler.wish
        return choose_desired(request.desired, wish)


class Supervisor:
    """The controller and the autoscaler of one job, wired once for both hosts."""

    def __init__(
        self,
        job: str,
        key_groups: int,
        store: StateStore,
        pool: WorkerPool,
        records: RecordStore,
        *,
        manual: Callable[[], ManualRequest],
        autoscaler: AutoscalerSpec | None = None,
        provider: MetricsProvider | None = None,
        history: ScalingHistory | None = None,
        on_decision: Callable[[Decision, bool], None] | None = None,
        settings: ControllerSettings | None = None,
        on_event: EventSink | None = None,
        fallback_load: Callable[[], LoadSample | None] = lambda: None,
        namespace: str = LOCAL_NAMESPACE,
        clock: Callable[[], float] = time.time,
        idle_probe: IdleProbe | None = None,
    ) -> None:
        """``autoscaler`` (enabled) needs ``provider``; ``fallback_load`` is a window of the
        job's load that ranges follow while the autoscaler has none (the live view's);
        ``idle_probe`` (with ``minParallelism: 0``) tells when to wake a job scaled to zero."""
        self.idle_probe = idle_probe
        self.job = job
        self.key_groups = key_groups
        self.pool = pool
        self.clock = clock
        self.autoscaler: AutoscalerRunner | None = None
        if autoscaler is not None and autoscaler.enabled:
            if provider is None:
                raise ValueError("an enabled autoscaler needs a metrics provider")
            self.autoscaler = AutoscalerRunner(
                job, key_groups, autoscaler, provider, history,
                on_decision=on_decision, namespace=namespace,
            )  # fmt: skip
        self.fallback_load = fallback_load
        self.desired = ParallelismChoice(manual, self.autoscaler)
        self.controller = Controller(
            job, key_groups, store, pool, records,
            desired=self.desired, load=self.key_group_load, settings=settings,
            on_event=on_event, clock=clock,
        )  # fmt: skip

    @property
    def last_window(self) -> LoadSample | None:
        """The autoscaler's last window of the job's load, if it runs."""
        return None if self.autoscaler is None else self.autoscaler.last_window

    def key_group_load(self) -> tuple[float, ...] | None:
        """The load per key group a rescale's ranges follow: over the autoscaler's window,
        else the fallback's; None (ranges by count) until one is known."""
        return key_group_load(self.last_window or self.fallback_load(), self.key_groups)

    async def tick(self) -> Decision | None:
        """The controller once, then the autoscaler if its interval has passed (its
        decision, or None); a decision to rescale starts at once (the controller again),
        not a tick later. Store errors reach the caller."""
        decision = await self._tick()
        if decision is not None and decision.action in ("scale_up", "scale_down"):
            await self.controller.tick()
        return decision

    async def _tick(self) -> Decision | None:
        controller = self.controller
        await controller.tick()
        scaler = self.autoscaler
        now = self.clock()
        if scaler is None or controller.assignment is None:
            return None
        probe = self.idle_probe
        if controller.assignment.parallelism == 0 and controller.executor.record.current is None:
            if probe is None:
                return None
            return await scaler.tick_idle(now=now, probe=lambda: probe.sample(now))
        if probe is not None:
            await probe.close()  # awake: the workers read the input
        if not scaler.due(now):
            return None
        workers = await self.pool.workers()
        targets = [WorkerTarget(w.ordinal, w.name, w.metrics_url)
                   for w in workers.values() if w.metrics_url]  # fmt: skip
        return await scaler.tick(
            now=now, current=controller.assignment.parallelism,
            rescale=controller.executor.record.current, targets=targets,
        )  # fmt: skip

    async def tick_through_outage(self) -> StoreError | None:
        """:meth:`tick`, with a store error noted by the controller and returned (for the
        host to report): when the store is back, failover gives the workers their full
        ``failoverAfter`` to heartbeat again rather than failing over every one of them
        for the heartbeats the outage kept from the store. Both hosts tick through this."""
        try:
            await self.tick()
        except StoreError as exc:
            self.controller.store_unreachable(exc)
            return exc
        self.controller.last_error = None
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set; store outages are waited out, not fatal."""
        while not stop.is_set():
            await self.tick_through_outage()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.controller.pause_seconds())

    async def close(self) -> None:
        """Close the metrics provider (the host closes what it opened: the store)."""
        if self.autoscaler is not None:
            await self.autoscaler.provider.close()
        if self.idle_probe is not None:
            await self.idle_probe.close()
