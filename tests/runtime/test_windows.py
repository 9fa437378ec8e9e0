"""Windows: the pure assigners, merging and aggregates; the window job driven record by
record with a chosen watermark; and the examples' window logic in an in-process worker
against the exact expectation computed from the generator."""

from __future__ import annotations

import asyncio
import operator
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from examples import revenue_per_minute, sessions
from keyshift.api.spec import GeneratorSource, StreamJob, load_manifest
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.api import Job, load_job
from keyshift.runtime.config import settings_from
from keyshift.runtime.expected import revenue_per_minute_results, sessions_results
from keyshift.runtime.sources.generator import Event
from keyshift.runtime.testing import JobHarness, PendingTimer
from keyshift.runtime.timers import END_OF_TIME
from keyshift.runtime.windows import (
    Aggregate,
    Pane,
    Reduce,
    Sessions,
    Sliding,
    Tumbling,
    Window,
    add_value,
    advance,
    merge_windows,
    timer_times,
    window_job,
)
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, MemoryStore
from tests.support import REPO, wait_for

# -- pure: assigners, merging, aggregates ------------------------------------------------


def test_tumbling_windows_are_aligned_to_the_epoch_plus_offset() -> None:
    assert Tumbling(10).assign(0) == [Window(0, 10)]
    assert Tumbling(10).assign(9) == [Window(0, 10)]
    assert Tumbling(10).assign(10) == [Window(10, 20)]
    assert Tumbling(10).assign(-1) == [Window(-10, 0)]
    assert Tumbling(10, offset_ms=3).assign(2) == [Window(-7, 3)]
    assert Tumbling(60_000).assign(1_700_000_099_999) == [
        Window(1_700_000_040_000, 1_700_000_100_000)
    ]


def test_sliding_windows_hold_every_record_size_over_slide_times() -> None:
    assert Sliding(10, 5).assign(7) == [Window(0, 10), Window(5, 15)]
    assert Sliding(10, 5).assign(10) == [Window(5, 15), Window(10, 20)]
    assert Sliding(10, 4).assign(13) == [Window(4, 14), Window(8, 18), Window(12, 22)]
    assert Sliding(10, 10).assign(13) == Tumbling(10).assign(13)
    for ts in range(-30, 30):  # each window returned contains ts, and no other does
        got = Sliding(10, 3, offset_ms=1).assign(ts)
        assert all(w.start <= ts < w.end and (w.start - 1) % 3 == 0 for w in got)
        assert len(got) == len([s for s in range(-50, 50) if (s - 1) % 3 == 0 and s <= ts < s + 10])


def test_assigners_refuse_empty_windows() -> None:
    with pytest.raises(ValueError, match="size_ms"):
        Tumbling(0)
    with pytest.raises(ValueError, match="slide_ms"):
        Sliding(10, 0)
    with pytest.raises(ValueError, match="gap_ms"):
        Sessions(-1)


def test_session_windows_merge_when_they_overlap_or_touch() -> None:
    assert Sessions(10).assign(5) == [Window(5, 15)]
    merged = merge_windows([Window(20, 30), Window(0, 10), Window(10, 12), Window(31, 41)])
    assert merged == [
        (Window(0, 12), [Window(0, 10), Window(10, 12)]),
        (Window(20, 30), [Window(20, 30)]),
        (Window(31, 41), [Window(31, 41)]),
    ]
    # a window bridging two others merges all three
    bridged = merge_windows([Window(0, 10), Window(20, 30), Window(8, 22)])
    assert bridged == [(Window(0, 30), [Window(0, 10), Window(8, 22), Window(20, 30)])]


def test_reduce_and_aggregate() -> None:
    r: Reduce[int] = Reduce(max, int)
    acc = r.create()
    for v in [3, 9, 4]:
        acc = r.add(acc, v)
    assert r.result(acc) == 9
    assert r.merge(r.create(), 5) == 5 and r.merge(5, r.create()) == 5 and r.merge(5, 7) == 7
    mean: Aggregate[int, list[int], float] = Aggregate(
        create=lambda: [0, 0],
        add=lambda a, v: [a[0] + v, a[1] + 1],
        merge=lambda a, b: [a[0] + b[0], a[1] + b[1]],
        result=lambda a: a[0] / a[1],
    )
    left = mean.add(mean.add(mean.create(), 1), 2)
    assert mean.result(mean.merge(left, mean.add(mean.create(), 6))) == 3.0


# -- pure: the decisions ---------------------------------------------------------------------

add = Reduce(operator.add, int)


