"""The examples' job code, each over a handful of records in the test harness
(``keyshift.runtime.testing``): their exact outputs, side outputs and state, with the
manifests' ``outOfOrderness``."""

from __future__ import annotations

from typing import Any

import pytest

from examples import busy_counter, counter, revenue_per_minute, sessions
from keyshift.api.spec import load_manifest
from keyshift.runtime.api import Job, load_job
from keyshift.runtime.sources.generator import Event
from keyshift.runtime.testing import JobHarness
from tests.support import REPO


def ooo_ms(manifest: str) -> int:
    return round(load_manifest(REPO / "examples" / manifest).spec.time.out_of_orderness * 1000)


@pytest.mark.parametrize(
    ("manifest", "job"),
    [("counter.yaml", counter.job), ("quickstart.yaml", busy_counter.job)],
    ids=["counter", "quickstart"],
)
def test_the_counters_count_and_sum_per_key(manifest: str, job: Job[Event]) -> None:
    """``examples/counter.py``, and ``busy_counter.py`` (the quickstart's): the same state
    and outputs."""
    assert load_job(load_manifest(REPO / "examples" / manifest).spec.job) is job
    h = JobHarness(job)
    outputs = h.run([Event("a", 3), Event("b", 5), Event("a", 4)])
    assert outputs == [
        (None, {"key": "a", "count": 1, "total": 3}),
        (None, {"key": "b", "count": 1, "total": 5}),
        (None, {"key": "a", "count": 2, "total": 7}),
    ]
    assert h.state(counter.count, "a") == 2 and h.state(counter.total, "a") == 7
    assert h.state("count", "b") == 1 and h.state("total", "b") == 5
    assert h.state(counter.count, "never-seen") == 0  # the default
    assert h.keys() == ["a", "b"] and h.timers() == []


def test_the_counter_decodes_kafka_values_as_json_events() -> None:
    """``examples/kafka/counter.yaml`` reads JSON ``Event`` values with the job's ``decode``."""
    assert counter.job.decode is not None
    assert counter.job.decode(b'{"key": "a", "value": 3}') == Event("a", 3)
    with pytest.raises(ValueError, match="value"):  # poison: onPoison decides
        counter.job.decode(b'{"key": "a"}')


def revenue(product: str, start: int, revenue: int, orders: int) -> dict[str, Any]:
    return {
        "product": product, "window_start": start, "window_end": start + 60_000,
        "revenue": revenue, "orders": orders,
    }  # fmt: skip


def test_revenue_per_minute_fires_each_minute_again_when_late_and_routes_late_orders() -> None:
    h = JobHarness(revenue_per_minute.job, out_of_orderness_ms=ooo_ms("revenue_per_minute.yaml"))
    orders = [Event("apple", 250), Event("pear", 40), Event("apple", 100)]
    h.run(orders, timestamps=[1_000, 30_000, 59_000])
    assert h.outputs == [] and h.watermark == 57_000  # not yet the minute's end
    # 62.5 s: the watermark passes 59.999 s, the first minute fires (timers in key order:
    # keys are compared as msgpack, where the shorter string comes first)
    assert h.process(Event("apple", 75), timestamp=62_500) == [
        (None, revenue("pear", 0, 40, 1)),
        (None, revenue("apple", 0, 350, 2)),
    ]
    # within the 5 s of lateness: the minute is updated and emitted again at once
    assert h.process(Event("apple", 30), timestamp=58_000) == [
        (None, revenue("apple", 0, 380, 3)),
    ]
    assert h.state("windows", "apple").keys() == {0, 60_000}
    h.process(Event("pear", 10), timestamp=70_000)  # the watermark (68 s) drops minute 0
    assert h.state("windows", "apple").keys() == {60_000}
    assert h.process(Event("apple", 20), timestamp=1_000) == [("late", Event("apple", 20))]
    assert h.end_input() == [
        (None, revenue("pear", 60_000, 10, 1)),
        (None, revenue("apple", 60_000, 75, 1)),
    ]
    assert h.output("late") == [Event("apple", 20)]
    assert h.keys() == [] and h.timers() == []  # every window and timer is gone


def session(user: str, start: int, end: int, events: int, total: int) -> dict[str, Any]:
    return {"user": user, "start": start, "end": end, "events": events, "total": total}


def test_sessions_close_after_the_gap_merge_and_route_late_actions() -> None:
    h = JobHarness(sessions.job, out_of_orderness_ms=ooo_ms("sessions.yaml"))
    h.run([Event("u1", 5), Event("u2", 7), Event("u1", 3)], timestamps=[0, 10_000, 20_000])
    assert h.output() == []
    # 53 s (watermark 51 s): u2's [10 s, 40 s) and u1's [0 s, 50 s) have ended
    assert h.process(Event("u1", 2), timestamp=53_000) == [
        (None, session("u2", 10_000, 40_000, 1, 7)),
        (None, session("u1", 0, 50_000, 2, 8)),
    ]
    # within the lateness, 45 s bridges u1's two sessions: one session, not yet due
    assert h.process(Event("u1", 1), timestamp=45_000) == []
    assert list(h.state("windows", "u1")) == [0]
    assert h.process(Event("u1", 1), timestamp=120_000) == [
        (None, session("u1", 0, 83_000, 4, 11)),
    ]
    assert h.process(Event("u2", 2), timestamp=5_000) == [("late", Event("u2", 2))]
    assert h.end_input() == [(None, session("u1", 120_000, 150_000, 1, 1))]
    assert h.keys() == [] and h.timers() == []
