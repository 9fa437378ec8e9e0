"""The autoscaler against load traces in the simulator (benchmarks/autoscaler_sim.py).

keyshift runs with the ``AutoscalerSpec`` defaults throughout (targetUtilization
0.7, utilizationBoundary 0.2, catchUpSeconds 120, metricsWindowSeconds 60,
intervalSeconds 15, cooldownSeconds 30, scaleDownStabilizationSeconds 300, no
scale factors): the issue sets no other values for these checks.  The job:
128 key groups, 1,000 records/s per worker, 1x = 2,000 records/s (3 workers at
67%), a rescale starts new workers 5 s before the handoff and pauses the moved
key groups for 1 s.  "Enough parallelism" = the capacity covers the load at no
more than 90% busy (the top of the dead band, where the autoscaler stops
asking for more).
"""

from __future__ import annotations

import pytest

from benchmarks.autoscaler_sim import (
    FLINK_MODEL,
    KEYSHIFT_MODEL,
    KeyshiftPolicy,
    drop_trace,
    simulate,
    steady_trace,
    step_trace,
)
from benchmarks.flink_autoscaler import FlinkAutoscaler, flink_scale


@pytest.mark.parametrize("at", [300.0, 303.0, 307.0, 311.0])  # phases of the 15 s evaluations
def test_step_up_reaches_enough_parallelism_within_a_minute(at: float) -> None:
    trace = step_trace(base=2000.0, factor=4.0, at=at, duration=1200.0)
    policy = KeyshiftPolicy()
    run = simulate(trace, policy, KEYSHIFT_MODEL)
    assert len(run.actions) == 1  # one scale action
    assert run.actions[0].from_ == 3 and run.actions[0].reason == "high_utilization"
    assert run.enough_after is not None and run.enough_after <= 60.0
    assert run.lag_ok_after is not None and run.lag_ok_after <= 120.0
    assert KEYSHIFT_MODEL.capacity(run.final_parallelism) * 0.9 >= 8000.0
    assert run.lag[-1] < 1.0
    # After the scale-up it waits for complete metrics, then sees it is catching up.
    after = [d.reason for d in policy.decisions if d.at > run.actions[0].t]
    assert "metrics_incomplete" in after and "catching_up" in after


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_no_action_on_steady_noisy_load(seed: int) -> None:
    trace = steady_trace(base=2000.0, noise=0.15, duration=600.0, seed=seed)
    policy = KeyshiftPolicy()
    run = simulate(trace, policy, KEYSHIFT_MODEL)
    assert run.actions == []
    assert {d.reason for d in policy.decisions} == {"within_band"}
    assert len(policy.decisions) == 40  # every 15 s for 10 minutes
    assert max(run.load) > 2000.0 * 1.1 and min(run.load) < 2000.0 * 0.9  # it is noisy


def test_load_drop_scales_down_once_after_the_stabilization_window() -> None:
    trace = drop_trace(base=2000.0, factor=4.0, at=300.0, duration=1500.0)
    policy = KeyshiftPolicy()
    run = simulate(trace, policy, KEYSHIFT_MODEL)
    assert [(a.from_, a.to, a.reason) for a in run.actions] == [(12, 3, "low_utilization")]
    stabilization = policy.spec.scale_down_stabilization_seconds
    window = policy.spec.metrics_window_seconds
    assert 300.0 + stabilization <= run.actions[0].t <= 300.0 + stabilization + window
    assert run.final_parallelism == 3
    assert run.max_lag_seconds < 2.0  # only the moved key groups' pause


def test_flink_rules_on_the_same_step() -> None:
    trace = step_trace(base=2000.0, factor=4.0, at=300.0, duration=3600.0)
    run = simulate(trace, FlinkAutoscaler(), FLINK_MODEL)
    # The window needs a minute or two to show the step, then each restart costs 5 minutes
    # plus 20 minutes of stabilisation and metrics window before the next decision.
    assert [(a.from_, a.to) for a in run.actions] == [(3, 8), (8, 16)]
    assert run.actions[1].t - run.actions[0].t >= 300 + 300 + 900
    assert run.enough_after is not None and run.enough_after > 20 * 60
    assert run.max_lag_seconds > 300


def test_flink_alignment_to_divisors() -> None:
    assert flink_scale(3, 1.6, 128, 1, 200) == 8  # ceil(4.8) = 5 -> next divisor of 128
    assert flink_scale(8, 1.8, 128, 1, 200) == 16
    assert flink_scale(12, 0.9, 128, 1, 200) == 11  # no divisor in [11, 12]: fall back downward
    assert flink_scale(12, 0.4, 128, 1, 200) == 8
    assert flink_scale(4, 1.0, 128, 1, 200) == 4