def test_a_record_is_late_exactly_when_its_window_is_past_cleanup() -> None:
    """Window [0, 10) fires at 9 and, with lateness 5, is dropped at 14."""
    panes = {0: Pane(10, 1, fired=True)}
    kept = add_value(panes, Tumbling(10), add, 2, 5, 13, 5)
    assert not kept.late
    assert kept.panes == {0: Pane(10, 3, fired=True)}
    assert kept.emit == [Window(0, 10)]  # a late firing
    dropped = add_value(panes, Tumbling(10), add, 2, 5, 14, 5)
    assert dropped.late and dropped.panes == panes and dropped.emit == []
    on_time = add_value({}, Tumbling(10), add, 2, 5, 8, 5)
    assert on_time.panes == {0: Pane(10, 2)} and on_time.emit == []
    assert not add_value({}, Tumbling(10), add, 2, 5, None, 0).late  # no watermark yet


def test_advance_fires_once_and_drops_after_the_lateness() -> None:
    panes = {0: Pane(10, 1), 10: Pane(20, 2)}
    assert timer_times(panes, 5) == {9, 14, 19, 24}
    fired, emit = advance(panes, 9, 5)
    assert emit == [Window(0, 10)]
    assert fired == {0: Pane(10, 1, fired=True), 10: Pane(20, 2)}
    assert timer_times(fired, 5) == {14, 19, 24}
    again, emit = advance(fired, 13, 5)
    assert emit == [] and again == fired
    cleaned, emit = advance(fired, 19, 5)
    assert emit == [Window(10, 20)] and cleaned == {10: Pane(20, 2, fired=True)}
    assert advance(panes, END_OF_TIME, 5) == ({}, [Window(0, 10), Window(10, 20)])


# -- the job, driven record by record in the harness (keyshift.runtime.testing) -------------


def _job(windows: Any, aggregate: Any = add, **kwargs: Any) -> Job[Event]:
    return window_job(
        name="w", key_by=lambda e: e.key, value=lambda e: e.value, windows=windows,
        aggregate=aggregate, **kwargs,
    )  # fmt: skip


def feed(h: JobHarness[Event], *records: tuple[str, int, int]) -> None:
    """Process ``Event(key, value)`` at event time ``ts`` for each ``(key, ts, value)``."""
    for key, ts, value in records:
        h.process(Event(key, value), timestamp=ts)


def result(key: str, start: int, end: int, value: Any) -> tuple[None, dict[str, Any]]:
    return (None, {"key": key, "start": start, "end": end, "value": value})


def test_tumbling_fires_late_fires_and_routes_late_records() -> None:
    h = JobHarness(_job(Tumbling(10), allowed_lateness_ms=5))
    feed(h, ("a", 1, 1), ("a", 12, 2))  # watermark 12: [0, 10) fires
    assert h.outputs == [result("a", 0, 10, 1)]
    feed(h, ("a", 5, 4))  # after the firing, within the lateness: fired again at once
    feed(h, ("a", 15, 8))  # watermark 15: [0, 10) is dropped
    feed(h, ("a", 3, 16))  # late: its window is gone
    feed(h, ("b", 11, 32))
    h.end_input()
    assert h.outputs == [
        result("a", 0, 10, 1),
        result("a", 0, 10, 5),
        ("late", Event("a", 16)),
        result("a", 10, 20, 10),
        result("b", 10, 20, 32),
    ]
    assert h.keys() == [] and h.timers() == []  # nothing left behind


def test_out_of_orderness_holds_the_window_open() -> None:
    h = JobHarness(_job(Tumbling(10)), out_of_orderness_ms=5)
    feed(h, ("a", 1, 1), ("a", 12, 2), ("a", 8, 4))  # watermark 7: still open
    assert h.outputs == [] and h.watermark == 7
    feed(h, ("a", 14, 8))  # watermark 9: fires with all three
    assert h.outputs == [result("a", 0, 10, 5)]
    feed(h, ("a", 9, 16))  # watermark 9 is its window's cleanup time (lateness 0): late
    h.end_input()
    assert h.outputs == [
        result("a", 0, 10, 5),
        ("late", Event("a", 16)),
        result("a", 10, 20, 10),
    ]


def test_sliding_counts_each_record_in_each_open_window() -> None:
    count: Aggregate[Any, int, int] = Aggregate(
        create=lambda: 0, add=lambda a, _: a + 1, merge=operator.add, result=lambda a: a
    )
    h = JobHarness(_job(Sliding(10, 5), count))
    feed(h, ("a", 3, 1), ("a", 7, 1), ("a", 12, 1))  # watermark 12: [-5, 5), [0, 10)
    feed(h, ("a", 6, 1))  # [0, 10) is past cleanup, [5, 15) is not: counted there, not late
    h.end_input()
    assert h.outputs == [
        result("a", -5, 5, 1),
        result("a", 0, 10, 2),
        result("a", 5, 15, 3),
        result("a", 10, 20, 1),
    ]


