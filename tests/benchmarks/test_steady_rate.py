"""benchmarks/steady_rate.py: what its table says, from the rounds' figures."""

from __future__ import annotations

from pathlib import Path

from benchmarks.steady_rate import checkout_path, summarise, table
from hatch_build import COMPONENTS


def run(checkout: str, rate: float, cpu_ms: float, gap_ms: float, full: int) -> dict[str, object]:
    return {
        "rate": rate, "checkout": checkout, "records": int(rate * 10), "seconds": 10.0,
        "worker_cpu_seconds": cpu_ms * rate / 100_000, "store_cpu_seconds": 0.5,
        "cpu_ms_per_1000_records": cpu_ms, "store_cpu_ms_per_1000_records": 50.0,
        "worker_cores": cpu_ms * rate / 1e6,
        "gap_median_ms": gap_ms / 2, "gap_max_ms": gap_ms, "full_collections": full,
        "longest_full_collection_le": None,
    }  # fmt: skip


def test_rounds_are_summarised_per_checkout_and_rate_by_their_medians() -> None:
    runs = [
        run("this", 2000, 180, 30, 0), run("old", 2000, 250, 35, 0),
        run("this", 2000, 170, 90, 1), run("old", 2000, 260, 36, 0),
        run("this", 2000, 190, 20, 0), run("old", 2000, 240, 200, 2),
    ]  # fmt: skip
    rows = {r["checkout"]: r for r in summarise(runs)}
    assert rows["this"]["cpu_ms_per_1000_records"] == 180
    assert rows["old"]["cpu_ms_per_1000_records"] == 250
    assert rows["this"]["gap_max_ms"] == 30  # the median round, not the worst
    assert (rows["this"]["full_collections"], rows["old"]["full_collections"]) == (1, 2)
    assert rows["this"]["rounds"] == 3
    text = table(summarise(runs))
    assert "| this | 2,000 | 180 |" in text and "| old | 2,000 | 250 |" in text


def test_another_checkout_runs_its_own_packages(tmp_path: Path) -> None:
    path = checkout_path(tmp_path).split(":")
    assert path == [str(tmp_path.resolve() / p) for p in COMPONENTS]
