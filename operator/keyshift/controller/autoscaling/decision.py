"""The autoscaler's decision: a pure function of a metrics window, the job's
scaling history and its spec (docs/design.md, "The autoscaler").

``decide`` reads no clock and does no I/O: the caller passes the time, the
current parallelism, whether a rescale or a failover is running, and the
``ScalingHistory`` it persisted after the previous call; it gets back a
``Decision`` (what to do and why, with the numbers) and the history to persist.

How the numbers are made (``LoadSample`` is a window of ``metricsWindowSeconds``):

- **Capacity of a worker** (records/s it could process when busy all the
  time) = its processed rate / its busy ratio.  Workers busy less than
  ``MIN_BUSY_RATIO`` of the window are left out (a ratio of two tiny numbers
  says nothing); if every worker is that idle, the pooled ratio
  sum(processed) / sum(busy) is used.  *While catching up* the busy ratio can
  overstate capacity: a worker that had a backlog for the whole window
  (the job's lag above one second of input at both ends of the window, and
  the worker's own lag above one second of its rate) was processing flat out,
  so its observed processed rate *is* its capacity, and a busy ratio below 1
  means the busy time missed part of the cost (the runtime's busy time leaves
  out store round trips and commits).  For such a worker the observed rate is
  used when processed / busy exceeds it by more than ``OBSERVED_SWITCH``
  (Flink's ``observed-true-processing-rate.switch-threshold``), unless a
  rescale happened inside the window: new workers idle until the handoff and
  moved key groups pause, so a lower observed rate there is not a capacity
  limit.  (processed / busy is never below the observed rate, so the rule only
  ever lowers an estimate.)  The job's per-worker capacity is the mean over
  the workers measured.
- **Utilisation** = mean over the workers of processed / capacity: the busy
  ratio, except that a backlogged worker counts as fully used.  **Demand** =
  arrival rate / (per-worker capacity x workers).
- **Required capacity** = arrival rate / targetUtilization + lag / catchUpSeconds.
- **Desired parallelism** = ceil(required / per-worker capacity), clamped to
  ``[minParallelism, min(maxParallelism, keyGroups)]`` and by
  ``maxScaleUpFactor`` (at most ``floor(current * factor)``) /
  ``maxScaleDownFactor`` (at least ``ceil(current * (1 - factor))``), then
  aligned with :func:`align` (a parallelism whose largest key range is no
  smaller than a lower parallelism's adds workers without adding capacity).

When it acts:

- **No decision** while a failover runs, a rescale runs, within
  ``cooldownSeconds`` of the last rescale (counted from the last call that saw
  the rescale running), or while the window is incomplete or lacks an input
  (never read as zero load).
- **Scale up** at once when the desired parallelism is above the current one
  and either utilisation *and* demand are above ``target + boundary``
  (``high_utilization``; high utilisation with a demand inside the band is
  ``catching_up``: workers working off lag are busy all the time whatever
  their number) or the lag keeps growing (``lag_growing``: above one second of
  input at both ends of the window and higher at the end; if the desired
  parallelism is not above the current one, the bottleneck is a worker or a
  key group, and the decision says so).  A scale-up clears the pending
  scale-down recommendations.  Busy ratios rise only as fast as the window
  fills, so a step in load is acted on once the window's average utilisation
  crosses the band, when its average arrival rate plus the lag to catch up is
  close to the new load; after a scale-up the new workers leave the window
  incomplete for one window, so the next decision sees the new parallelism.
- **Scale down** only when utilisation and demand are below
  ``target - boundary`` and every recommendation made in the last
  ``scaleDownStabilizationSeconds`` is below the current parallelism, the
  lower recommendations having started at least that long ago.  It goes to
  the highest recommendation *whose metrics window lies inside the
  stabilisation window* (made at least ``metricsWindowSeconds`` after its
  start): together those windows cover every second of the stabilisation
  window, while the recommendations made just after a load drop average in
  load from before it.  A call inside the dead band recommends the
  current parallelism, so it restarts the wait.
- **Ineffective scale-up**: once a complete window lies after a scale-up, if
  the lag stayed (above one second of input at both ends of that window, so
  the workers had work all along) and processed throughput rose by less than
  10% of what the scale-up expected (the new parallelism times the per-worker
  capacity measured before it), further scale-ups are ``blocked``.  The block
  lifts when load drops (a complete window without a scale-up trigger) or the
  parallelism changes by other means than this autoscaler (a manual scale, a
  rolled-back rescale): ``decide`` notices that the current parallelism is not
  the one it last chose or saw.

**Scale to zero** (``minParallelism: 0``): once complete windows have shown no
arrivals and no lag for ``scaleToZeroAfter`` (counted from the start of the first
such window), the job scales to 0 (``idle``): every key group is committed and
released, and every worker stops. Otherwise ``minParallelism`` 0 bounds like 1.
While the job is at 0 there is no worker to measure: :func:`decide_wake` looks at an
:class:`~keyshift.controller.autoscaling.metrics.base.IdleSample` instead and wakes
the job for input waiting (``input_waiting``: enough workers for the arrival rate since
the previous check at ``targetUtilization`` plus the backlog worked off within
``catchUpSeconds``, at the per-worker capacity last measured, at least one) or
for a due timer (``timer_due``: ``minParallelism``'s floor of one worker).

In ``recommend`` mode decisions are made the same way, but the history does
not assume they were applied (no cooldown, no ineffectiveness check).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import msgspec

from keyshift.api.spec import AutoscalerSpec
from keyshift.controller.autoscaling.metrics.base import (
    IdleSample,
    LoadSample,
    ScalingMetric,
    WorkerLoad,
)

__all__ = [
    "Action",
    "Decision",
    "Reason",
    "Recommendation",
    "ScaleUpRecord",
    "ScalingHistory",
    "align",
    "align_down",
    "continues_sleep",
    "decide",
    "decide_wake",
    "explain",
    "max_range",
]

Action = Literal["none", "scale_up", "scale_down", "blocked"]
Reason = Literal[
    "metrics_incomplete",
    "rescale_in_progress",
    "failing_over",
    "cooldown",
    "within_band",
    "catching_up",
    "high_utilization",
    "lag_growing",
    "low_utilization",
    "stabilizing",
    "at_max",
    "at_min",
    "ineffective_scale_up",
    "idle",
    "input_waiting",
    "timer_due",
]

MIN_BUSY_RATIO = 0.05
"""Workers busy less than this share of the window do not measure capacity."""
OBSERVED_SWITCH = 0.15
"""Use the observed rate of a backlogged worker when processed / busy exceeds it by more."""
LAG_SECONDS = 1.0
"""Lag above this many seconds of input counts as a backlog."""
EFFECTIVENESS_THRESHOLD = 0.1
"""A scale-up that achieved less than this share of its expected throughput gain is ineffective."""
DECISIONS_KEPT = 20
"""Decisions kept in ``ScalingHistory.decisions``."""


# -- the records ---------------------------------------------------------------------


InputValue = float | int | str | None


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """One evaluation: what the autoscaler wants and why. Stored as JSON in status.

    ``desired`` differs from ``current`` only for ``scale_up`` and ``scale_down``;
    what other outcomes would have chosen is in ``inputs["recommended"]``.
    """

    at: float
    current: int
    desired: int
    action: Action
    reason: Reason
    message: str
    inputs: dict[str, InputValue] = msgspec.field(default_factory=dict)


class Recommendation(msgspec.Struct, frozen=True, array_like=True):
    """The parallelism one evaluation recommended (``[at, desired]`` in JSON)."""

    at: float
    desired: int


class ScaleUpRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The last scale-up, kept until its effect has been judged."""

    from_: int = msgspec.field(name="from")
    to: int
    expected_rate: float
    """Processed records/s expected after it, with work for every worker."""
    rate_before: float
    """Processed records/s in the window it was decided on."""
    at: float


