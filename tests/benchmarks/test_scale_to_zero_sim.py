"""Scale to zero in the simulator (benchmarks/autoscaler_sim.py) and the idle week of
benchmarks/cost.py: pure and fast (simulated hours, no processes).

The job is the simulator's (128 key groups, 1,000 records/s per worker, new workers
start 5 s before the handoff, moved key groups pause 1 s); keyshift runs with the
``AutoscalerSpec`` defaults but ``minParallelism`` (scaleToZeroAfter 300 s,
wakeCheckSeconds 1 s).
"""

from __future__ import annotations

import pytest

from benchmarks.autoscaler_sim import (
    KEYSHIFT_MODEL,
    KeyshiftPolicy,
    Run,
    Simulation,
    Trace,
    simulate,
)
from benchmarks.cost import business_idle_trace, peak_load, wake_targets
from keyshift.api.spec import AutoscalerSpec

RATE = 2000.0
STOPS, RETURNS, ENDS = 600.0, 2400.0, 3600.0


def gap(t: float) -> float:
    """2,000 records/s, none from 10 to 40 min, again until 60 min, none after."""
    return RATE if t < STOPS or RETURNS <= t < ENDS else 0.0


def run_gap(min_parallelism: int) -> tuple[Run, KeyshiftPolicy]:
    trace = Trace("gap", "gap", duration=4500.0, shape=gap, initial_parallelism=3)
    policy = KeyshiftPolicy(AutoscalerSpec(enabled=True, min_parallelism=min_parallelism))
    return simulate(trace, policy, KEYSHIFT_MODEL, record_every=1.0), policy


def charged(run: Run) -> dict[float, int]:
    """Workers charged per step, by the step's start (``record_every`` = 1 step)."""
    return {t - KEYSHIFT_MODEL.dt: p for t, p in zip(run.times, run.parallelism, strict=True)}


def test_idle_input_scales_to_zero_and_nothing_is_charged_there() -> None:
    run, policy = run_gap(0)
    to_zero = [a for a in run.actions if a.to == 0]
    assert [a.reason for a in to_zero] == ["idle", "idle"]  # after each silence
    assert STOPS + 300.0 <= to_zero[0].t <= STOPS + 300.0 + 15.0  # an interval's phase
    steps = charged(run)
    assert run.worker_hours == pytest.approx(sum(steps.values()) / 3600)
    # At zero from the handoff's end (1 s) until the wake: no worker, nothing charged.
    asleep = [t for t, p in steps.items() if p == 0]
    first = to_zero[0].t + KEYSHIFT_MODEL.pause_seconds
    assert asleep[0] == first
    wake_at = run.wakes[0].decided_at
    assert all(steps[t] == 0 for t in steps if first <= t < wake_at)
    assert run.seconds_at_zero == len(asleep) >= wake_at - first
    assert run.final_parallelism == 0
    # One decision kept for the whole sleep, though it checked every second.
    assert policy.wake_checks >= wake_at - first
    asleep_decisions = [(d.action, d.reason, d.current) for d in policy.decisions]
    assert asleep_decisions.count(("none", "idle", 0)) == 2


def test_wakes_when_input_returns_and_loses_no_record() -> None:
    run, _ = run_gap(0)
    (wake,) = run.wakes  # the trace ends asleep
    assert wake.input_at == RETURNS
    assert wake.decided_at == RETURNS + 1.0  # the next check after the first second of input
    assert wake.backlog == pytest.approx(RATE * 1.0)  # nothing processed while at zero
    action = next(a for a in run.actions if a.t == wake.decided_at)
    assert (action.from_, action.to, action.reason) == (0, wake.to, "input_waiting")
    # sized for the arrival rate the two checks saw, as a running job: 2,000 rec/s at 0.7 of
    # 1,000 rec/s per worker, plus the backlog's catch-up
    assert wake.to == 3
    # cold start = detection (1 s) + the workers' start (5 s) + the handoff's pause (1 s)
    assert wake.cold_start == 1.0 + KEYSHIFT_MODEL.startup_seconds + KEYSHIFT_MODEL.pause_seconds
    assert wake.asleep_at is not None and wake.asleep_at > ENDS
    assert wake.max_lag_records >= RATE * wake.cold_start - 1.0  # input waited meanwhile
    assert wake.lag_ok_after <= 60.0  # the lag under 10 s of input within a minute
    # Every record arrived was processed (the warm-up at the initial load included).
    arrived = RATE * (1260.0 + STOPS + ENDS - RETURNS)
    assert run.records_arrived == pytest.approx(arrived)
    assert run.records_processed == pytest.approx(arrived)
    assert run.final_lag == pytest.approx(0.0, abs=1e-6)


