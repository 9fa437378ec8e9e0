"""The autoscaler's decision as a pure function, over synthetic windows."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyshift.api.spec import AutoscalerSpec
from keyshift.controller.autoscaling.decision import (
    DECISIONS_KEPT,
    Decision,
    Recommendation,
    ScaleUpRecord,
    ScalingHistory,
    align,
    align_down,
    decide,
    decide_wake,
    explain,
    max_range,
)
from keyshift.controller.autoscaling.metrics.base import IdleSample, LoadSample, WorkerLoad

SPEC = AutoscalerSpec(enabled=True)  # target 0.7 +- 0.2, catch-up 120 s, window 60 s
K = 32
T0 = 1_000_000.0


def workers(n: int, processed: float, busy: float, lag: int = 0) -> tuple[WorkerLoad, ...]:
    return tuple(
        WorkerLoad(
            ordinal=i,
            name=f"w-{i}",
            processed_rate=processed,
            busy_ratio=busy,
            key_groups_owned=K // n,
            generation=1,
            cache_hit_ratio=None,
            lag=lag,
        )
        for i in range(n)
    )


def sample(
    per_worker: tuple[WorkerLoad, ...],
    *,
    arrival: float | None = None,
    lag: int | None = 0,
    lag_trend: float | None = 0.0,
    at: float = T0,
    window: float = 60.0,
    complete: bool = True,
    missing: tuple[str, ...] = (),
    expected: int | None = None,
) -> LoadSample:
    rates = [w.processed_rate for w in per_worker if w.processed_rate is not None]
    processed = sum(rates) if rates else None
    if arrival is None and processed is not None:
        arrival = processed + (lag_trend or 0.0)
    return LoadSample(
        at=at,
        window_seconds=window,
        workers_expected=len(per_worker) if expected is None else expected,
        workers_reporting=len(per_worker),
        arrival_rate=arrival,
        processed_rate=processed,
        lag=lag,
        lag_trend=lag_trend,
        per_worker=per_worker,
        lag_by_key_group={},
        complete=complete,
        missing=missing,
    )


def run(
    window: LoadSample,
    history: ScalingHistory | None = None,
    spec: AutoscalerSpec = SPEC,
    *,
    current: int | None = None,
    key_groups: int = K,
    now: float | None = None,
    rescaling: bool = False,
    failing_over: bool = False,
) -> tuple[Decision, ScalingHistory]:
    return decide(
        window,
        history or ScalingHistory(),
        spec,
        current=window.workers_expected if current is None else current,
        key_groups=key_groups,
        now=window.at if now is None else now,
        rescaling=rescaling,
        failing_over=failing_over,
    )


def at_utilization(n: int, utilization: float, at: float = T0) -> LoadSample:
    """``n`` workers of 1,000 rec/s, each busy ``utilization``, keeping up."""
    return sample(workers(n, 1000.0 * utilization, utilization), at=at)


# -- alignment -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key_groups", "desired", "aligned"),
    [
        (32, 3, 3), (32, 5, 5), (32, 6, 6), (32, 7, 7), (32, 9, 11), (32, 12, 16),
        (32, 17, 32), (128, 12, 12), (128, 14, 15), (128, 33, 43), (128, 65, 128),
        (12, 4, 4), (12, 5, 6), (12, 7, 12), (31, 11, 11), (31, 12, 16), (31, 16, 16),
        (31, 17, 31), (127, 64, 64), (127, 65, 127), (1, 1, 1), (8, 0, 1), (8, 99, 8),
    ],
)  # fmt: skip
def test_align_examples(key_groups: int, desired: int, aligned: int) -> None:
    assert align(desired, key_groups) == aligned


@given(st.integers(1, 600).flatmap(lambda k: st.tuples(st.just(k), st.integers(1, k))))
def test_align_property(case: tuple[int, int]) -> None:
    key_groups, desired = case
    a = align(desired, key_groups)
    assert desired <= a <= key_groups
    assert all(max_range(a, key_groups) < max_range(q, key_groups) for q in range(1, a))
    # the smallest such: every parallelism in [desired, a) has ranges as large as q - 1's
    for q in range(desired, a):
        assert q > 1 and max_range(q, key_groups) == max_range(q - 1, key_groups)


@given(st.integers(1, 600).flatmap(lambda k: st.tuples(st.just(k), st.integers(1, k))))
def test_align_down_property(case: tuple[int, int]) -> None:
    key_groups, p = case
    a = align_down(p, key_groups)
    assert 1 <= a <= p
    assert align(a, key_groups) == a
    assert max_range(a, key_groups) == max_range(p, key_groups)


# -- no decision -----------------------------------------------------------------------------------


def test_failing_over() -> None:
    d, _ = run(at_utilization(4, 0.99), failing_over=True)
    assert (d.action, d.reason, d.desired) == ("none", "failing_over", 4)


def test_rescale_in_progress_restarts_the_cooldown() -> None:
    d, h = run(at_utilization(4, 0.99), rescaling=True)
    assert (d.action, d.reason) == ("none", "rescale_in_progress")
    assert h.last_rescale_at == T0
    d, _ = run(at_utilization(4, 0.99, at=T0 + 29), h)
    assert d.reason == "cooldown"
    assert "1 s left" in d.message
    d, _ = run(at_utilization(4, 0.99, at=T0 + 30), h)
    assert d.action == "scale_up"


def test_cooldown_after_a_scale_up() -> None:
    d, h = run(at_utilization(4, 0.99))
    assert d.action == "scale_up"
    assert h.last_rescale_at == T0 and h.parallelism == d.desired
    d2, _ = run(at_utilization(d.desired, 0.99, at=T0 + 15), h)
    assert (d2.action, d2.reason) == ("none", "cooldown")


@pytest.mark.parametrize(
    "broken",
    [
        {"complete": False, "missing": ("w-2: connection refused",)},
        {"arrival_rate": None},
        {"processed_rate": None},
        {"lag": None},
        {"lag_trend": None},
        {"workers_expected": 5},
        {"per_worker": ()},
    ],
)
def test_incomplete_metrics_are_never_read_as_zero_load(broken: dict[str, Any]) -> None:
    # Idle workers, nothing arriving: on complete data this would recommend scaling down.
    window = dataclasses.replace(sample(workers(4, 0.0, 0.0), arrival=0.0), **broken)
    d, h = run(window, current=4)
    assert (d.action, d.reason, d.desired) == ("none", "metrics_incomplete", 4)
    assert "not read as zero load" in d.message
    assert h.recommendations == ()
    if broken.get("missing"):
        assert "w-2: connection refused" in d.message


def test_worker_without_rates_is_incomplete() -> None:
    broken = (*workers(3, 500.0, 0.5), WorkerLoad(3, "w-3", None, None, 8, 1, None, 0))
    d, _ = run(sample(broken, arrival=1500.0))
    assert d.reason == "metrics_incomplete"


def test_no_measurable_capacity_is_not_a_decision() -> None:
    d, _ = run(sample(workers(4, 0.0, 0.0), arrival=100.0, lag=0))
    assert d.reason == "metrics_incomplete"
    assert "busy enough" in d.message


# -- the dead band ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("utilization", "action", "reason"),
    [
        (0.91, "scale_up", "high_utilization"),
        (0.89, "none", "within_band"),
        (0.70, "none", "within_band"),
        (0.51, "none", "within_band"),
        (0.49, "none", "stabilizing"),
    ],
)
def test_dead_band(utilization: float, action: str, reason: str) -> None:
    d, h = run(at_utilization(8, utilization))
    assert (d.action, d.reason) == (action, reason)
    assert d.inputs["utilization"] == pytest.approx(utilization)
    if reason == "within_band":
        assert h.recommendations == (Recommendation(T0, 8),)
        # the band decides, and the message says so before the sizing's own figure
        assert d.message.startswith(f"utilisation {utilization:.0%} within 50%-90%: stays at 8")


def test_one_worker_is_said_in_the_singular() -> None:
    d, _ = run(at_utilization(1, 0.6))
    assert (d.action, d.reason) == ("none", "within_band")
    assert d.message.endswith("-> 1 worker)")


def test_high_utilization_scales_up_with_a_readable_message() -> None:
    # 4 workers at 95% of 2,300 rec/s; 12,000 rec/s arrive; 30,000 records behind.
    window = sample(workers(4, 2185.0, 0.95), arrival=12000.0, lag=30000, lag_trend=3260.0)
    d, h = run(window)
    assert (d.action, d.reason, d.current, d.desired) == ("scale_up", "high_utilization", 4, 8)
    assert (
        "arrival 12,000 rec/s needs 17,143 rec/s at 70% utilisation plus 250 rec/s to catch up "
        "30,000 records of lag in 120 s; 2,300 rec/s per worker -> 8 workers" in d.message
    )
    assert d.message.startswith("utilisation 95% is above 90% (demand 130%)")
    assert d.inputs["per_worker_capacity"] == pytest.approx(2300.0)
    assert d.inputs["required_capacity"] == pytest.approx(12000 / 0.7 + 250, abs=0.01)
    assert d.inputs["raw_desired"] == 8
    record = h.last_scale_up
    assert isinstance(record, ScaleUpRecord)
    assert (record.from_, record.to, record.at) == (4, 8, T0)
    assert record.expected_rate == pytest.approx(8 * 2300.0)
    assert record.rate_before == pytest.approx(4 * 2185.0)


def test_alignment_in_the_decision() -> None:
    # raw 9 for 32 key groups: 9 and 10 have ranges of 4 like 8 -> 11.
    window = sample(workers(4, 950.0, 0.95), arrival=6000.0)
    d, _ = run(window)
    assert d.inputs["raw_desired"] == 9
    assert d.desired == 11
    assert "aligned from 9 to 11 for 32 key groups" in d.message


def test_lag_growing_scales_up_inside_the_band() -> None:
    # 88% busy (inside the band), lag above a second of input at both ends and growing.
    window = sample(workers(4, 880.0, 0.88, lag=2500), lag=10000, lag_trend=50.0)
    d, _ = run(window)
    assert (d.action, d.reason, d.desired) == ("scale_up", "lag_growing", 6)
    assert "lag keeps growing (7,000 -> 10,000 records" in d.message


def test_lag_that_only_just_appeared_is_not_growing_lag() -> None:
    window = sample(workers(4, 880.0, 0.88, lag=2500), lag=10000, lag_trend=200.0)
    d, _ = run(window)
    assert d.reason == "within_band"
    assert d.inputs["lag_at_window_start"] == 0


def test_lag_growing_with_enough_workers_points_at_skew() -> None:
    # Lag grows on one hot worker while the job as a whole has capacity to spare.
    ws = (*workers(3, 300.0, 0.3), WorkerLoad(3, "w-3", 1000.0, 1.0, 8, 1, None, 20000))
    d, _ = run(sample(ws, lag=20000, lag_trend=100.0))
    assert (d.action, d.reason, d.desired) == ("none", "lag_growing", 4)
    assert "skew" in d.message


def test_catching_up_with_enough_workers() -> None:
    # Saturated while working off lag, but 8 workers already give what is needed.
    window = sample(workers(8, 950.0, 0.95, lag=7000), lag=60000, lag_trend=-2600.0)
    d, _ = run(window)
    assert (d.action, d.reason, d.desired) == ("none", "catching_up", 8)
    assert "the arrival rate alone keeps 8 workers 62% busy" in d.message


# -- capacity --------------------------------------------------------------------------------------


def test_idle_workers_do_not_measure_capacity() -> None:
    ws = (*workers(2, 500.0, 0.5), WorkerLoad(2, "w-2", 50.0, 0.01, 10, 1, None, 0))
    d, _ = run(sample(ws))
    assert d.inputs["per_worker_capacity"] == pytest.approx(1000.0)
    assert d.inputs["capacity_rule"] == "busy"


def test_observed_rate_while_backlogged_when_busy_time_overstates_capacity() -> None:
    # Flat out with a backlog all window, yet busy 60%: the busy time missed part of the cost.
    window = sample(workers(4, 600.0, 0.6, lag=30000), lag=120000, lag_trend=10.0)
    d, _ = run(window)
    assert d.inputs["capacity_rule"] == "observed"
    assert d.inputs["per_worker_capacity"] == pytest.approx(600.0)
    assert d.inputs["utilization"] == pytest.approx(1.0)
    assert d.action == "scale_up"  # 2,410 rec/s / 0.7 + 1,000 catch-up over 600 per worker
    assert d.desired == align(math.ceil((2410 / 0.7 + 1000) / 600), K)


def test_busy_time_kept_when_a_rescale_lies_inside_the_window() -> None:
    window = sample(workers(4, 600.0, 0.6, lag=30000), lag=120000, lag_trend=10.0)
    history = ScalingHistory(last_rescale_at=T0 - 45, parallelism=4)
    d, _ = run(window, history)
    assert d.inputs["capacity_rule"] == "busy"
    assert d.inputs["per_worker_capacity"] == pytest.approx(1000.0)


# -- caps and factors ------------------------------------------------------------------------------


def test_at_max_parallelism() -> None:
    spec = AutoscalerSpec(enabled=True, max_parallelism=5)
    d, _ = run(at_utilization(5, 0.99), spec=spec)
    assert (d.action, d.reason, d.desired) == ("none", "at_max", 5)
    assert "maxParallelism 5" in d.message


def test_at_max_by_key_groups() -> None:
    d, _ = run(at_utilization(4, 0.99), key_groups=4)
    assert (d.reason, d.desired) == ("at_max", 4)
    assert "4 key groups" in d.message


def test_capped_below_the_raw_desire_by_max_parallelism() -> None:
    spec = AutoscalerSpec(enabled=True, max_parallelism=10)
    window = sample(workers(4, 990.0, 0.99), arrival=12000.0)
    d, _ = run(window, spec=spec)
    # 10 is not aligned for 32 key groups (ranges of 4, like 8): the highest aligned below.
    assert (d.action, d.desired) == ("scale_up", 8)
    assert "limited to 10 by maxParallelism 10" in d.message


def test_max_scale_up_factor() -> None:
    spec = AutoscalerSpec(enabled=True, max_scale_up_factor=1.5)
    window = sample(workers(4, 990.0, 0.99), arrival=12000.0)
    d, _ = run(window, spec=spec)
    assert (d.action, d.desired) == ("scale_up", 6)
    assert "maxScaleUpFactor 1.5" in d.message


def test_at_min_parallelism() -> None:
    spec = AutoscalerSpec(enabled=True, min_parallelism=2)
    d, _ = run(at_utilization(2, 0.1), spec=spec)
    assert (d.action, d.reason, d.desired) == ("none", "at_min", 2)


def test_max_scale_down_factor_limits_the_recommendation() -> None:
    spec = AutoscalerSpec(enabled=True, max_scale_down_factor=0.5)
    d, h = run(at_utilization(16, 0.05), spec=spec)
    assert d.reason == "stabilizing"
    assert d.inputs["recommended"] == 8
    assert h.recommendations[-1].desired == 8


def test_scale_down_factor_that_allows_no_step_is_at_min() -> None:
    spec = AutoscalerSpec(enabled=True, max_scale_down_factor=0.05)
    d, _ = run(at_utilization(10, 0.1), spec=spec, key_groups=40)
    assert d.reason == "at_min"
    assert "maxScaleDownFactor 0.05" in d.message


# -- scale-down stabilisation ----------------------------------------------------------------------


def low(n: int, arrival: float, at: float) -> LoadSample:
    """``n`` workers of 1,000 rec/s sharing ``arrival`` (well below the band)."""
    per = arrival / n
    return sample(workers(n, per, per / 1000.0), at=at)


def test_scale_down_only_after_the_stabilization_window() -> None:
    history = ScalingHistory()
    for i in range(20):  # 0 .. 285 s: every recommendation is 3
        d, history = run(low(8, 2000.0, T0 + 15 * i), history)
        assert (d.action, d.reason) == ("none", "stabilizing")
        assert f"({15 * i} s so far)" in d.message
    d, history = run(low(8, 2000.0, T0 + 300), history)
    assert (d.action, d.reason, d.desired) == ("scale_down", "low_utilization", 3)
    assert history.recommendations == ()
    assert history.parallelism == 3 and history.last_rescale_at == T0 + 300


def test_scale_down_takes_the_highest_recommendation() -> None:
    arrivals = [2000.0] * 21
    arrivals[2] = 3500.0  # at 30 s: 5 workers, but its window began before the stabilisation window
    arrivals[8] = 2700.0  # at 120 s: 4 workers
    history = ScalingHistory()
    for i, a in enumerate(arrivals):
        d, history = run(low(8, a, T0 + 15 * i), history)
    assert (d.action, d.desired) == ("scale_down", 4)
    assert "the highest over the last 300 s is 4" in d.message


def test_a_recommendation_at_current_restarts_the_wait() -> None:
    history = ScalingHistory()
    for i in range(17):  # 0 .. 240 s lower
        d, history = run(low(8, 2000.0, T0 + 15 * i), history)
    d, history = run(at_utilization(8, 0.7, at=T0 + 255), history)  # inside the band
    assert d.reason == "within_band"
    for i in range(18, 37):  # 270 .. 540 s lower again
        d, history = run(low(8, 2000.0, T0 + 15 * i), history)
        assert d.reason == "stabilizing"
    d, history = run(low(8, 2000.0, T0 + 570), history)
    assert d.action == "scale_down"


def test_scale_up_resets_pending_scale_downs() -> None:
    history = ScalingHistory()
    for i in range(10):
        _, history = run(low(8, 2000.0, T0 + 15 * i), history)
    assert len(history.recommendations) == 10
    d, history = run(at_utilization(8, 0.99, at=T0 + 150), history)
    assert d.action == "scale_up"
    assert history.recommendations == (Recommendation(T0 + 150, d.desired),)


def test_zero_load_recommends_the_minimum() -> None:
    d, _ = run(sample(workers(4, 0.0, 0.0), arrival=0.0))
    assert (d.reason, d.inputs["recommended"]) == ("stabilizing", 1)


# -- ineffective scale-ups -------------------------------------------------------------------------


def saturated(n: int, total: float, lag: int, trend: float, at: float) -> LoadSample:
    """``n`` saturated workers processing ``total`` rec/s with a backlog all window."""
    return sample(
        workers(n, total / n, 1.0, lag=lag // n), arrival=total + trend, lag=lag,
        lag_trend=trend, at=at,
    )  # fmt: skip


def blocked_history() -> ScalingHistory:
    d, history = run(saturated(4, 4000.0, 200_000, 1000.0, T0))
    assert (d.action, d.desired) == ("scale_up", 11)
    d, history = run(saturated(11, 4000.0, 260_000, 1000.0, T0 + 61), history)
    assert (d.action, d.reason, d.desired) == ("blocked", "ineffective_scale_up", 11)
    return history


def test_ineffective_scale_up_blocks_further_scale_ups() -> None:
    history = blocked_history()
    assert history.scale_up_blocked is not None
    assert history.last_scale_up is None
    last = history.decisions[-1]
    assert "raised throughput by 0 rec/s of the 7,000 rec/s expected (0%" in last.message
    assert "blocked" in last.message
    d, history = run(saturated(11, 4000.0, 320_000, 1000.0, T0 + 120), history)
    assert (d.action, d.reason) == ("blocked", "ineffective_scale_up")


def test_scale_up_not_judged_before_a_window_lies_after_it() -> None:
    _, history = run(saturated(4, 4000.0, 200_000, 1000.0, T0))
    d, history = run(saturated(11, 4000.0, 240_000, 1000.0, T0 + 45), history)
    assert d.action == "scale_up"  # nothing judged yet: the window still covers the scale-up
    assert history.scale_up_blocked is None


def test_effective_scale_up_is_not_blocked() -> None:
    _, history = run(saturated(4, 4000.0, 200_000, 1000.0, T0))
    d, history = run(saturated(11, 10500.0, 100_000, -5500.0, T0 + 61), history)
    assert d.action != "blocked"
    assert history.last_scale_up is None and history.scale_up_blocked is None


def test_block_lifts_when_the_load_drops() -> None:
    history = blocked_history()
    d, history = run(at_utilization(11, 0.6, at=T0 + 120), history)
    assert d.reason == "within_band"
    assert "block is lifted" in d.message
    assert history.scale_up_blocked is None


def test_block_lifts_on_a_manual_change() -> None:
    history = blocked_history()
    d, history = run(at_utilization(16, 0.99, at=T0 + 200), history)
    assert history.scale_up_blocked is None
    assert "changed from 11 to 16 outside the autoscaler" in d.message
    assert d.reason == "cooldown"  # the change counts as a rescale
    d, history = run(at_utilization(16, 0.99, at=T0 + 230), history)
    assert d.action == "scale_up"


# -- modes, history, records -----------------------------------------------------------------------


def test_recommend_mode_does_not_assume_the_change() -> None:
    spec = AutoscalerSpec(enabled=True, mode="recommend")
    d, h = run(at_utilization(4, 0.99), spec=spec)
    assert d.action == "scale_up"
    assert h.parallelism == 4 and h.last_rescale_at is None and h.last_scale_up is None
    d, _ = run(at_utilization(4, 0.99, at=T0 + 15), h, spec=spec)
    assert d.action == "scale_up"  # no cooldown, no "manual change"


def test_history_keeps_the_last_decisions() -> None:
    history = ScalingHistory()
    for i in range(DECISIONS_KEPT + 5):
        _, history = run(at_utilization(4, 0.7, at=T0 + 15 * i), history)
    assert len(history.decisions) == DECISIONS_KEPT
    assert history.decisions[-1].at == T0 + 15 * (DECISIONS_KEPT + 4)


def test_history_round_trips_as_json() -> None:
    _, history = run(saturated(4, 4000.0, 200_000, 1000.0, T0))
    raw = msgspec.json.encode(history)
    assert b'"from":4' in raw
    assert msgspec.json.decode(raw, type=ScalingHistory) == history


def test_explain() -> None:
    d, _ = run(at_utilization(4, 0.99))
    text = explain(d)
    lines = text.splitlines()
    assert lines[0].endswith("scale_up  4 -> 6  (high_utilization)")
    assert lines[1].strip() == d.message
    assert any(line.split()[:2] == ["utilization", "0.99"] for line in lines)
    assert "stays at 4" in explain(run(at_utilization(4, 0.7))[0])


# -- scale to zero and wake ------------------------------------------------------------------------

ZERO = AutoscalerSpec(enabled=True, min_parallelism=0, scale_to_zero_after=300)


def idle(n: int, at: float) -> LoadSample:
    """``n`` workers with nothing arriving and nothing left to do."""
    return sample(workers(n, 0.0, 0.0), arrival=0.0, at=at)


def test_a_job_idle_for_scale_to_zero_after_scales_to_zero() -> None:
    d, h = run(at_utilization(2, 0.5), spec=ZERO)  # measures 1,000 rec/s per worker
    assert h.capacity == pytest.approx(1000.0)
    d, h = run(idle(2, T0 + 60), h, ZERO)
    assert h.idle_since == T0  # the start of the first idle window
    d, h = run(idle(2, T0 + 299), ScalingHistory(idle_since=T0), ZERO)
    assert (d.action, d.reason) != ("scale_down", "idle")  # 299 s < 300 s
    d, h = run(idle(2, T0 + 300), ScalingHistory(idle_since=T0), ZERO)
    assert (d.action, d.desired, d.reason) == ("scale_down", 0, "idle")
    assert "scaling from 2 to zero" in d.message
    assert (h.parallelism, h.idle_since) == (0, None)


def test_input_restarts_the_idle_clock() -> None:
    _, h = run(idle(2, T0), ScalingHistory(), ZERO)
    assert h.idle_since == T0 - 60
    _, h = run(sample(workers(2, 1.0, 0.001), arrival=2.0, at=T0 + 60), h, ZERO)
    assert h.idle_since is None
    _, h = run(sample(workers(2, 0.0, 0.0), arrival=0.0, lag=5, at=T0 + 120), h, ZERO)
    assert h.idle_since is None  # nothing arrives, but the lag is not worked off


def test_without_min_parallelism_zero_an_idle_job_never_scales_to_zero() -> None:
    d, _ = run(idle(1, T0), ScalingHistory(idle_since=T0 - 10_000), SPEC)
    assert (d.action, d.desired) == ("none", 1)
    eager = SPEC.model_copy(update={"scale_down_stabilization_seconds": 0})
    d, _ = run(idle(2, T0), ScalingHistory(idle_since=T0 - 10_000), eager)
    assert (d.action, d.desired) == ("scale_down", 1)


def wake(
    sample_: IdleSample, history: ScalingHistory | None = None, spec: AutoscalerSpec = ZERO
) -> tuple[Decision, ScalingHistory]:
    return decide_wake(sample_, history or ScalingHistory(parallelism=0), spec,
                       key_groups=K, now=T0)  # fmt: skip


def test_input_waiting_wakes_the_job_sized_for_the_backlog() -> None:
    measured = ScalingHistory(parallelism=0, capacity=1000.0)
    d, h = wake(IdleSample(T0, backlog=600_000, next_timer_at=None), measured)
    # 600,000 records in catchUpSeconds 120 at 1,000 rec/s per worker: 5 workers
    assert (d.action, d.reason, d.current, d.desired) == ("scale_up", "input_waiting", 0, 5)
    assert h.parallelism == 5
    d, _ = wake(IdleSample(T0, backlog=1, next_timer_at=None), measured)
    assert d.desired == 1  # at least one
    d, _ = wake(IdleSample(T0, backlog=10**9, next_timer_at=None), measured,
                ZERO.model_copy(update={"max_parallelism": 4}))  # fmt: skip
    assert d.desired == 4
    d, _ = wake(IdleSample(T0, backlog=600_000, next_timer_at=None))
    assert (d.desired, "no capacity measured yet" in d.message) == (1, True)
    # input back as a step of 2,100 rec/s: sized for it at targetUtilization 0.7, as a
    # running job would be (3,000 rec/s of capacity), plus the backlog's catch-up
    step = IdleSample(T0, backlog=2_100, next_timer_at=None, arrival_rate=2_100.0)
    d, _ = wake(step, measured)
    assert d.desired == 4  # ceil((2100 / 0.7 + 2100 / 120) / 1000)
    assert d.inputs["arrival_rate"] == 2_100.0


def test_a_due_timer_wakes_the_job_and_a_future_one_does_not() -> None:
    d, _ = wake(IdleSample(T0, backlog=0, next_timer_at=T0 - 0.5))
    assert (d.action, d.reason, d.desired) == ("scale_up", "timer_due", 1)
    d, h = wake(IdleSample(T0, backlog=0, next_timer_at=T0 + 60))
    assert (d.action, d.reason, d.desired) == ("none", "idle", 0)
    assert "next timer is due in 60 s" in d.message
    assert h.parallelism == 0


def test_an_unknown_input_does_not_wake_the_job() -> None:
    d, _ = wake(IdleSample(T0, backlog=None, next_timer_at=None, missing="Kafka unreachable"))
    assert (d.action, d.reason, d.desired) == ("none", "metrics_incomplete", 0)
    assert "Kafka unreachable" in d.message


def test_a_long_sleep_keeps_one_decision_not_one_per_check() -> None:
    _, h = run(idle(2, T0 + 300), ScalingHistory(idle_since=T0), ZERO)
    for i in range(50):
        _, h = decide_wake(IdleSample(T0 + 301 + i, 0, None), h, ZERO, key_groups=K,
                           now=T0 + 301 + i)  # fmt: skip
    assert [(d.action, d.reason) for d in h.decisions] == [("scale_down", "idle"), ("none", "idle")]
    assert h.decisions[-1].at == T0 + 350
