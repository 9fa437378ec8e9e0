"""Trace-driven simulation of the autoscaler: keyshift's ``decide`` against a
reimplementation of the Flink Kubernetes operator's autoscaler defaults.

    python -m benchmarks.autoscaler_sim [--no-results-md] [--no-plot]

**The job model** (:class:`JobModel`): ``key_groups`` key groups, each receiving
an equal share of the trace's load; worker ``i`` of ``n`` owns the key range
of :func:`keyshift.controller.core.assignment.key_range` and processes at most
``worker_capacity`` records/s over the key groups it owns, oldest backlog
first in proportion.  A key group's lag is what arrived and was not processed.
A worker's busy ratio is its processed records over its capacity (a worker with
work is busy), so the busy time is exact here.  Time advances in steps of
``dt`` (1 s).

**Rescales** (:func:`simulate`): keyshift starts the new workers first
(``startup_seconds``, the old assignment keeps processing), then hands the
moving key groups over, which stall for ``pause_seconds``; a scale-down hands
over first, then stops workers.  The Flink model restarts the whole job: every
key group stalls for ``pause_seconds`` (the restart) and lag builds.

**Metrics** (:meth:`Simulation.sample`): the same ``LoadSample`` the direct
scrape provider produces, over the last ``window`` seconds: arrival rate,
processed rate, total lag and its trend, and per worker its processed rate,
busy ratio and lag.  A worker started less than a window ago makes the sample
incomplete (named in ``missing``), as the real provider does.

**Policies** are evaluated every ``interval_seconds`` from t = 0; before that
the job runs a warm-up at the trace's initial load so that both have a full
metrics history.  keyshift: :class:`KeyshiftPolicy` (``decide`` with the
``AutoscalerSpec`` defaults: targetUtilization 0.7, utilizationBoundary 0.2,
catchUpSeconds 120, metricsWindowSeconds 60, intervalSeconds 15,
cooldownSeconds 30, scaleDownStabilizationSeconds 300, no factors).  Flink:
:class:`benchmarks.flink_autoscaler.FlinkAutoscaler` (its defaults, cited there).

**Scale to zero** (``minParallelism: 0``): ``decide``'s ``idle`` decision scales to 0
like any scale-down (the key groups are handed over, i.e. released, then the workers
stop; nothing is left to process, as the job was idle).  At 0 no worker runs, so none
is charged, nothing is processed and arriving input waits as lag.  Every
``wakeCheckSeconds`` (the simulation's step, 1 s, is the finest it can check; the
default is 1 s) the policy gets an ``IdleSample`` whose backlog is the input arrived
and not processed, and asks ``decide_wake``, as the operator's runner does
(``AutoscalerRunner.tick_idle``).  A wake is a scale-up from 0: the new workers start
``startup_seconds`` (5 s) before the handoff, then every key group pauses
``pause_seconds`` (1 s), so the cold start is the detection (up to a check interval
after the first record) + 6 s.  That is slower than measured
(benchmarks/RESULTS.md, "Cold start from zero": 0.6-1.4 s locally), leaving room for
a pod's scheduling.  After it the new workers leave the metrics window incomplete for a
window, as after any scale-up.  :class:`Wake` records each wake: when the input came
back, when the workers process again, and when the lag was under ``LAG_OK_SECONDS`` of
input for good (until the next scale to zero).

Results: ``benchmarks/results/autoscaler_sim.json``, the plot
``benchmarks/autoscaler_sim.png`` and the "Autoscaler (simulation)" section of
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from keyshift.api.spec import AutoscalerSpec
from keyshift.controller.autoscaling.decision import (
    Decision,
    ScalingHistory,
    align,
    continues_sleep,
    decide,
    decide_wake,
    max_range,
)
from keyshift.controller.autoscaling.metrics.base import IdleSample, LoadSample, WorkerLoad
from keyshift.controller.core.assignment import idle_owners, plan_assignment

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "autoscaler_sim.json"
PLOT = HERE / "autoscaler_sim.png"

FloatArray = npt.NDArray[np.float64]

#: "Enough" capacity: the load at no more than this busy ratio (keyshift's upper band edge).
ENOUGH_UTILIZATION = 0.9
#: Lag counts as recovered once it stays under this many seconds of input.
LAG_OK_SECONDS = 10.0


# -- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobModel:
    """Workers, key groups and what a rescale costs."""

    key_groups: int = 128
    worker_capacity: float = 1000.0
    """Records/s one worker processes when busy all the time."""
    startup_seconds: float = 5.0
    """A scale-up starts the new workers this long before the handoff."""
    pause_seconds: float = 1.0
    """Moving key groups (all of them if ``pause_all``) process nothing for this long."""
    pause_all: bool = False
    """The rescale restarts the whole job (Flink) rather than moving key ranges."""
    dt: float = 1.0

    def capacity(self, parallelism: int) -> float:
        """Records/s the job sustains with even load per key group: the busiest worker's
        range bounds it (0 at parallelism 0)."""
        if parallelism <= 0:
            return 0.0
        return self.worker_capacity * self.key_groups / max_range(parallelism, self.key_groups)


#: keyshift on Kubernetes: new pods start in ~5 s; a moved key group pauses ~0.1 s
#: (benchmarks/RESULTS.md, "Rescale"), rounded up to 1 s.
KEYSHIFT_MODEL = JobModel(startup_seconds=5.0, pause_seconds=1.0)
#: Flink: a rescale restarts the job; job.autoscaler.restart.time defaults to 5 min.
FLINK_MODEL = JobModel(startup_seconds=0.0, pause_seconds=300.0, pause_all=True)


@dataclass(frozen=True)
class Trace:
    """A load over time: ``shape(t)`` records/s (t < 0 is the warm-up), times noise."""

    name: str
    title: str
    duration: float
    shape: Callable[[float], float]
    initial_parallelism: int
    noise: float = 0.0
    """Relative noise: the load is multiplied by a uniform factor in [1 - noise, 1 + noise]..."""
    noise_period: float = 15.0
    """...drawn afresh every this many seconds."""
    seed: int = 1
    change_at: float | None = None
    """When the load changes (time to capacity and lag recovery are measured from it)."""

    @property
    def rises(self) -> bool:
        """The load goes up at ``change_at``."""
        at = self.change_at
        return at is not None and self.shape(at) > self.shape(at - 1.0)


def steady_parallelism(rate: float, model: JobModel, target: float = 0.7) -> int:
    """What keyshift settles on for ``rate``: ceil(rate / target / capacity), aligned."""
    return align(math.ceil(rate / target / model.worker_capacity - 1e-9), model.key_groups)


def step_trace(
    base: float = 2000.0, factor: float = 4.0, at: float = 300.0, duration: float = 3600.0
) -> Trace:
    """``base`` records/s, then ``factor`` times that from ``at`` on."""
    return Trace(
        name="step",
        title=f"step {base:,.0f} -> {base * factor:,.0f} rec/s (1x -> {factor:g}x)",
        duration=duration,
        shape=lambda t: base if t < at else base * factor,
        initial_parallelism=steady_parallelism(base, KEYSHIFT_MODEL),
        change_at=at,
    )


def steady_trace(
    base: float = 2000.0, noise: float = 0.15, duration: float = 600.0, seed: int = 7
) -> Trace:
    """``base`` records/s with +-``noise`` relative noise (a new draw every 15 s)."""
    return Trace(
        name="steady",
        title=f"steady {base:,.0f} rec/s +-{noise:.0%} noise",
        duration=duration,
        shape=lambda t: base,
        initial_parallelism=steady_parallelism(base, KEYSHIFT_MODEL),
        noise=noise,
        seed=seed,
    )


def drop_trace(
    base: float = 2000.0, factor: float = 4.0, at: float = 300.0, duration: float = 7200.0
) -> Trace:
    """``factor`` times ``base`` records/s, then ``base`` from ``at`` on."""
    return Trace(
        name="drop",
        title=f"drop {base * factor:,.0f} -> {base:,.0f} rec/s ({factor:g}x -> 1x)",
        duration=duration,
        shape=lambda t: base * factor if t < at else base,
        initial_parallelism=steady_parallelism(base * factor, KEYSHIFT_MODEL),
        change_at=at,
    )


def sine_trace(
    low: float = 2000.0,
    high: float = 8000.0,
    period: float = 86400.0,
    duration: float = 86400.0,
    noise: float = 0.05,
) -> Trace:
    """A day: from ``low`` at t = 0 up to ``high`` at half the period and back."""
    mid, amp = (low + high) / 2, (high - low) / 2
    return Trace(
        name="sine",
        title=f"daily sine {low:,.0f}-{high:,.0f} rec/s, +-{noise:.0%} noise",
        duration=duration,
        shape=lambda t: mid - amp * math.cos(2 * math.pi * max(t, 0.0) / period),
        initial_parallelism=steady_parallelism(low, KEYSHIFT_MODEL),
        noise=noise,
        seed=11,
    )


def default_traces() -> list[Trace]:
    return [step_trace(), steady_trace(), drop_trace(), sine_trace()]


# -- policies ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    """What a policy sees at one evaluation."""

    now: float
    current: int
    key_groups: int
    rescaling: bool
    running_since: float
    """When the job last (re)started: the end of the last Flink restart."""
    sample: Callable[[float], LoadSample]
    """The metrics over the last ``window`` seconds."""
    backlog: Callable[[], int] = lambda: 0
    """Records arrived and not processed (what the idle probe reads at parallelism 0)."""


@dataclass(frozen=True)
class Verdict:
    desired: int | None
    """A parallelism to move to now, or None."""
    reason: str
    message: str


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def interval_seconds(self) -> float:
        """Seconds between evaluations."""

    @property
    def metrics_window_seconds(self) -> float:
        """The longest window it samples (the simulation keeps that much history)."""

    def evaluate(self, view: JobView) -> Verdict: ...


class KeyshiftPolicy:
    """keyshift's ``decide``, with the history kept between evaluations; at parallelism 0
    (no rescale running) ``decide_wake`` on an ``IdleSample`` instead."""

    name = "keyshift"

    def __init__(self, spec: AutoscalerSpec | None = None) -> None:
        self.spec = spec or AutoscalerSpec(enabled=True)
        self.interval_seconds = self.spec.interval_seconds
        self.metrics_window_seconds = self.spec.metrics_window_seconds
        self.wake_check_seconds = self.spec.wake_check_seconds
        """The interval at parallelism 0 (:func:`simulate` reads it)."""
        self.history = ScalingHistory()
        self.decisions: list[Decision] = []
        """The decisions, a run of "still at zero" ones kept as its last (as the history
        keeps them)."""
        self.wake_checks = 0
        self._last_idle: tuple[float, int] | None = None
        """The previous wake check's time and backlog (the arrival rate, as the probe's)."""

    def evaluate(self, view: JobView) -> Verdict:
        if view.current == 0 and not view.rescaling:
            self.wake_checks += 1
            backlog = view.backlog()
            arrival = None  # at zero nothing is processed: the backlog grows by the arrivals
            if self._last_idle is not None and view.now > self._last_idle[0]:
                arrival = max(0.0, (backlog - self._last_idle[1]) / (view.now - self._last_idle[0]))
            self._last_idle = (view.now, backlog)
            sample = IdleSample(at=view.now, backlog=backlog, next_timer_at=None,
                                arrival_rate=arrival)  # fmt: skip
            decision, self.history = decide_wake(
                sample, self.history, self.spec, key_groups=view.key_groups, now=view.now
            )
            if continues_sleep(self.decisions[-1] if self.decisions else None, decision):
                self.decisions.pop()
        else:
            self._last_idle = None  # awake: the next sleep measures its arrivals afresh
            window = view.sample(self.spec.metrics_window_seconds)
            decision, self.history = decide(
                window,
                self.history,
                self.spec,
                current=view.current,
                key_groups=view.key_groups,
                now=view.now,
                rescaling=view.rescaling,
                failing_over=False,
            )
        self.decisions.append(decision)
        acted = decision.action in ("scale_up", "scale_down")
        return Verdict(decision.desired if acted else None, decision.reason, decision.message)


# -- the simulation ------------------------------------------------------------------------------


def owners(key_groups: int, parallelism: int) -> npt.NDArray[np.int64]:
    """Each key group's worker (``plan_assignment``); nobody's (``idle_owners``) at
    parallelism 0, as the operator assigns them."""
    plan = plan_assignment(key_groups, parallelism) if parallelism > 0 else idle_owners(key_groups)
    return np.array(plan, dtype=np.int64)


@dataclass(frozen=True)
class Snapshot:
    t: float
    arrived: float
    lag: float
    processed: FloatArray
    busy: FloatArray


@dataclass
class Pending:
    """A rescale under way."""

    decided_at: float
    to: int
    switch_at: float
    done_at: float
    switched: bool = False


@dataclass
class Action:
    t: float
    from_: int
    to: int
    reason: str
    message: str


@dataclass
class Wake:
    """One wake from parallelism 0 and the lag after it (seconds are simulation time)."""

    input_at: float
    """The first step with input since the job was at 0 (the decision's time if none)."""
    decided_at: float
    to: int
    backlog: int
    """Records waiting when the wake was decided."""
    running_at: float | None = None
    """When the woken workers process (the wake's rescale done)."""
    lag_ok_at: float | None = None
    """End of the last step (before the next scale to zero) with the lag at or above
    ``LAG_OK_SECONDS`` of input; None if there was none."""
    max_lag_records: float = 0.0
    max_lag_seconds: float = 0.0
    """Over the time awake: the highest lag, in records and in seconds of input."""
    asleep_at: float | None = None
    """The next scale to zero's decision, if any."""

    @property
    def cold_start(self) -> float | None:
        """Input back -> workers processing."""
        return None if self.running_at is None else self.running_at - self.input_at

    @property
    def lag_ok_after(self) -> float:
        """Input back -> lag under ``LAG_OK_SECONDS`` of input for the rest of the time
        awake (0: it never was above)."""
        return 0.0 if self.lag_ok_at is None else self.lag_ok_at - self.input_at

    def summary(self) -> dict[str, Any]:
        return {
            "input_at": self.input_at,
            "decided_at": self.decided_at,
            "to": self.to,
            "backlog_records": self.backlog,
            "cold_start_seconds": self.cold_start,
            "lag_ok_after_seconds": self.lag_ok_after,
            "max_lag_records": round(self.max_lag_records),
            "max_lag_seconds": round(self.max_lag_seconds, 1),
            "asleep_at": self.asleep_at,
        }


@dataclass
class Run:
    """One trace through one policy: the series and the summary."""

    policy: str
    trace: str
    # One point per ``record_every`` seconds: mean load and capacity, highest lag,
    # workers running at the end.
    times: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    capacity: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    parallelism: list[int] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    max_lag_records: float = 0.0
    max_lag_seconds: float = 0.0
    enough_after: float | None = None
    """Seconds from the change until capacity covered the new load at <= 90% busy."""
    lag_ok_after: float | None = None
    """Seconds from the change until the lag stayed under 10 s of input."""
    worker_hours: float = 0.0
    final_parallelism: int = 0
    seconds_at_zero: float = 0.0
    """Time with no worker running (nothing charged)."""
    wakes: list[Wake] = field(default_factory=list)
    records_arrived: float = 0.0
    records_processed: float = 0.0
    """Since the simulation's start (warm-up included): arrived - processed = the final lag."""
    final_lag: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "trace": self.trace,
            "actions": len(self.actions),
            "scale_ups": sum(a.to > a.from_ for a in self.actions),
            "scale_downs": sum(a.to < a.from_ for a in self.actions),
            "action_log": [asdict(a) for a in self.actions],
            "reasons": dict(sorted(self.reasons.items())),
            "max_lag_records": round(self.max_lag_records),
            "max_lag_seconds": round(self.max_lag_seconds, 1),
            "enough_after_seconds": self.enough_after,
            "lag_ok_after_seconds": self.lag_ok_after,
            "worker_hours": round(self.worker_hours, 2),
            "final_parallelism": self.final_parallelism,
            "seconds_at_zero": self.seconds_at_zero,
            "wakes": [w.summary() for w in self.wakes],
            "records_arrived": round(self.records_arrived),
            "records_processed": round(self.records_processed),
            "final_lag_records": round(self.final_lag),
        }