def test_min_parallelism_one_never_goes_to_zero() -> None:
    run, policy = run_gap(1)
    asleep_run, _ = run_gap(0)
    assert min(run.parallelism) >= 1
    assert all(a.to >= 1 for a in run.actions)
    assert run.seconds_at_zero == 0.0 and run.wakes == [] and policy.wake_checks == 0
    assert "idle" not in {d.reason for d in policy.decisions}
    assert run.records_processed == pytest.approx(run.records_arrived)
    assert run.worker_hours > asleep_run.worker_hours


def test_business_idle_trace_is_truly_idle_at_night_and_on_the_weekend() -> None:
    trace = business_idle_trace(peak=1000.0, ramp=1800.0)
    h, day = 3600.0, 86400.0
    assert trace.duration == 7 * day
    assert trace.shape(3 * h) == 0.0 and trace.shape(9 * h) == 0.0
    assert trace.shape(9.25 * h) == pytest.approx(500.0)  # half way up the ramp
    assert trace.shape(12 * h) == 1000.0 and trace.shape(4 * day + 12 * h) == 1000.0  # Fri
    assert trace.shape(17.75 * h) == pytest.approx(500.0)
    assert trace.shape(18 * h) == 0.0 and trace.shape(23 * h) == 0.0
    assert trace.shape(5 * day + 12 * h) == 0.0 and trace.shape(6 * day + 12 * h) == 0.0
    assert peak_load(trace) == 1000.0
    sim = Simulation(trace, KEYSHIFT_MODEL, warmup=60.0)  # noise multiplies: 0 stays 0
    assert sim.rate(3 * h) == 0.0 and sim.rate(5 * day + 12 * h) == 0.0
    assert sim.rate(12 * h) != 1000.0 and sim.rate(12 * h) == pytest.approx(1000.0, rel=0.05)
    assert business_idle_trace(peak=1000.0, ramp=0.0).shape(9 * h) == 1000.0  # a step


def test_a_wake_on_a_ramp_catches_up_within_a_minute() -> None:
    trace = business_idle_trace(
        peak=8000.0, ramp=1800.0, opens=1800.0, closes=1800.0 + 7200.0, duration=1800.0 + 3600.0
    )
    policy = KeyshiftPolicy(AutoscalerSpec(enabled=True, min_parallelism=0))
    run = simulate(trace, policy, KEYSHIFT_MODEL)
    (wake,) = run.wakes
    assert wake.input_at == pytest.approx(1801.0)  # the ramp's first second with input
    assert wake.lag_ok_after <= 60.0
    assert run.records_processed + run.final_lag == pytest.approx(run.records_arrived)


def test_wake_targets() -> None:
    wakes = [
        {"cold_start_seconds": 7.0, "lag_ok_after_seconds": 0.0, "max_lag_seconds": 4.0},
        {"cold_start_seconds": 8.0, "lag_ok_after_seconds": 95.0, "max_lag_seconds": 37.5},
    ]
    assert wake_targets(wakes) == {
        "wakes": 2, "max_cold_start_seconds": 8.0, "max_lag_ok_after_seconds": 95.0,
        "max_lag_seconds": 37.5, "lag_ok_within_target": False,
    }  # fmt: skip
    assert wake_targets(wakes[:1])["lag_ok_within_target"]
    assert not wake_targets([])["lag_ok_within_target"]
