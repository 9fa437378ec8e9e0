"""A compact reimplementation of the Apache Flink Kubernetes operator's autoscaler
rules with their defaults, for one keyed vertex, to compare with keyshift in
``benchmarks/autoscaler_sim.py``.

Defaults (``flink-autoscaler/.../config/AutoScalerOptions.java`` in
apache/flink-kubernetes-operator, commit 3adc6b30; the same in the operator's
configuration reference):

- ``job.autoscaler.metrics.window`` 15 min (``metrics_window``)
- ``job.autoscaler.stabilization.interval`` 5 min (``stabilization_interval``)
- ``job.autoscaler.utilization.target`` 0.7 (``target_utilization``)
- ``job.autoscaler.target.utilization.boundary`` 0.3 (``utilization_boundary``)
- ``job.autoscaler.scale-down.interval`` 1 h (``scale_down_interval``)
- ``job.autoscaler.restart.time`` 5 min (``restart_time``)
- ``job.autoscaler.catch-up.duration`` 30 min (``catch_up_duration``)
- ``job.autoscaler.backlog-processing.lag-threshold`` 5 min (``backlog_lag_threshold``)
- ``job.autoscaler.scale-down.max-factor`` 0.6 (``max_scale_down_factor``)
- ``job.autoscaler.scale-up.max-factor`` 100000 (``max_scale_up_factor``)
- ``job.autoscaler.vertex.min-parallelism`` 1, ``vertex.max-parallelism`` 200
- ``job.autoscaler.scaling.key-group.partitions.adjust.mode`` EVENLY_SPREAD
  (:func:`flink_scale`)
- ``job.autoscaler.metrics.busy-time.aggregator`` MAX (the busiest worker's busy ratio)
- ``job.autoscaler.scaling.effectiveness.detection.enabled`` false (not modelled)
- ``kubernetes.operator.reconcile.interval`` 60 s (``reconcile_interval``;
  ``KubernetesOperatorConfigOptions``; the Helm chart's default configuration
  sets 15 s, which changes little against a 15 min window)

The rules (``ScalingMetricCollector``, ``ScalingMetricEvaluator``,
``AutoScalerUtils.getTargetProcessingCapacity``, ``JobVertexScaler``,
``DelayedScaleDown``, ``ScalingExecutor``):

- after the job (re)starts, no metrics for ``stabilization.interval``; then a
  decision only once the collected metrics span ``metrics.window``;
- true processing rate (TPR) = average input rate / busy ratio (MAX over
  subtasks); target data rate = input rate + lag growth (= arrival rate);
- target capacity = lag / catch-up + rate * restart / catch-up + rate / target
  utilisation; scale factor = target / TPR, limited to [1 - 0.6, 1 + 100000];
  new parallelism = ceil(factor * current), clamped, then aligned to a divisor
  of the max parallelism (here the key group count);
- scale only if TPR is outside [capacity at utilisation target + boundary
  without the restart term, capacity at target - boundary with it]; while
  processing a backlog (lag above 5 min of input) the band is [1.0, 0.0], so no
  scale-down and scale-up only when the job cannot keep up at all;
- a scale-up is applied at once and clears pending scale-downs; a scale-down
  is delayed: the first trigger starts ``scale-down.interval``, after which the
  highest recommendation of the interval is applied;
- every rescale restarts the job (``restart.time`` here is also the simulated
  restart: nothing is processed meanwhile).

Not modelled: memory tuning, observed-TPR switching (busy time is exact in the
simulation), ineffective-scaling detection (off by default), excluded periods,
quotas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.autoscaler_sim import JobView, Verdict


@dataclass(frozen=True)
class FlinkConfig:
    metrics_window: float = 15 * 60.0
    stabilization_interval: float = 5 * 60.0
    target_utilization: float = 0.7
    utilization_boundary: float = 0.3
    scale_down_interval: float = 60 * 60.0
    restart_time: float = 5 * 60.0
    catch_up_duration: float = 30 * 60.0
    backlog_lag_threshold: float = 5 * 60.0
    max_scale_down_factor: float = 0.6
    max_scale_up_factor: float = 100000.0
    min_parallelism: int = 1
    max_parallelism: int = 200
    reconcile_interval: float = 60.0


def flink_scale(
    current: int,
    scale_factor: float,
    max_parallelism: int,
    lower_limit: int,
    upper_limit: int,
) -> int:
    """``JobVertexScaler.scale`` for a keyed vertex in EVENLY_SPREAD mode: ceil(factor *
    current), clamped, then moved to a divisor of ``max_parallelism`` (upward first,
    never past ``current`` on a scale-down; else downward, never reversing direction)."""
    new = min(math.ceil(scale_factor * current), 2**31 - 1)
    upper = min(max_parallelism, upper_limit)
    new = min(max(lower_limit, new), upper)
    if new == current:
        return new
    up = new > current
    phase1_upper = upper if up else min(current, upper)
    for p in range(new, phase1_upper + 1):
        if max_parallelism % p == 0:
            return p
    p = new
    while p > 0:
        if max_parallelism // p > max_parallelism // new:
            if max_parallelism % p != 0:
                p += 1
            break
        p -= 1
    p = max(p, lower_limit)
    if (up and p <= current) or (not up and p >= current):
        return current
    return p


@dataclass
class FlinkAutoscaler:
    """The rules above as a policy of the simulation."""

    config: FlinkConfig = field(default_factory=FlinkConfig)
    name: str = "flink"
    delayed_since: float | None = None
    """First trigger of the pending scale-down."""
    delayed: list[tuple[float, int]] = field(default_factory=list)
    """Scale-down recommendations since then."""

    @property
    def interval_seconds(self) -> float:
        return self.config.reconcile_interval

    @property
    def metrics_window_seconds(self) -> float:
        return self.config.metrics_window

    def capacity(self, rate: float, lag: float, utilization: float, with_restart: bool) -> float:
        """``AutoScalerUtils.getTargetProcessingCapacity``."""
        c = self.config
        if utilization <= 0:
            return math.inf
        restart = rate * c.restart_time / c.catch_up_duration if with_restart else 0.0
        return round(lag / c.catch_up_duration + restart + rate / utilization)

    def evaluate(self, view: JobView) -> Verdict:
        c, now = self.config, view.now
        if view.rescaling:
            return Verdict(None, "restarting", "the job is restarting")
        stable_at = view.running_since + c.stabilization_interval
        if now < stable_at:
            return Verdict(None, "stabilizing", "stabilization interval after a restart")
        # Metrics are collected at each reconcile; the window is full one window after the
        # first collection past the stabilization interval.
        first = math.ceil(stable_at / c.reconcile_interval - 1e-9) * c.reconcile_interval
        if now < first + c.metrics_window:
            return Verdict(None, "window_not_full", "metric window not full")
        s = view.sample(c.metrics_window)
        if s.arrival_rate is None or s.processed_rate is None or s.lag is None:
            return Verdict(None, "metrics_missing", "metrics missing")
        busy = max((w.busy_ratio or 0.0) for w in s.per_worker) if s.per_worker else 0.0
        tpr = math.inf if s.processed_rate <= 0 or busy <= 0 else s.processed_rate / busy
        rate, lag = max(0.0, s.arrival_rate), float(s.lag)
        backlog = rate > 0 and lag / rate > c.backlog_lag_threshold
        upper, lower = (
            (1.0, 0.0)
            if backlog
            else (c.target_utilization + c.utilization_boundary,
                  c.target_utilization - c.utilization_boundary)
        )  # fmt: skip
        target = self.capacity(rate, lag, c.target_utilization, True)
        up_threshold = self.capacity(rate, lag, upper, False)
        down_threshold = self.capacity(rate, lag, lower, True)
        factor = 0.0 if math.isinf(tpr) else target / tpr
        factor = min(max(factor, 1 - c.max_scale_down_factor), 1 + c.max_scale_up_factor)
        current = view.current
        new = flink_scale(
            current,
            factor,
            view.key_groups,
            min(current, c.min_parallelism),
            max(current, c.max_parallelism),
        )
        outside = tpr < up_threshold or tpr > down_threshold
        detail = (
            f"TPR {tpr:,.0f} rec/s, target {target:,.0f}, band ({up_threshold:,.0f}, "
            f"{down_threshold:,.0f}), factor {factor:.2f} -> {new}"
        )
        if new == current:
            self.clear()
            return Verdict(None, "no_change", detail)
        if new > current:
            self.clear()
            if not outside:
                return Verdict(None, "within_target", detail)
            return Verdict(new, "scale_up", detail)
        if self.delayed_since is None:
            self.delayed_since = now
        # DelayedScaleDown keeps a monotonically decreasing list of recommendations.
        while self.delayed and self.delayed[-1][1] <= new:
            self.delayed.pop()
        self.delayed.append((now, new))
        if now - c.scale_down_interval < self.delayed_since:
            return Verdict(None, "scale_down_delayed", detail)
        window_start = now - c.scale_down_interval
        self.delayed = [(t, p) for t, p in self.delayed if t >= window_start]
        highest = self.delayed[0][1]
        if not outside:
            return Verdict(None, "within_target", detail)
        self.clear()
        return Verdict(highest, "scale_down", f"{detail}; highest of the interval {highest}")

    def clear(self) -> None:
        self.delayed_since = None
        self.delayed = []
