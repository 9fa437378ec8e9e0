"""Scaling execution: the autoscaler on a schedule, between the metrics and the controller.

Like the Flink autoscaler, three parts: *collection* (a
:class:`~keyshift.controller.autoscaling.metrics.direct.MetricsProvider`: direct scrape in
local mode, Prometheus on Kubernetes), *evaluation*
(:func:`keyshift.controller.autoscaling.decision.decide`, pure) and *execution* (this
module): every ``intervalSeconds`` it collects a window, asks for a decision,
counts and reports it, and in ``scale`` mode turns it into the desired
parallelism the controller rescales to. In ``recommend`` mode it only reports.

While the job is scaled to zero (``minParallelism: 0``) there is no worker to collect
from: every ``wakeCheckSeconds`` an *idle probe* (``metrics/idle.py``: the input's ends
against the positions in the store, and the earliest timer) is collected instead, and
:func:`~keyshift.controller.autoscaling.decision.decide_wake` says whether to wake.

Manual scaling wins: when the user sets a parallelism (``keyshift scale``,
``kubectl scale``), the autoscaler's pending wish is dropped and it decides
again from the new parallelism on its next interval.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from keyshift.api.spec import AutoscalerSpec
from keyshift.controller.autoscaling.decision import (
    Decision,
    ScalingHistory,
    decide,
    decide_wake,
)
from keyshift.controller.autoscaling.metrics.base import (
    IdleSample,
    LoadSample,
    MetricsProvider,
    WorkerTarget,
)
from keyshift.controller.core import metrics as metrics
from keyshift.controller.core.reconcile import Desired
from keyshift.controller.core.rescale import Rescale
from keyshift.runtime.metrics import LOCAL_NAMESPACE

log = logging.getLogger("keyshift.autoscaler")

DIRECTIONS = {"scale_up": "up", "scale_down": "down"}


def direction(decision: Decision) -> str:
    """The ``direction`` label of ``keyshift_scaling_decisions_total``."""
    return DIRECTIONS.get(decision.action, decision.action)


def event_kind(decision: Decision) -> str:
    """The Kubernetes Event type of a decision: a blocked scale-up is a warning."""
    return "Warning" if decision.action == "blocked" else "Normal"


def worth_an_event(decision: Decision, previous: Decision | None) -> bool:
    """Actions always; otherwise only a change of reason (no event every interval)."""
    if decision.action != "none":
        return True
    return previous is None or previous.reason != decision.reason


def choose_desired(manual: Desired, wish: int | None) -> Desired:
    """What the controller rescales to: the autoscaler's wish if it has one, else the manual."""
    return manual if wish is None else Desired(wish, "autoscaler")


class AutoscalerRunner:
    def __init__(
        self,
        job: str,
        key_groups: int,
        spec: AutoscalerSpec,
        provider: MetricsProvider,
        history: ScalingHistory | None = None,
        *,
        on_decision: Callable[[Decision, bool], None] | None = None,
        namespace: str = LOCAL_NAMESPACE,
    ) -> None:
        self.job = job
        self.namespace = namespace
        self.key_groups = key_groups
        self.spec = spec
        self.provider = provider
        self.history = history if history is not None else ScalingHistory()
        self.on_decision = on_decision or (lambda decision, notable: None)
        """Called with each decision and whether it is worth an event."""
        asleep = spec.mode == "scale" and spec.min_parallelism == 0
        self.wish: int | None = 0 if asleep and self.history.parallelism == 0 else None
        """The parallelism the autoscaler last chose (scale mode); it stands until the
        autoscaler chooses another or the user sets one. A job the autoscaler scaled to
        zero stays there across a restart of the controller, unless its spec no longer
        allows zero (then the manual parallelism wakes it)."""
        self.last: Decision | None = self.history.decisions[-1] if self.history.decisions else None
        self.last_window: LoadSample | None = None
        """The last window collected (the job's status reads failed key groups from it)."""
        self._next_at = 0.0

    def manual_change(self) -> None:
        """The user set the parallelism: drop the pending wish."""
        self.wish = None

    def due(self, now: float) -> bool:
        """Whether the interval has passed: the next :meth:`tick` evaluates."""
        return now >= self._next_at

    async def tick(
        self,
        *,
        now: float,
        current: int,
        rescale: Rescale | None,
        targets: Sequence[WorkerTarget],
    ) -> Decision | None:
        """One evaluation if the interval has passed; the decision, or None."""
        if not self.due(now):
            return None
        self._next_at = now + self.spec.interval_seconds
        window = await self.provider.collect(self.job, targets)
        self.last_window = window
        decision, self.history = decide(
            window, self.history, self.spec,
            current=current, key_groups=self.key_groups, now=now,
            rescaling=rescale is not None,
            failing_over=rescale is not None and rescale.reason == "failover",
        )  # fmt: skip
        log.info("%s: %s -> %s (%s): %s", self.job, decision.current, decision.desired,
                 decision.reason, decision.message)  # fmt: skip
        if decision.desired == 0:  # scaling to zero: the wake checks start soon after
            self._next_at = now + self.spec.wake_check_seconds
        self._record(decision)
        return decision

    def wake_due(self, now: float) -> bool:
        """Whether the wake check's interval has passed (the job is at zero)."""
        return now >= self._next_at

    async def tick_idle(
        self, *, now: float, probe: Callable[[], Awaitable[IdleSample]]
    ) -> Decision | None:
        """While the job is scaled to zero: every ``wakeCheckSeconds``, collect an idle sample
        with ``probe`` and decide whether to wake; the decision, or None."""
        if not self.wake_due(now):
            return None
        self._next_at = now + self.spec.wake_check_seconds
        sample = await probe()
        decision, self.history = decide_wake(
            sample, self.history, self.spec, key_groups=self.key_groups, now=now
        )
        if worth_an_event(decision, self.last):  # not one line per check while asleep
            log.info("%s: %s -> %s (%s): %s", self.job, decision.current, decision.desired,
                     decision.reason, decision.message)  # fmt: skip
        self._record(decision)
        return decision

    def _record(self, decision: Decision) -> None:
        """Count, report and (scale mode) act on ``decision``."""
        metrics.SCALING_DECISIONS.labels(
            streamjob=self.job, namespace=self.namespace, direction=direction(decision),
            reason=decision.reason,
        ).inc()  # fmt: skip
        if self.spec.mode == "scale" and decision.action in DIRECTIONS:
            self.wish = decision.desired
        self.on_decision(decision, worth_an_event(decision, self.last))
        self.last = decision

    def status(self) -> dict[str, object]:
        """``status.autoscaler`` (and ``keyshift status``): mode, last decisions, history."""
        return {
            "enabled": self.spec.enabled,
            "mode": self.spec.mode,
            "wish": self.wish,
            "last": None if self.last is None else msgspec.to_builtins(self.last),
            "decisions": msgspec.to_builtins(self.history.decisions),
            "history": msgspec.to_builtins(self.history),
        }


def history_from(raw: object) -> ScalingHistory | None:
    """A history saved by :meth:`AutoscalerRunner.status`, or None if there is none."""
    if not isinstance(raw, dict) or not raw.get("history"):
        return None
    try:
        return msgspec.convert(raw["history"], type=ScalingHistory)
    except msgspec.ValidationError:
        return None  # an older shape: start afresh
