"""The soak's short form (3 minutes): a local ``keyshift run`` with four workers, a
varying load, the autoscaler on and a manual rescale or a worker SIGKILL every 20 s
(``benchmarks/soak.py``). The final state must be exact, nothing lost, every key
group owned as assigned, the workers' memory bounded by their cache plus a fixed
overhead and not growing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import SoakConfig, machine_pauses, run_soak, summary_lines

MINUTES = 3.0


@pytest.mark.slow
def test_three_minutes_of_faults_leave_the_state_exact(tmp_path: Path) -> None:
    config = SoakConfig(minutes=MINUTES)
    result = run_soak(config, tmp_path)
    report = "\n".join(summary_lines(result))
    print(report)

    assert result["state_mismatches"] == 0, report
    assert result["lost_records"] == 0, report
    assert result["records_processed"] == result["records_expected"], report
    assert result["ownership_problem"] is None, report
    assert result["exit_code"] == 0, report
    assert result["max_worker_rss_mib"] <= result["worker_rss_bound_mib"], report
    assert result["worker_rss_trend"]["ok"], report
    # 150 s of input, a fault every 20 s from t=20 to t=140: 4 rescales and 3 kills
    # (fewer if a `keyshift scale --wait` runs into its 60 s timeout)
    assert result["manual_rescales"] >= 2, report
    assert result["kills"] >= 2, report
    assert result["rescale_outcomes"].get("failed", 0) == 0, report
    assert result["rescales_by_reason"].get("failover", 0) >= 1, report
    assert all(result["checks"].values()), report


def test_a_paused_machine_is_told_apart_from_a_stalled_job() -> None:
    """The one-hour run's 31 s "stall": the wall clock jumped 31 s between two samples,
    the monotonic clock 1 s (a VM snapshot stops it).  A clock slewed by NTP is no pause."""
    wall = [1318.85, 1319.85, 1320.85, 1351.88, 1352.87]
    mono = [100.0, 101.0, 102.0, 103.03, 104.02]
    assert machine_pauses(list(zip(wall, mono, strict=True))) == [{"t": 1320.85, "seconds": 30.0}]
    slewed = [(t + 0.3 * i, float(i)) for i, t in enumerate(range(10))]
    assert machine_pauses(slewed) == []