def test_sessions_merge_fire_again_and_never_join_a_dropped_session() -> None:
    h = JobHarness(_job(Sessions(10), allowed_lateness_ms=20))
    feed(h, ("u", 0, 1), ("u", 25, 2))  # watermark 25: [0, 10) fires
    feed(h, ("u", 12, 4))  # a session of its own, already due: fires at once
    feed(h, ("u", 10, 8))  # bridges [0, 10) and [12, 22): one session, fired again
    assert h.outputs == [
        result("u", 0, 10, 1),
        result("u", 12, 22, 4),
        result("u", 0, 22, 13),
    ]
    assert h.state("windows", "u") == {0: Pane(22, 13, fired=True), 25: Pane(35, 2)}
    assert timer_times(h.state("windows", "u"), 20) == {34, 41, 54}
    # and 29, of [0, 10) merged away: it will fire for nothing
    assert [t.time for t in h.timers()] == [29, 34, 41, 54]
    feed(h, ("u", 60, 16))  # watermark 60: [25, 35) fires; it and [0, 22) are dropped
    feed(h, ("u", 30, 32))  # [30, 40) would be dropped at 59: late
    feed(h, ("u", 35, 64))  # [35, 45): touches the dropped [25, 35) but cannot join it
    h.end_input()
    assert h.outputs[3:] == [
        result("u", 25, 35, 2),
        ("late", Event("u", 32)),
        result("u", 35, 45, 64),
        result("u", 60, 70, 16),
    ]
    assert h.keys() == [] and h.timers() == []


def test_without_lateness_a_window_fires_and_goes_at_once_and_late_can_be_dropped() -> None:
    h = JobHarness(_job(Tumbling(10), late_output=None))
    feed(h, ("a", 1, 1), ("a", 10, 2))  # watermark 10: [0, 10) fires and is dropped
    assert h.outputs == [result("a", 0, 10, 1)]
    assert h.timers() == [PendingTimer("event", 19, "a", None)]
    feed(h, ("a", 9, 4))  # late, and no side output: gone without an output
    h.end_input()
    assert h.outputs == [result("a", 0, 10, 1), result("a", 10, 20, 2)]


def test_processing_time_windows_use_the_clock_and_processing_time_timers() -> None:
    h = JobHarness(_job(Tumbling(3_600_000), time="processing"))
    before = int(time.time() * 1000)
    for v in (1, 2, 4):
        h.process(Event("a", v), timestamp=0)  # the event time 0 is ignored
    after = int(time.time() * 1000)
    assert {t.domain for t in h.timers()} == {"processing"}
    h.end_input()
    assert h.outputs == []
    h.advance_processing_time(after + 3_600_000)
    ((_, out),) = h.outputs
    assert out["start"] <= before <= after < out["end"] and out["value"] == 7
    assert h.keys() == [] and h.timers() == []


def test_window_job_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="allowed_lateness_ms"):
        _job(Tumbling(10), allowed_lateness_ms=-1)


# -- the examples' windows in an in-process worker -------------------------------------------


@pytest.mark.parametrize("path", ["examples/revenue_per_minute.yaml", "examples/sessions.yaml"])
def test_example_manifests_load_and_name_their_window_jobs(path: str) -> None:
    m = load_manifest(REPO / path)
    job = load_job(m.spec.job)
    assert job.on_timer is not None and job.state_names == ["windows"]
    assert "late" in m.spec.side_outputs
    assert isinstance(m.spec.source, GeneratorSource) and m.spec.source.limit is not None


K, LIMIT, OOO_MS = 2, 800, 10


def _manifest(tmp_path: Path, job: str) -> StreamJob:
    return StreamJob.model_validate(
        {
            "metadata": {"name": "win"},
            "spec": {
                "job": job,
                "keyGroups": K,
                "source": {
                    "seed": 11,
                    "keys": 12,
                    "limit": LIMIT,
                    "disorder": "60ms",
                    "rate": {"recordsPerSecond": 4000},
                },
                "sink": {"type": "log", "path": "out.jsonl"},
                "sideOutputs": {"late": {"type": "log", "path": "late.jsonl"}},
                "checkpointInterval": "50ms",
                "batchSize": 40,
                "time": {"outOfOrderness": f"{OOO_MS}ms"},
            },
        }
    )


async def _run_to_end(m: StreamJob, job: Job[Any], output_dir: Path) -> tuple[float, float | None]:
    """Run one worker over the whole bounded input (its outputs in ``output_dir``); return
    the job's ``created_at`` and the worker's count of outputs to the side output
    ``late``."""
    store = MemoryStore()
    info = await store.init_job("win", K)
    await store.publish_assignment(
        "win", Assignment(1, 1, plan_assignment(K, 1)), expected_generation=0
    )
    settings = settings_from(m, ordinal=0, store_url="memory://", output_dir=output_dir)
    worker = Worker(settings, job, store)
    task = asyncio.create_task(worker.run())
    try:

        async def done() -> bool:
            infos = [await store.key_group_info("win", kg) for kg in range(K)]
            return all(i.position == LIMIT and i.timers == 0 for i in infos)

        await wait_for(done, 30, "every record and every window", interval=0.02)
    finally:
        worker.stop()
        async with asyncio.timeout(30):
            await task
    labels = {**worker.metrics.labels, "output": "late"}
    counted = worker.metrics.registry.get_sample_value("keyshift_side_output_records_total", labels)
    return info.created_at, counted