class ScalingHistory(msgspec.Struct, frozen=True, kw_only=True):
    """What ``decide`` remembers between calls; the caller persists it (JSON)."""

    recommendations: tuple[Recommendation, ...] = ()
    """Recommendations since the newest one at least a stabilisation window old."""
    last_rescale_at: float | None = None
    last_scale_up: ScaleUpRecord | None = None
    scale_up_blocked: str | None = None
    """Why scale-ups are blocked, or None."""
    parallelism: int | None = None
    """The parallelism the autoscaler last saw or chose; another one means a manual change."""
    decisions: tuple[Decision, ...] = ()
    """The last ``DECISIONS_KEPT`` decisions, oldest first."""
    idle_since: float | None = None
    """Since when complete windows have shown no input and no lag (None: not idle)."""
    capacity: float | None = None
    """The last per-worker capacity measured (records/s): it sizes a wake from zero."""


# -- alignment --------------------------------------------------------------------


def max_range(parallelism: int, key_groups: int) -> int:
    """The largest key range of ``parallelism`` workers: ``ceil(key_groups / parallelism)``."""
    return -(-key_groups // parallelism)


def align(desired: int, key_groups: int) -> int:
    """The smallest parallelism >= ``desired`` whose largest key range is strictly
    smaller than that of every lower parallelism (capped at ``key_groups``).

    With ``r = max_range(desired)``, the smallest parallelism with ranges of at
    most ``r`` is ``ceil(K / r)``; if that is ``desired`` itself, it is aligned,
    otherwise a lower parallelism already has ranges of ``r`` and the answer is
    the smallest one with ranges of at most ``r - 1``.
    """
    p = max(1, min(desired, key_groups))
    r = max_range(p, key_groups)
    if -(-key_groups // r) == p:  # no lower parallelism has ranges of r (r == 1: p == K)
        return p
    return -(-key_groups // (r - 1))


def align_down(parallelism: int, key_groups: int) -> int:
    """The largest aligned parallelism <= ``parallelism``: the smallest one with the same
    largest key range."""
    p = max(1, min(parallelism, key_groups))
    return -(-key_groups // max_range(p, key_groups))


# -- reading the window -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Estimate:
    """The numbers a decision is made from."""

    arrival_rate: float
    processed_rate: float
    lag: int
    lag_trend: float
    lag_at_start: float
    backlogged: bool
    lag_growing: bool
    per_worker_capacity: float | None
    capacity_rule: str
    utilization: float
    demand: float
    """The utilisation the arrival rate alone causes: arrival / (capacity x workers)."""
    required_capacity: float
    catch_up_rate: float
    raw_desired: int


def missing_inputs(window: LoadSample, current: int) -> str | None:
    """Why the window cannot be decided on, or None if it is complete."""
    if not window.complete:
        return "; ".join(window.missing) or "the sample is marked incomplete"
    absent = [
        name
        for name, value in (
            ("arrival rate", window.arrival_rate),
            ("processed rate", window.processed_rate),
            ("lag", window.lag),
            ("lag trend", window.lag_trend),
        )
        if value is None
    ]
    if absent:
        return "no " + ", no ".join(absent)
    if window.workers_expected != current:
        return f"the sample covers {window.workers_expected} workers, the job runs {current}"
    if not window.per_worker:
        return "no worker reported"
    if any(w.processed_rate is None or w.busy_ratio is None for w in window.per_worker):
        return "a worker has no processed rate or busy ratio"
    return None


def lag_threshold(arrival_rate: float) -> float:
    """Lag (records) above which the job counts as having a backlog: one second of input."""
    return max(arrival_rate * LAG_SECONDS, 1.0)


def worker_capacity(worker: WorkerLoad, flat_out: bool) -> tuple[float, str] | None:
    """The records/s ``worker`` could process, and how it was measured ("busy" or
    "observed"); None if it was too idle to tell.

    ``flat_out``: the job had a backlog for the whole window and no rescale
    happened in it, so a worker with lag of its own was processing all it could.
    """
    processed, busy = worker.processed_rate, worker.busy_ratio
    if processed is None or busy is None or busy < MIN_BUSY_RATIO or processed <= 0:
        return None
    by_busy = processed / busy
    if (
        flat_out
        and worker.lag >= lag_threshold(processed)
        and by_busy > processed * (1 + OBSERVED_SWITCH)
    ):
        return processed, "observed"
    return by_busy, "busy"


def job_capacity(workers: Sequence[WorkerLoad], flat_out: bool) -> tuple[float | None, str, float]:
    """Per-worker capacity (mean over measured workers), the rule used, and utilisation."""
    measured = [(w, worker_capacity(w, flat_out)) for w in workers]
    known = [(w, m) for w, m in measured if m is not None]
    utilizations = [
        (w.processed_rate or 0.0) / m[0] if m is not None else (w.busy_ratio or 0.0)
        for w, m in measured
    ]
    utilization = sum(utilizations) / len(utilizations) if utilizations else 0.0
    if known:
        rules = sorted({m[1] for _, m in known})
        return sum(m[0] for _, m in known) / len(known), "+".join(rules), utilization
    busy = sum(w.busy_ratio or 0.0 for w in workers)
    processed = sum(w.processed_rate or 0.0 for w in workers)
    if busy > 0 and processed > 0:
        return processed / busy, "pooled", utilization
    return None, "none", utilization


def estimate(window: LoadSample, spec: AutoscalerSpec, rescaled_in_window: bool) -> Estimate:
    """The decision's numbers from a complete window (see the module docstring)."""
    assert window.arrival_rate is not None and window.processed_rate is not None
    assert window.lag is not None and window.lag_trend is not None
    arrival, lag, trend = window.arrival_rate, window.lag, window.lag_trend
    lag_at_start = max(0.0, lag - trend * window.window_seconds)
    threshold = lag_threshold(arrival)
    backlogged = lag >= threshold and lag_at_start >= threshold
    capacity, rule, utilization = job_capacity(
        window.per_worker, backlogged and not rescaled_in_window
    )
    workers = max(window.workers_expected, 1)
    demand = arrival / (capacity * workers) if capacity else 0.0
    catch_up = lag / spec.catch_up_seconds
    required = arrival / spec.target_utilization + catch_up
    if required <= 0:
        raw = 0
    elif capacity is None:
        raw = -1  # unknown: the caller reports it
    else:
        raw = math.ceil(required / capacity - 1e-9)
    return Estimate(
        arrival_rate=arrival,
        processed_rate=window.processed_rate,
        lag=lag,
        lag_trend=trend,
        lag_at_start=lag_at_start,
        backlogged=backlogged,
        lag_growing=backlogged and trend > 0,
        per_worker_capacity=capacity,
        capacity_rule=rule,
        utilization=utilization,
        demand=demand,
        required_capacity=required,
        catch_up_rate=catch_up,
        raw_desired=raw,
    )


# -- choosing a parallelism -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A parallelism to move to, with what shaped it."""

    parallelism: int
    notes: tuple[str, ...]
    limited: bool
    """A bound (min/max, key groups, factor) stopped it short of the raw desire."""


def limits(spec: AutoscalerSpec, key_groups: int) -> tuple[int, int]:
    """The lowest and highest parallelism the spec allows for ``key_groups`` (a
    ``minParallelism`` of 0 bounds like 1: only the idle rule scales to zero)."""
    high = min(spec.max_parallelism or key_groups, key_groups)
    return min(max(1, spec.min_parallelism), high), high


def scale_up_target(raw: int, current: int, spec: AutoscalerSpec, key_groups: int) -> Target:
    """The aligned parallelism to scale up to for a raw desire above ``current``
    (``current`` itself when a bound leaves no aligned step up)."""
    low, high = limits(spec, key_groups)
    cap, cap_note = (
        high,
        (f"maxParallelism {high}" if high < key_groups else f"{key_groups} key groups"),
    )
    if spec.max_scale_up_factor is not None:
        by_factor = max(current + 1, math.floor(current * spec.max_scale_up_factor))
        if by_factor < cap:
            cap, cap_note = by_factor, f"maxScaleUpFactor {spec.max_scale_up_factor:g}"
    want = max(raw, low)
    notes: list[str] = []
    limited = want > cap
    p = min(want, cap)
    if limited:
        notes.append(f"limited to {cap} by {cap_note}")
    aligned = align(p, key_groups)
    if aligned > cap:
        aligned = align_down(cap, key_groups)
        limited = True
    if aligned != p:
        notes.append(f"aligned from {p} to {aligned} for {key_groups} key groups")
    if aligned <= current:
        return Target(current, tuple(notes), limited=True)
    return Target(aligned, tuple(notes), limited)


def scale_down_target(raw: int, current: int, spec: AutoscalerSpec, key_groups: int) -> Target:
    """The aligned parallelism to scale down to for a raw desire below ``current``
    (``current`` itself when a bound or the alignment leaves no step down)."""
    low, high = limits(spec, key_groups)
    floor, floor_note = low, f"minParallelism {low}"
    if spec.max_scale_down_factor is not None:
        by_factor = max(1, math.ceil(current * (1 - spec.max_scale_down_factor)))
        if by_factor > floor:
            floor, floor_note = by_factor, f"maxScaleDownFactor {spec.max_scale_down_factor:g}"
    notes: list[str] = []
    limited = raw < floor
    p = min(max(raw, floor), high)
    if limited:
        notes.append(f"limited to {p} by {floor_note}")
    aligned = align(p, key_groups)
    if aligned != p:
        notes.append(f"aligned from {p} to {aligned} for {key_groups} key groups")
    if aligned >= current:
        return Target(current, tuple(notes), limited)
    return Target(aligned, tuple(notes), limited)


def scale_up_trigger(est: Estimate, spec: AutoscalerSpec) -> Reason | None:
    """``high_utilization`` or ``lag_growing`` if the load calls for more workers.

    High utilisation counts only if the demand is high too: workers working off
    lag are busy all the time whatever their number.
    """
    high = spec.target_utilization + spec.utilization_boundary
    if est.utilization > high and est.demand > high:
        return "high_utilization"
    if est.lag_growing:
        return "lag_growing"
    return None


def stabilized_scale_down(
    recommendations: Sequence[Recommendation],
    current: int,
    now: float,
    stabilization: float,
    metrics_window: float,
) -> tuple[int | None, float | None]:
    """The scale-down target once the stabilisation window is satisfied, else None;
    and since when the recommendations have been lower (None if the newest is not).

    Satisfied when the newest recommendation at least ``stabilization`` old and
    every later one are below ``current``; the target is the highest of those
    made at least ``metrics_window`` after the window's start (their metrics lie
    inside it), or the newest if there is none.
    """
    since: float | None = None
    for r in reversed(recommendations):
        if r.desired >= current:
            break
        since = r.at
    if since is None or since > now - stabilization:
        return None, since
    inside = [r.desired for r in recommendations if r.at >= now - stabilization + metrics_window]
    return max(inside or [recommendations[-1].desired]), since


def add_recommendation(
    recommendations: Sequence[Recommendation], at: float, desired: int, stabilization: float
) -> tuple[Recommendation, ...]:
    """``recommendations`` plus ``(at, desired)``, without those older than the newest
    one at least a stabilisation window old."""
    out = [*recommendations, Recommendation(at, desired)]
    anchor = 0
    for i, r in enumerate(out):
        if r.at <= at - stabilization:
            anchor = i
    return tuple(out[anchor:])


def judge_scale_up(
    record: ScaleUpRecord, window: LoadSample, est: Estimate
) -> tuple[ScaleUpRecord | None, str | None]:
    """Judge the last scale-up once a complete window lies after it.

    Returns the record if it cannot be judged yet (else None) and, if it was
    ineffective, why (the text of the block).
    """
    if window.at - window.window_seconds < record.at:
        return record, None
    if not est.backlogged:
        return None, None  # the lag was worked off: throughput followed the demand
    expected = record.expected_rate - record.rate_before
    achieved = est.processed_rate - record.rate_before
    if expected <= 0 or achieved >= EFFECTIVENESS_THRESHOLD * expected:
        return None, None
    share = max(0.0, achieved) / expected
    return None, (
        f"the scale-up from {record.from_} to {record.to} workers raised throughput by "
        f"{_rate(max(0.0, achieved))} of the {_rate(expected)} expected ({share:.0%}, "
        f"under {EFFECTIVENESS_THRESHOLD:.0%}) while {_count(est.lag)} records of lag "
        "remained: more workers do not help (a bottleneck outside the workers?); "
        "scale-ups stay blocked until the load drops back or the parallelism is changed "
        "by hand"
    )


# -- words ----------------------------------------------------------------------------------


def _rate(x: float) -> str:
    """``12,000 rec/s``."""
    return f"{x:,.0f} rec/s"


def _count(x: float) -> str:
    """``30,000``."""
    return f"{x:,.0f}"


def _workers(n: int) -> str:
    """``1 worker``, ``3 workers``."""
    return f"{n} worker" if n == 1 else f"{n} workers"


def _pct(x: float) -> str:
    """``70%``."""
    return f"{x:.0%}"


def sizing_text(est: Estimate, spec: AutoscalerSpec, target: Target | None) -> str:
    """How the desired parallelism follows from the numbers, in one clause."""
    text = (
        f"arrival {_rate(est.arrival_rate)} needs "
        f"{_rate(est.arrival_rate / spec.target_utilization)} at "
        f"{_pct(spec.target_utilization)} utilisation"
    )
    if est.lag > 0:
        text += (
            f" plus {_rate(est.catch_up_rate)} to catch up {_count(est.lag)} records of lag "
            f"in {spec.catch_up_seconds:g} s"
        )
    if est.per_worker_capacity is not None:
        how = {"observed": " (observed while catching up)", "pooled": " (pooled)"}
        text += (
            f"; {_rate(est.per_worker_capacity)} per worker"
            f"{how.get(est.capacity_rule, '')} -> {_workers(max(est.raw_desired, 0))}"
        )
    if target is not None and target.notes:
        text += " (" + "; ".join(target.notes) + ")"
    return text


def _inputs(
    window: LoadSample, spec: AutoscalerSpec, est: Estimate | None, recommended: int | None
) -> dict[str, InputValue]:
    """The numbers of a decision, for status and ``keyshift explain``."""
    inputs: dict[str, InputValue] = {
        "window_seconds": round(window.window_seconds, 3),
        "workers_reporting": window.workers_reporting,
        "workers_expected": window.workers_expected,
    }
    if est is None:
        inputs.update({
            ScalingMetric.ARRIVAL_RATE: window.arrival_rate,
            ScalingMetric.PROCESSED_RATE: window.processed_rate,
            ScalingMetric.LAG: window.lag,
            ScalingMetric.LAG_TREND: window.lag_trend,
        })  # fmt: skip
        if window.missing:
            inputs["missing"] = "; ".join(window.missing)
        return inputs
    inputs.update({
        ScalingMetric.ARRIVAL_RATE: round(est.arrival_rate, 3),
        ScalingMetric.PROCESSED_RATE: round(est.processed_rate, 3),
        ScalingMetric.LAG: est.lag,
        ScalingMetric.LAG_TREND: round(est.lag_trend, 3),
    })  # fmt: skip
    inputs.update(
        lag_at_window_start=round(est.lag_at_start, 1),
        per_worker_capacity=(
            None if est.per_worker_capacity is None else round(est.per_worker_capacity, 3)
        ),
        capacity_rule=est.capacity_rule,
        utilization=round(est.utilization, 4),
        demand=round(est.demand, 4),
        target_utilization=spec.target_utilization,
        utilization_band_low=round(spec.target_utilization - spec.utilization_boundary, 4),
        utilization_band_high=round(spec.target_utilization + spec.utilization_boundary, 4),
        required_capacity=round(est.required_capacity, 3),
        catch_up_rate=round(est.catch_up_rate, 3),
        raw_desired=est.raw_desired,
        recommended=recommended,
    )
    return inputs


# -- the decision -------------------------------------------------------------------------------


def note_parallelism(
    history: ScalingHistory, current: int, now: float, rescaling: bool
) -> tuple[ScalingHistory, str | None]:
    """Fold what the caller observed into the history: a running rescale restarts the
    cooldown; a parallelism the autoscaler did not choose resets the recommendations,
    the scale-up judgement and any block (returns a note saying so)."""
    if rescaling:
        return msgspec.structs.replace(history, last_rescale_at=now), None
    if history.parallelism is None:
        return msgspec.structs.replace(history, parallelism=current), None
    if history.parallelism == current:
        return history, None
    note = f"parallelism changed from {history.parallelism} to {current} outside the autoscaler"
    if history.scale_up_blocked is not None:
        note += "; scale-ups are unblocked"
    return (
        msgspec.structs.replace(
            history,
            parallelism=current,
            recommendations=(),
            last_scale_up=None,
            scale_up_blocked=None,
            last_rescale_at=now,
        ),
        note,
    )


def decide(
    window: LoadSample,
    history: ScalingHistory,
    spec: AutoscalerSpec,
    *,
    current: int,
    key_groups: int,
    now: float,
    rescaling: bool,
    failing_over: bool,
) -> tuple[Decision, ScalingHistory]:
    """Decide the job's parallelism from ``window``; return the decision and the new history.

    ``current`` is the job's parallelism, ``rescaling``/``failing_over`` whether a
    rescale or a failover is running.  See the module docstring for the rules.
    """
    history, note = note_parallelism(history, current, now, rescaling)
    decision, history = _decide(
        window,
        history,
        spec,
        current=current,
        key_groups=key_groups,
        now=now,
        rescaling=rescaling,
        failing_over=failing_over,
    )
    if note is not None:
        decision = msgspec.structs.replace(decision, message=f"{decision.message} ({note})")
    return decision, remember(history, decision, spec)


def remember(history: ScalingHistory, decision: Decision, spec: AutoscalerSpec) -> ScalingHistory:
    """The history after ``decision``: kept in the last decisions, and, for an action in
    ``scale`` mode, the new parallelism and the rescale's time."""
    acted = decision.action in ("scale_up", "scale_down") and spec.mode == "scale"
    return msgspec.structs.replace(
        history,
        decisions=(*history.decisions, decision)[-DECISIONS_KEPT:],
        parallelism=decision.desired if acted else decision.current,
        last_rescale_at=decision.at if acted else history.last_rescale_at,
    )


def _decide(
    window: LoadSample,
    history: ScalingHistory,
    spec: AutoscalerSpec,
    *,
    current: int,
    key_groups: int,
    now: float,
    rescaling: bool,
    failing_over: bool,
) -> tuple[Decision, ScalingHistory]:
    """``decide`` after the history has taken in the observed parallelism: the
    guards (failover, rescale, cooldown, incomplete metrics), the judgement of
    the last scale-up, then scale up, scale down or stay."""

    def none(reason: Reason, message: str, inputs: dict[str, InputValue]) -> Decision:
        return Decision(
            at=now,
            current=current,
            desired=current,
            action="none",
            reason=reason,
            message=message,
            inputs=inputs,
        )

    bare = _inputs(window, spec, None, None)
    if failing_over:
        return none("failing_over", "no decision while workers fail over", bare), history
    if rescaling:
        return none("rescale_in_progress", "no decision while a rescale runs", bare), history
    if (
        history.last_rescale_at is not None
        and now - history.last_rescale_at < spec.cooldown_seconds
    ):
        left = spec.cooldown_seconds - (now - history.last_rescale_at)
        message = (
            f"no decision within {spec.cooldown_seconds:g} s of the last rescale "
            f"({left:.0f} s left)"
        )
        return none("cooldown", message, bare), history
    missing = missing_inputs(window, current)
    if missing is not None:
        message = f"no decision on incomplete metrics (not read as zero load): {missing}"
        return none("metrics_incomplete", message, bare), history
    last = history.last_rescale_at
    est = estimate(window, spec, last is not None and last > window.at - window.window_seconds)
    if est.raw_desired < 0:
        message = (
            "no decision: no worker was busy enough to measure its processing rate "
            f"while {_rate(est.arrival_rate)} arrived"
        )
        return none("metrics_incomplete", message, _inputs(window, spec, est, None)), history

    history = note_idle(history, window, est)
    if (
        spec.min_parallelism == 0
        and history.idle_since is not None
        and now - history.idle_since >= spec.scale_to_zero_after
    ):
        return _scale_to_zero(history, spec, current, now, _inputs(window, spec, est, 0))

    if spec.mode == "scale" and history.last_scale_up is not None:
        pending, block = judge_scale_up(history.last_scale_up, window, est)
        history = msgspec.structs.replace(history, last_scale_up=pending)
        if block is not None:
            history = msgspec.structs.replace(history, scale_up_blocked=block)

    trigger = scale_up_trigger(est, spec)
    if trigger is not None:
        return _scale_up(trigger, est, history, spec, current, key_groups, now, window)
    unblock = ""
    if history.scale_up_blocked is not None:
        history = msgspec.structs.replace(history, scale_up_blocked=None)
        unblock = "; the scale-up block is lifted (the load is back down)"
    decision, history = _no_scale_up(est, history, spec, current, key_groups, now, window)
    if unblock:
        decision = msgspec.structs.replace(decision, message=decision.message + unblock)
    return decision, history


def note_idle(history: ScalingHistory, window: LoadSample, est: Estimate) -> ScalingHistory:
    """Fold a complete window into the idle clock and the capacity last measured: a window
    without arrivals and lag keeps (or starts, at its own start) the idle time; any input
    stops it."""
    idle = est.arrival_rate <= 0 and est.lag <= 0
    since = history.idle_since
    if not idle:
        since = None
    elif since is None:
        since = window.at - window.window_seconds
    capacity = est.per_worker_capacity or history.capacity
    if since == history.idle_since and capacity == history.capacity:
        return history
    return msgspec.structs.replace(history, idle_since=since, capacity=capacity)


def _scale_to_zero(
    history: ScalingHistory,
    spec: AutoscalerSpec,
    current: int,
    now: float,
    inputs: dict[str, InputValue],
) -> tuple[Decision, ScalingHistory]:
    """The input has been idle for ``scaleToZeroAfter``: scale to 0."""
    assert history.idle_since is not None
    idle_for = now - history.idle_since
    inputs["idle_seconds"] = round(idle_for, 1)
    inputs["scale_to_zero_after"] = spec.scale_to_zero_after
    decision = Decision(
        at=now,
        current=current,
        desired=0,
        action="scale_down",
        reason="idle",
        message=(
            f"no input and no lag for {idle_for:.0f} s (scaleToZeroAfter "
            f"{spec.scale_to_zero_after:g} s): scaling from {current} to zero; the state stays "
            "in the store, and the job wakes when input arrives or a timer is due"
        ),
        inputs=inputs,
    )
    history = msgspec.structs.replace(
        history, recommendations=(), last_scale_up=None, idle_since=None
    )
    return decision, history


def wake_parallelism(
    backlog: int,
    arrival_rate: float | None,
    spec: AutoscalerSpec,
    key_groups: int,
    capacity: float | None,
) -> int:
    """The parallelism a wake needs, as :func:`decide` sizes one: the arrival rate at
    ``targetUtilization`` plus the backlog worked off within ``catchUpSeconds``, at
    ``capacity`` records/s per worker (one worker if the capacity is unknown); aligned,
    within the spec's bounds, at least one."""
    low, high = limits(spec, key_groups)
    required = (arrival_rate or 0.0) / spec.target_utilization + backlog / spec.catch_up_seconds
    raw = 1 if not capacity else math.ceil(required / capacity - 1e-9)
    p = min(max(raw, low), high)
    aligned = align(p, key_groups)
    return aligned if aligned <= high else align_down(high, key_groups)


def decide_wake(
    sample: IdleSample,
    history: ScalingHistory,
    spec: AutoscalerSpec,
    *,
    key_groups: int,
    now: float,
) -> tuple[Decision, ScalingHistory]:
    """The decision while the job is scaled to zero: wake for input waiting or a due
    timer, else stay at zero. Pure, like :func:`decide`."""
    inputs: dict[str, InputValue] = {
        "backlog": sample.backlog,
        "arrival_rate": None if sample.arrival_rate is None else round(sample.arrival_rate, 3),
        "next_timer_at": sample.next_timer_at,
        "per_worker_capacity": None if history.capacity is None else round(history.capacity, 3),
        "catch_up_seconds": spec.catch_up_seconds,
    }

    def made(action: Action, reason: Reason, desired: int, message: str) -> Decision:
        return Decision(at=now, current=0, desired=desired, action=action, reason=reason,
                        message=message, inputs=inputs)  # fmt: skip

    if sample.backlog:
        desired = wake_parallelism(
            sample.backlog, sample.arrival_rate, spec, key_groups, history.capacity
        )
        arriving = "" if sample.arrival_rate is None else f"{_rate(sample.arrival_rate)} arriving, "
        sizing = (
            f"{arriving}{_rate(history.capacity)} per worker last measured, "
            f"{spec.catch_up_seconds:g} s to catch up"
            if history.capacity
            else "no capacity measured yet"
        )
        decision = made("scale_up", "input_waiting", desired,
                        f"{_count(sample.backlog)} records wait in the input while scaled to "
                        f"zero: waking with {_workers(desired)} ({sizing})")  # fmt: skip
    elif sample.next_timer_at is not None and sample.next_timer_at <= now:
        desired = wake_parallelism(0, None, spec, key_groups, None)
        late = now - sample.next_timer_at
        decision = made("scale_up", "timer_due", desired,
                        f"a timer is due ({late:.1f} s ago) while scaled to zero: waking with "
                        f"{_workers(desired)}")  # fmt: skip
    else:
        if sample.backlog is None:
            what = f"the input is unknown ({sample.missing or 'no answer'})"
            reason: Reason = "metrics_incomplete"
        else:
            what = "no input waits"
            reason = "idle"
        if sample.next_timer_at is not None:
            what += f"; the next timer is due in {sample.next_timer_at - now:.0f} s"
        decision = made("none", reason, 0, f"scaled to zero: {what}")
    if decision.action == "scale_up":
        history = msgspec.structs.replace(history, idle_since=None, recommendations=())
    previous = history.decisions[-1] if history.decisions else None
    history = remember(history, decision, spec)
    if continues_sleep(previous, decision):  # the last decisions stay readable
        history = msgspec.structs.replace(history, decisions=(*history.decisions[:-2], decision))
    return decision, history


def continues_sleep(previous: Decision | None, decision: Decision) -> bool:
    """Whether ``decision`` only repeats ``previous`` while the job stays at zero: one
    decision is kept for the whole sleep (the newest), not one per wake check."""
    return (
        decision.action == "none"
        and previous is not None
        and (previous.action, previous.reason, previous.current) == ("none", decision.reason, 0)
    )


def _no_scale_up(
    est: Estimate,
    history: ScalingHistory,
    spec: AutoscalerSpec,
    current: int,
    key_groups: int,
    now: float,
    window: LoadSample,
) -> tuple[Decision, ScalingHistory]:
    """No scale-up trigger: the scale-down path below the band, else stay (recommending
    the current parallelism)."""
    low = spec.target_utilization - spec.utilization_boundary
    high = spec.target_utilization + spec.utilization_boundary
    if est.utilization < low and est.demand < low:
        return _scale_down(est, history, spec, current, key_groups, now, window)
    history = _recommend(history, spec, now, current)
    reason: Reason = "within_band"
    if est.utilization > high:  # busy, but not from the arrival rate: working off lag
        message = (
            f"utilisation {_pct(est.utilization)} while working off lag "
            f"({_count(est.lag_at_start)} -> {_count(est.lag)} records); the arrival rate "
            f"alone keeps {_workers(current)} {_pct(est.demand)} busy"
        )
        if est.lag > 0 or est.lag_at_start > 0:
            reason = "catching_up"
    else:
        message = (
            f"utilisation {_pct(est.utilization)} within {_pct(low)}-{_pct(high)}: stays at "
            f"{current} (the sizing alone: {sizing_text(est, spec, None)})"
        )
    decision = Decision(
        at=now,
        current=current,
        desired=current,
        action="none",
        reason=reason,
        message=message,
        inputs=_inputs(window, spec, est, current),
    )
    return decision, history


def _recommend(
    history: ScalingHistory, spec: AutoscalerSpec, now: float, desired: int
) -> ScalingHistory:
    """``history`` with ``desired`` recommended at ``now``."""
    recs = add_recommendation(
        history.recommendations, now, desired, spec.scale_down_stabilization_seconds
    )
    return msgspec.structs.replace(history, recommendations=recs)


def _scale_up(
    trigger: Reason,
    est: Estimate,
    history: ScalingHistory,
    spec: AutoscalerSpec,
    current: int,
    key_groups: int,
    now: float,
    window: LoadSample,
) -> tuple[Decision, ScalingHistory]:
    """A scale-up trigger fired: scale up, or say why not."""
    assert est.per_worker_capacity is not None or est.raw_desired == 0
    high = spec.target_utilization + spec.utilization_boundary
    why = (
        f"utilisation {_pct(est.utilization)} is above {_pct(high)} (demand {_pct(est.demand)})"
        if trigger == "high_utilization"
        else f"lag keeps growing ({_count(est.lag_at_start)} -> {_count(est.lag)} records, "
        f"+{_rate(est.lag_trend)})"
    )
    target = (
        scale_up_target(est.raw_desired, current, spec, key_groups)
        if est.raw_desired > current
        else None
    )
    sizing = sizing_text(est, spec, target)
    if target is None or target.parallelism <= current:
        history = _recommend(history, spec, now, current)
        if target is not None:  # a bound stops it
            reason: Reason = "at_max"
            message = f"{why}: {sizing}; stays at {current}"
        else:  # lag grows although the workers suffice: a hot key group or a stuck worker
            reason = trigger
            message = (
                f"{why}, but {_workers(current)} give the required capacity ({sizing}): the "
                "bottleneck is a worker or key group (skew?), not the parallelism"
            )
        decision = Decision(
            at=now,
            current=current,
            desired=current,
            action="none",
            reason=reason,
            message=message,
            inputs=_inputs(window, spec, est, current),
        )
        return decision, history
    desired = target.parallelism
    inputs = _inputs(window, spec, est, desired)
    # A higher recommendation: pending scale-downs start over.
    history = msgspec.structs.replace(history, recommendations=(Recommendation(now, desired),))
    if history.scale_up_blocked is not None:
        decision = Decision(
            at=now,
            current=current,
            desired=current,
            action="blocked",
            reason="ineffective_scale_up",
            message=f"{why}: {sizing}; scale-up to {desired} blocked: {history.scale_up_blocked}",
            inputs=inputs,
        )
        return decision, history
    if spec.mode == "scale" and est.per_worker_capacity is not None:
        record = ScaleUpRecord(
            from_=current,
            to=desired,
            expected_rate=desired * est.per_worker_capacity,
            rate_before=est.processed_rate,
            at=now,
        )
        history = msgspec.structs.replace(history, last_scale_up=record)
    decision = Decision(
        at=now,
        current=current,
        desired=desired,
        action="scale_up",
        reason=trigger,
        message=f"{why}: {sizing}; scaling up from {current} to {desired}",
        inputs=inputs,
    )
    return decision, history


def _scale_down(
    est: Estimate,
    history: ScalingHistory,
    spec: AutoscalerSpec,
    current: int,
    key_groups: int,
    now: float,
    window: LoadSample,
) -> tuple[Decision, ScalingHistory]:
    """Utilisation is below the band: recommend, and scale down once stabilised."""
    low = spec.target_utilization - spec.utilization_boundary
    why = f"utilisation {_pct(est.utilization)} is below {_pct(low)}"
    target = scale_down_target(est.raw_desired, current, spec, key_groups)
    sizing = sizing_text(est, spec, target)
    history = _recommend(history, spec, now, target.parallelism)
    inputs = _inputs(window, spec, est, target.parallelism)

    def none(reason: Reason, message: str) -> Decision:
        return Decision(
            at=now,
            current=current,
            desired=current,
            action="none",
            reason=reason,
            message=message,
            inputs=inputs,
        )

    if target.parallelism >= current:
        if target.limited and est.raw_desired < current:
            return none("at_min", f"{why}: {sizing}; stays at {current}"), history
        return none("within_band", f"{why}, but {sizing}; stays at {current}"), history
    stabilization = spec.scale_down_stabilization_seconds
    chosen, since = stabilized_scale_down(
        history.recommendations, current, now, stabilization, spec.metrics_window_seconds
    )
    if chosen is None:
        waited = 0.0 if since is None else now - since
        message = (
            f"{why}: {sizing}; scaling down to {target.parallelism} once every recommendation "
            f"of the last {stabilization:g} s is below {current} ({waited:.0f} s so far)"
        )
        return none("stabilizing", message), history
    inputs["recommended"] = chosen
    message = (
        f"{why}: {sizing}; every recommendation for {now - (since or now):.0f} s was below "
        f"{current}, the highest over the last {stabilization:g} s is {chosen}; "
        f"scaling down from {current} to {chosen}"
    )
    decision = Decision(
        at=now,
        current=current,
        desired=chosen,
        action="scale_down",
        reason="low_utilization",
        message=message,
        inputs=inputs,
    )
    history = msgspec.structs.replace(history, recommendations=(), last_scale_up=None)
    return decision, history


# -- explain ------------------------------------------------------------------------------------


def _value(v: InputValue) -> str:
    """One input of a decision, for ``explain``."""
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "-" if v is None else v


def explain(decision: Decision) -> str:
    """A decision in a few lines, for ``keyshift explain``."""
    when = datetime.fromtimestamp(decision.at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    change = (
        f"{decision.current} -> {decision.desired}"
        if decision.desired != decision.current
        else f"stays at {decision.current}"
    )
    lines = [f"{when}  {decision.action}  {change}  ({decision.reason})", f"  {decision.message}"]
    if decision.inputs:
        width = max(len(k) for k in decision.inputs)
        lines.append("  inputs:")
        lines.extend(f"    {k:<{width}}  {_value(v)}" for k, v in decision.inputs.items())
    return "\n".join(lines)
