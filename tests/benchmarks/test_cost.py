"""The pricing in benchmarks/cost.py: pure functions, data in and data out (no runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.autoscaler_sim import JobModel
from benchmarks.cost import (
    business_hours_trace,
    capacities,
    peak_load,
    price,
    static_parallelism,
    targets,
)

COMPARE = {
    "throughput": [
        {"system": "keyshift", "mode": "valkey", "records_per_second": 50_000,
         "records_per_cpu_second": 55_000, "records_per_cpu_second_with_store": 48_000},
        {"system": "keyshift", "mode": "in-process", "records_per_cpu_second": 60_000},
        {"system": "flink", "mode": "rocksdb", "records_per_cpu_second": 120_000},
        {"system": "flink", "mode": "forst", "records_per_cpu_second": 90_000},
    ]
}  # fmt: skip


def test_capacities_come_from_compare_json_with_their_source() -> None:
    caps = capacities({}, COMPARE, Path("t.json"), Path("c.json"))
    assert caps["keyshift"].records_per_cpu_second == 55_000
    assert caps["keyshift"].source == (
        "c.json: throughput[system=keyshift, mode=valkey].records_per_cpu_second"
    )
    assert caps["keyshift+valkey"].records_per_cpu_second == 48_000
    assert caps["flink"].name == "flink/rocksdb"  # the best Flink mode per CPU second
    assert caps["flink"].records_per_cpu_second == 120_000
    assert "forst 90,000" in caps["flink"].source


def test_keyshift_capacity_falls_back_to_throughput_json() -> None:
    compare = {"throughput": [r for r in COMPARE["throughput"] if r["system"] == "flink"]}
    throughput = {"rows": [{"mode": "valkey", "records_per_cpu_second": 40_000}]}
    caps = capacities(throughput, compare, Path("t.json"), Path("c.json"))
    assert caps["keyshift"].records_per_cpu_second == 40_000
    assert caps["keyshift"].source.startswith("t.json: rows[mode=valkey]")
    assert "keyshift+valkey" not in caps


def test_no_flink_cpu_figure_is_an_error() -> None:
    compare = {"throughput": [{"system": "flink", "mode": "rocksdb", "records_per_second": 1}]}
    with pytest.raises(ValueError, match="no Flink row"):
        capacities({"rows": [{"mode": "valkey", "records_per_cpu_second": 1}]}, compare)


def test_price_is_worker_hours_times_cores() -> None:
    assert price({"worker_hours": 12.5}) == 12.5
    assert price({"worker_hours": 12.5}, cores_per_worker=2.0) == 25.0


def test_targets() -> None:
    hours = {
        "sine": {"keyshift": 40.0, "flink": 50.0, "flink-static": 80.0},
        "step": {"keyshift": 9.0, "flink": 8.0, "flink-static": 10.0},
    }
    t = targets(hours)
    assert t["sine"] == {
        "vs_flink_autoscaler": 0.8, "below_flink_autoscaler": True,
        "vs_flink_static": 0.5, "at_most_half_of_flink_static": True,
    }  # fmt: skip
    assert not t["step"]["below_flink_autoscaler"]
    assert not t["step"]["at_most_half_of_flink_static"]


def test_static_parallelism_covers_the_peak_at_the_utilization() -> None:
    model = JobModel(key_groups=128, worker_capacity=1000.0)
    # 8,000 / 0.7 = 11,429 records/s: ranges of at most 11 key groups -> 12 workers
    assert static_parallelism(8000.0, model, 0.7) == 12
    assert model.capacity(12) * 0.7 >= 8000.0 > model.capacity(11) * 0.7
    assert static_parallelism(1e9, model, 0.7) == 128


def test_business_hours_trace_is_idle_at_night() -> None:
    trace = business_hours_trace(peak=1000.0)
    assert trace.shape(3 * 3600.0) == pytest.approx(10.0)  # a 1% trickle
    assert trace.shape(8 * 3600.0) == pytest.approx(505.0)  # half way up the ramp
    assert trace.shape(12 * 3600.0) == 1000.0
    assert trace.shape(22 * 3600.0) == pytest.approx(10.0)
    assert peak_load(trace) == 1000.0


def test_cpu_over_a_window_is_interpolated_between_samples() -> None:
    from benchmarks.peers.flink.measure import interpolate, rate_after_warmup

    samples = [(10.0, 1.0), (10.5, 1.5), (11.0, 1.6)]
    assert interpolate(samples, 10.25) == pytest.approx(1.25)
    assert interpolate(samples, 10.75) == pytest.approx(1.55)
    assert interpolate(samples, 9.0) == 1.0 and interpolate(samples, 12.0) == 1.6
    marks = [(100_000 * i, 100.0 + i) for i in range(1, 11)]
    r = rate_after_warmup(marks, 1_000_000, 0.4)
    assert r["window"] == (104.0, 110.0)
    assert r["records_measured"] == 600_000 and r["records_per_second"] == 100_000