class Simulation:
    """The job under one policy; :func:`simulate` drives it."""

    def __init__(self, trace: Trace, model: JobModel, warmup: float) -> None:
        k = model.key_groups
        self.trace, self.model, self.k = trace, model, k
        self.t = -warmup
        self.start = -warmup
        self.current = trace.initial_parallelism
        self.running = trace.initial_parallelism  # workers up (new ones start before the handoff)
        self.owners = owners(k, self.current)
        self.lag_kg = np.zeros(k)
        self.paused_until = np.full(k, -math.inf)
        self.started_at = np.full(k, -math.inf)
        self.processed = np.zeros(k)  # per worker ordinal, cumulative
        self.busy = np.zeros(k)
        self.arrived = 0.0
        self.processed_total = 0.0
        self.running_since = -warmup
        self.pending: Pending | None = None
        self.snaps: deque[Snapshot] = deque()
        rng = np.random.default_rng(trace.seed)
        periods = int((warmup + trace.duration) / trace.noise_period) + 2
        self.noise = 1 + trace.noise * rng.uniform(-1.0, 1.0, periods)

    # load

    def rate(self, t: float) -> float:
        i = int((t - self.start) // self.trace.noise_period)
        return self.trace.shape(t) * float(self.noise[i])

    # rescales

    def start_rescale(self, to: int) -> None:
        m, now = self.model, self.t
        if m.pause_all:  # Flink: restart
            self.pending = Pending(now, to, switch_at=now, done_at=now + m.pause_seconds)
        elif to > self.current:
            new = slice(self.current, to)
            self.started_at[new] = now
            self.processed[new] = 0.0
            self.busy[new] = 0.0
            self.running = to
            switch = now + m.startup_seconds
            self.pending = Pending(now, to, switch_at=switch, done_at=switch + m.pause_seconds)
        else:
            self.pending = Pending(now, to, switch_at=now, done_at=now + m.pause_seconds)
        self.advance_rescale()

    def advance_rescale(self) -> None:
        p, m = self.pending, self.model
        if p is None:
            return
        if not p.switched and self.t >= p.switch_at:
            p.switched = True
            new = owners(self.k, p.to)
            moved = np.ones(self.k, dtype=bool) if m.pause_all else new != self.owners
            self.paused_until[moved] = p.done_at
            self.owners = new
            self.running = max(self.running, p.to)
        if p.switched and self.t >= p.done_at:
            self.current = self.running = p.to
            if m.pause_all:
                self.running_since = p.done_at
                self.started_at[:] = p.done_at
                self.processed[:] = 0.0
                self.busy[:] = 0.0
            self.started_at[p.to :] = math.inf
            self.pending = None

    # physics

    def step(self) -> tuple[float, float]:
        """Advance by dt; return the load and the capacity of the step."""
        m, dt = self.model, self.model.dt
        rate = self.rate(self.t)
        self.lag_kg += rate * dt / self.k
        self.arrived += rate * dt
        if self.owner_count() == 0:  # at zero: the input waits
            self.t += dt
            return rate, 0.0
        avail = np.clip((self.t + dt - self.paused_until) / dt, 0.0, 1.0)
        processable = self.lag_kg * avail
        demand = np.bincount(self.owners, weights=processable, minlength=self.k)
        budget = m.worker_capacity * dt
        scale = np.where(demand > budget, budget / np.maximum(demand, 1e-12), 1.0)
        done = processable * scale[self.owners]
        self.lag_kg -= done
        per_worker = np.bincount(self.owners, weights=done, minlength=self.k)
        self.processed += per_worker
        self.processed_total += float(per_worker.sum())
        self.busy += per_worker / m.worker_capacity
        capacity = m.capacity(self.owner_count()) * float(avail.mean())
        self.t += dt
        return rate, capacity

    def owner_count(self) -> int:
        """Workers owning key groups (0 at parallelism 0)."""
        return int(self.owners.max()) + 1

    def backlog(self) -> int:
        """Records arrived and not processed."""
        return round(float(self.lag_kg.sum()))

    def snapshot(self) -> None:
        self.snaps.append(
            Snapshot(
                self.t, self.arrived, float(self.lag_kg.sum()), self.processed.copy(),
                self.busy.copy(),
            )
        )  # fmt: skip

    # metrics

    def sample(self, window: float) -> LoadSample:
        """What the direct scrape provider would report over the last ``window`` seconds."""
        now = self.snaps[-1]
        back = round(window / self.model.dt)
        missing: list[str] = []
        if len(self.snaps) <= back:
            then = self.snaps[0]
            missing.append("window: not enough history")
        else:
            then = self.snaps[-1 - back]
        span = now.t - then.t
        workers: list[WorkerLoad] = []
        reporting = 0
        for w in range(self.current):
            started = float(self.started_at[w])
            name = f"sim-worker-{w}"
            if started <= then.t:
                reporting += 1
                covered = span
                processed = float(now.processed[w] - then.processed[w])
                busy = float(now.busy[w] - then.busy[w])
            else:
                covered = now.t - started
                processed, busy = float(now.processed[w]), float(now.busy[w])
                missing.append(f"{name}: no data at the start of the window (not started yet)")
            owned = self.owners == w
            workers.append(
                WorkerLoad(
                    ordinal=w,
                    name=name,
                    processed_rate=processed / covered if covered > 0 else None,
                    busy_ratio=min(1.0, busy / covered) if covered > 0 else None,
                    key_groups_owned=int(owned.sum()),
                    generation=0,
                    cache_hit_ratio=None,
                    lag=round(float(self.lag_kg[owned].sum())),
                )
            )
        rates_known = [x.processed_rate for x in workers if x.processed_rate is not None]
        return LoadSample(
            at=now.t,
            window_seconds=span,
            workers_expected=self.current,
            workers_reporting=reporting,
            arrival_rate=(now.arrived - then.arrived) / span if span > 0 else None,
            processed_rate=sum(rates_known) if rates_known else None,
            lag=round(now.lag),
            lag_trend=(now.lag - then.lag) / span if span > 0 else None,
            per_worker=tuple(workers),
            lag_by_key_group={kg: round(float(x)) for kg, x in enumerate(self.lag_kg)},
            complete=not missing,
            missing=tuple(missing),
        )


def simulate(
    trace: Trace,
    policy: Policy,
    model: JobModel,
    *,
    warmup: float = 1260.0,
    record_every: float | None = None,
) -> Run:
    """Run ``trace`` through ``policy`` on ``model``; see the module docstring.

    A policy with a ``wake_check_seconds`` attribute (:class:`KeyshiftPolicy`) is evaluated
    that often while the job is at 0 and right after a decision for 0, as the operator's
    runner does; at most once per step (``model.dt``)."""
    sim = Simulation(trace, model, warmup)
    keep = round(max(policy.metrics_window_seconds, 60.0) / model.dt) + 2
    record_every = record_every or max(5.0, trace.duration / 720)
    wake_check: float | None = getattr(policy, "wake_check_seconds", None)
    run = Run(policy=policy.name, trace=trace.name)
    next_eval = 0.0
    bucket: list[tuple[float, float, float]] = []
    lag_high_until: float | None = None
    change = trace.change_at
    input_back: float | None = None  # the first step with input while at 0
    wake: Wake | None = None  # the last wake, until the next scale to zero
    while sim.t < trace.duration - 1e-9:
        sim.advance_rescale()
        sim.snapshot()
        if len(sim.snaps) > keep:
            sim.snaps.popleft()
        t = sim.t
        if t >= next_eval - 1e-9:
            asleep = sim.current == 0 and sim.pending is None
            view = JobView(
                now=t,
                current=sim.current,
                key_groups=model.key_groups,
                rescaling=sim.pending is not None,
                running_since=sim.running_since,
                sample=sim.sample,
                backlog=sim.backlog,
            )
            verdict = policy.evaluate(view)
            run.reasons[verdict.reason] = run.reasons.get(verdict.reason, 0) + 1
            if wake_check is not None and (asleep or verdict.desired == 0):
                next_eval = t + wake_check
            else:
                next_eval += policy.interval_seconds
            if verdict.desired is not None and verdict.desired != sim.current:
                run.actions.append(
                    Action(t, sim.current, verdict.desired, verdict.reason, verdict.message)
                )
                if asleep:
                    at = t if input_back is None else input_back
                    wake = Wake(at, t, verdict.desired, sim.backlog())
                    run.wakes.append(wake)
                    input_back = None
                elif verdict.desired == 0 and wake is not None:
                    wake.asleep_at, wake = t, None
                sim.start_rescale(verdict.desired)
        running = sim.running
        load, capacity = sim.step()
        if t < 0:
            continue
        lag = float(sim.lag_kg.sum())
        run.worker_hours += running * model.dt / 3600
        if running == 0:
            run.seconds_at_zero += model.dt
        run.max_lag_records = max(run.max_lag_records, lag)
        if load > 0:  # seconds of input: none at zero load
            run.max_lag_seconds = max(run.max_lag_seconds, lag / load)
        if sim.owner_count() == 0 and wake is None and input_back is None and load > 0:
            input_back = t
        if wake is not None:
            if wake.running_at is None and sim.current > 0:
                wake.running_at = t
            wake.max_lag_records = max(wake.max_lag_records, lag)
            if load > 0:
                wake.max_lag_seconds = max(wake.max_lag_seconds, lag / load)
            if lag > 0 and lag >= LAG_OK_SECONDS * load:
                wake.lag_ok_at = sim.t
        if change is not None and t >= change:
            nominal = trace.shape(t)
            enough = capacity * ENOUGH_UTILIZATION >= nominal
            if trace.rises and run.enough_after is None and enough:
                run.enough_after = sim.t - change
            if lag >= LAG_OK_SECONDS * load:
                lag_high_until = sim.t
        bucket.append((load, capacity, lag))
        if len(bucket) * model.dt >= record_every - 1e-9:
            run.times.append(sim.t)
            run.load.append(sum(b[0] for b in bucket) / len(bucket))
            run.capacity.append(sum(b[1] for b in bucket) / len(bucket))
            run.lag.append(max(b[2] for b in bucket))
            run.parallelism.append(running)
            bucket.clear()
    if change is not None:
        run.lag_ok_after = 0.0 if lag_high_until is None else lag_high_until - change
    run.final_parallelism = sim.current
    run.records_arrived = sim.arrived
    run.records_processed = sim.processed_total
    run.final_lag = float(sim.lag_kg.sum())
    return run


# -- the benchmark -------------------------------------------------------------------------------


def policies() -> list[tuple[Policy, JobModel]]:
    """keyshift and the Flink rules, each on its own rescale model (fresh state)."""
    from benchmarks.flink_autoscaler import FlinkAutoscaler

    return [(KeyshiftPolicy(), KEYSHIFT_MODEL), (FlinkAutoscaler(), FLINK_MODEL)]


def run_all(traces: Sequence[Trace]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for trace in traces:
        out[trace.name] = [simulate(trace, policy, model) for policy, model in policies()]
        for r in out[trace.name]:
            s = r.summary()
            print(
                f"{trace.name:>6} {r.policy:>8}: {s['actions']} actions "
                f"({s['scale_ups']} up, {s['scale_downs']} down), max lag "
                f"{s['max_lag_records']:,} ({s['max_lag_seconds']} s), enough after "
                f"{s['enough_after_seconds']}, lag ok after {s['lag_ok_after_seconds']}, "
                f"{s['worker_hours']} worker-h, final {s['final_parallelism']}"
            )
    return out


def _time_unit(trace: Trace) -> float:
    """Seconds per unit of the plot's time axis: hours for long traces, else minutes."""
    return 3600.0 if trace.duration > 4 * 3600 else 60.0


def plot(traces: Sequence[Trace], runs: dict[str, list[Run]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"keyshift": "tab:blue", "flink": "tab:red"}
    fig, grid = plt.subplots(len(traces), 3, figsize=(18, 4.2 * len(traces)), squeeze=False)
    for row, trace in zip(grid, traces, strict=True):
        unit = _time_unit(trace)
        axis = "hours" if unit == 3600 else "minutes"
        first = runs[trace.name][0]
        ax = row[0]
        ax.plot([t / unit for t in first.times], first.load, color="black", lw=1, label="load")
        for r in runs[trace.name]:
            ax.step([t / unit for t in r.times], r.capacity, where="post", color=colors[r.policy],
                    lw=1.2, alpha=0.8, label=f"capacity, {r.policy}")  # fmt: skip
        ax.set(title=f"{trace.title}: load and capacity", xlabel=axis, ylabel="records/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        ax = row[1]
        for r in runs[trace.name]:
            legend = f"lag, {r.policy} (max {r.max_lag_seconds:,.0f} s of input)"
            ax.plot([t / unit for t in r.times], [x / 1e6 for x in r.lag],
                    color=colors[r.policy], lw=1.2, label=legend)  # fmt: skip
        ax.set(title="lag", xlabel=axis, ylabel="million records")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        ax = row[2]
        for r in runs[trace.name]:
            ax.step([t / unit for t in r.times], r.parallelism, where="post",
                    color=colors[r.policy], lw=1.5,
                    label=f"{r.policy}: {len(r.actions)} rescales")  # fmt: skip
        ax.set(title="parallelism (workers running)", xlabel=axis, ylabel="workers")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(
        "Autoscaler simulation: keyshift decide (rescale = ~1 s pause of moved key groups) vs "
        "Flink autoscaler defaults (rescale = 5 min restart)"
    )
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.98))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _seconds(x: float | None) -> str:
    if x is None:
        return "never"
    if x >= 4 * 3600:
        return f"{x / 3600:,.1f}".removesuffix(".0") + " h"
    return f"{x:,.0f} s" if x < 600 else f"{x / 60:,.1f}".removesuffix(".0") + " min"


def results_markdown(data: dict[str, Any]) -> str:
    rows = []
    for trace in data["traces"]:
        for s in data["runs"][trace["name"]]:
            enough = _seconds(s["enough_after_seconds"]) if trace["rises"] else "-"
            lag_ok = "-" if trace["change_at"] is None else _seconds(s["lag_ok_after_seconds"])
            when = ", ".join(f"{_seconds(a['t'])}: {a['from_']}→{a['to']}" for a in s["action_log"])
            rows.append(
                f"| {trace['title']}, {_seconds(trace['duration_seconds'])} | {s['policy']} | "
                f"{s['actions']} ({s['scale_ups']} up, {s['scale_downs']} down) | "
                f"{when or '-'} | {enough} | {lag_ok} | {s['max_lag_records']:,} | "
                f"{s['max_lag_seconds']:,.0f} s | {s['worker_hours']:,.1f} | "
                f"{s['final_parallelism']} |"
            )
    m = data["model"]
    return (
        "`python -m benchmarks.autoscaler_sim` — a simulated job (no processes): "
        f"{m['key_groups']} key groups, {m['worker_capacity']:,.0f} records/s per worker, "
        "even load over key groups, 1 s steps; both policies see the same `LoadSample`s "
        "(window rates, lag and its trend, per-worker processed rate and busy ratio) and start "
        "at the same parallelism after a warm-up at the initial load. keyshift: "
        "`keyshift.controller.autoscaling.decision.decide` with the `AutoscalerSpec` defaults "
        "(target 0.7 +- 0.2, catch-up 120 s, window 60 s, every 15 s, cooldown 30 s, scale-down "
        "stabilisation 300 s); a rescale starts new workers 5 s before the handoff and "
        "pauses the moved key groups for 1 s. Flink: `benchmarks/flink_autoscaler.py`, the "
        "Kubernetes operator autoscaler's default rules (15 min metrics window, 5 min "
        "stabilisation, utilisation 0.7 +- 0.3, 1 h scale-down interval, catch-up 30 min, "
        "evaluation every 60 s, parallelism aligned to divisors of the max parallelism); a "
        "rescale is a 5 min restart during which nothing is processed.\n\n"
        "The step and the drop come 5 min into their traces; *when* counts from the start. "
        "*Enough* = capacity covers the new load at <= 90% busy; *lag ok* = lag stays under "
        "10 s of input from then on (both from the load change); *max lag* in records and in "
        "seconds of input; *worker-hours* = the cost.\n\n"
        "| trace, length | policy | rescales | when: workers | enough after "
        "| lag ok after | max lag (records) | max lag (s of input) | worker-hours "
        "| final parallelism |\n"
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\n"
        "![autoscaler simulation](autoscaler_sim.png)\n\n"
        "The Flink figures are for its default rules on this model, not a measured Flink job: "
        "the restart time (5 min) is Flink's own default estimate, and a job with little "
        "state restarts faster. keyshift's figures depend on the short window it can afford "
        "because a rescale pauses only the moved key groups, briefly.\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    traces = default_traces()
    runs = run_all(traces)
    data = {
        "model": asdict(KEYSHIFT_MODEL) | {"flink_restart_seconds": FLINK_MODEL.pause_seconds},
        "traces": [
            {
                "name": t.name,
                "title": t.title,
                "duration_seconds": t.duration,
                "change_at": t.change_at,
                "rises": t.rises,
                "initial_parallelism": t.initial_parallelism,
            }
            for t in traces
        ],
        "runs": {name: [r.summary() for r in rs] for name, rs in runs.items()},
        "series": {
            name: {
                r.policy: {
                    "t": [round(x) for x in r.times],
                    "load": [round(x) for x in r.load],
                    "capacity": [round(x) for x in r.capacity],
                    "lag": [round(x) for x in r.lag],
                    "parallelism": r.parallelism,
                }
                for r in rs
            }
            for name, rs in runs.items()
        },
        "python": platform.python_version(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.output}")
    if not args.no_plot:
        plot(traces, runs, PLOT)
        print(f"wrote {PLOT}")
    section = results_markdown(data)
    if not args.no_results_md:
        from benchmarks.results_md import replace_section

        replace_section("Autoscaler (simulation)", section)
        print("updated benchmarks/RESULTS.md")
    else:
        print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