def _lines(path: Path) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines()]


async def test_revenue_windows_in_a_worker_are_exact(tmp_path: Path) -> None:
    """Windows of 50 ms (the example's aggregate and result): with one worker and no crash
    every firing is written once, so the last result per window is its final one."""
    window_ms, lateness_ms = 50, 20
    job = window_job(
        name="win", key_by=lambda e: e.key, value=revenue_per_minute.order_amount,
        windows=Tumbling(window_ms), aggregate=revenue_per_minute.revenue_and_orders,
        result=revenue_per_minute.result, allowed_lateness_ms=lateness_ms,
    )  # fmt: skip
    m = _manifest(tmp_path, "examples.revenue_per_minute:job")
    created_at, late_counted = await _run_to_end(m, job, tmp_path)
    source = m.spec.generator
    assert isinstance(source, GeneratorSource)
    final: dict[tuple[int, str, int], dict[str, Any]] = {}
    for out in _lines(tmp_path / "out.jsonl"):
        v = out["value"]
        final[(out["key_group"], v["product"], v["window_start"])] = v
    late = sorted((out["key_group"], out["offset"]) for out in _lines(tmp_path / "late.jsonl"))
    expected_late: list[tuple[int, int]] = []
    for kg in range(K):
        expected = revenue_per_minute_results(
            source, K, kg, LIMIT, created_at=created_at, out_of_orderness_ms=OOO_MS,
            window_ms=window_ms, lateness_ms=lateness_ms,
        )  # fmt: skip
        got = [v for (g, _, _), v in sorted(final.items()) if g == kg]
        assert got == expected.results, f"key group {kg}"
        assert sum(r["orders"] for r in got) + len(expected.late) == LIMIT
        expected_late += [(kg, offset) for offset in expected.late]
    assert expected_late, "the input had no late record: the test proves less than it says"
    assert late == expected_late
    assert late_counted == len(late)  # keyshift_side_output_records_total{output="late"}


async def test_session_windows_in_a_worker_are_exact(tmp_path: Path) -> None:
    """Sessions with a gap of 15 ms (the example's aggregate and result).  A session that
    fired and was then merged into a larger one was superseded: the final sessions are the
    emitted windows no other emitted window of the user contains."""
    gap_ms, lateness_ms = 15, 20
    job = window_job(
        name="win", key_by=lambda e: e.key, value=sessions.score, windows=Sessions(gap_ms),
        aggregate=sessions.events_and_total, result=sessions.result,
        allowed_lateness_ms=lateness_ms,
    )  # fmt: skip
    m = _manifest(tmp_path, "examples.sessions:job")
    created_at, late_counted = await _run_to_end(m, job, tmp_path)
    source = m.spec.generator
    assert isinstance(source, GeneratorSource)
    outputs = [(o["key_group"], o["value"]) for o in _lines(tmp_path / "out.jsonl")]
    late = sorted((out["key_group"], out["offset"]) for out in _lines(tmp_path / "late.jsonl"))
    expected_late: list[tuple[int, int]] = []
    merged_sessions = 0
    for kg in range(K):
        expected = sessions_results(
            source, K, kg, LIMIT, created_at=created_at, out_of_orderness_ms=OOO_MS,
            gap_ms=gap_ms, lateness_ms=lateness_ms,
        )  # fmt: skip
        emitted = [v for g, v in outputs if g == kg]
        assert final_sessions(emitted) == expected.results, f"key group {kg}"
        merged_sessions += len(emitted) - len(expected.results)
        expected_late += [(kg, offset) for offset in expected.late]
    assert expected_late and merged_sessions, "no late record or no late firing in the input"
    assert late == expected_late
    assert late_counted == len(late)  # keyshift_side_output_records_total{output="late"}


def final_sessions(emitted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per user and window the result with the most events (it grows with each firing),
    without the windows another emitted window of the user contains (merged into it)."""
    best: dict[tuple[str, int, int], dict[str, Any]] = {}
    for v in emitted:
        k = (v["user"], v["start"], v["end"])
        if k not in best or v["events"] > best[k]["events"]:
            best[k] = v
    return [
        v
        for (user, start, end), v in sorted(best.items())
        if not any(
            u == user and s <= start and end <= e and (s, e) != (start, end) for u, s, e in best
        )
    ]
