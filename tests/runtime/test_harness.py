"""The job test harness (``keyshift.runtime.testing``) keeps the worker's semantics: a
record or timer is atomic, event time only for a job with timers, the watermark trails
the event times and never goes back, timers fire in (time, key) order with the timer's
key current, and state reads back decoded.  (The windows' tests in ``test_windows.py`` and
the examples' in ``tests/examples`` use it too.)"""

from __future__ import annotations

from typing import Any

import pytest

from keyshift.runtime.api import Context, Job, ListState, MapState, ValueState
from keyshift.runtime.testing import END_OF_TIME, JobHarness, PendingTimer
from keyshift.runtime.timers import FiredTimer

seen = ListState("seen", int)
counts = MapState("counts", str, int)
last = ValueState("last", int)


def remember(record: tuple[str, int], ctx: Context) -> None:
    """Appends the value, counts it by parity, registers an event-time timer 10 ms after
    it; a value of 0 raises after all of that."""
    key, value = record
    ctx.state(seen).append(value)
    parity = ctx.state(counts)
    name = "even" if value % 2 == 0 else "odd"
    parity.put(name, (parity.get(name) or 0) + 1)
    assert parity.get(name) is not None  # a record reads its own writes
    ctx.emit({"key": key, "value": value, "timestamp": ctx.timestamp})
    ctx.timers.register_event_time(value + 10, payload=f"after {value}")
    if value == 0:
        raise ZeroDivisionError("no zeros")


def report(timer: FiredTimer, ctx: Context) -> None:
    ctx.emit(
        (ctx.key, timer.time, timer.payload, ctx.timestamp, ctx.offset, ctx.watermark),
        output="timers",
    )
    ctx.state(last).update(timer.time)


job: Job[tuple[str, int]] = Job(
    name="remember", process=remember, key_by=lambda r: r[0],
    states=[seen, counts, last], on_timer=report,
)  # fmt: skip


def test_a_record_that_raises_leaves_no_state_output_or_timer() -> None:
    h = JobHarness(job, out_of_orderness_ms=100)
    h.process(("a", 1), timestamp=1)
    with pytest.raises(ZeroDivisionError, match="no zeros"):
        h.process(("a", 0), timestamp=500)
    assert h.output() == [{"key": "a", "value": 1, "timestamp": 1}]
    assert h.state(seen, "a") == [1] and h.state("counts", "a") == {"odd": 1}
    assert h.timers() == [PendingTimer("event", 11, "a", "after 1")]
    assert h.offset == 1 and h.watermark == -99  # the failed record moved nothing
    h.process(("b", 2), timestamp=2)  # and the harness goes on
    assert h.offset == 2 and h.state(seen, "b") == [2] and h.keys(seen) == ["a", "b"]
    assert h.state(last, "a") is None and h.state(counts, "nobody") == {}
    with pytest.raises(KeyError, match="no state 'nope'"):
        h.state("nope", "a")


def test_timers_fire_in_time_then_key_order_once_the_watermark_passes_them() -> None:
    h = JobHarness(job, out_of_orderness_ms=5)
    h.run([("b", 3), ("a", 3), ("a", 7)], timestamps=[3, 3, 7])
    assert h.output("timers") == [] and h.watermark == 2
    # b's and a's timers at 13, a's at 17; 20 - 5 passes the first two only
    assert h.process(("c", 20), timestamp=20)[1:] == [
        ("timers", ("a", 13, "after 3", 13, 4, 15)),
        ("timers", ("b", 13, "after 3", 13, 4, 15)),
    ]
    assert h.advance_watermark(1) == []  # never back
    assert h.watermark == 15
    assert h.advance_watermark(17) == [("timers", ("a", 17, "after 7", 17, 4, 17))]
    assert h.state(last, "a") == 17 and h.state(last, "b") == 13
    assert [t.key for t in h.timers()] == ["c"]
    h.end_input()
    assert h.watermark == END_OF_TIME and h.timers() == []


def test_the_timestamp_extractor_wins_and_a_job_without_timers_has_no_event_time() -> None:
    stamped = Job(
        name="stamped", process=remember, key_by=lambda r: r[0], states=[seen, counts],
        on_timer=lambda t, ctx: None, timestamp=lambda r: r[1] * 1000,
    )  # fmt: skip
    h = JobHarness(stamped)
    assert h.process(("a", 3), timestamp=5) == [(None, {"key": "a", "value": 3, "timestamp": 3000})]
    assert h.watermark == 3000
    untimed = Job(name="untimed", process=remember, key_by=lambda r: r[0], states=[seen, counts])
    u = JobHarness(untimed)
    assert u.process(("a", 3), timestamp=5) == [(None, {"key": "a", "value": 3, "timestamp": None})]
    assert u.watermark is None
    assert u.timers() == [PendingTimer("event", 13, "a", "after 3")]  # registered, never fired
    assert u.end_input() == [] and len(u.timers()) == 1


def test_processing_time_timers_fire_when_the_clock_is_advanced() -> None:
    def process(record: tuple[str, int], ctx: Context) -> None:
        ctx.timers.register_processing_time(record[1], payload=record[1])
        ctx.timers.register_processing_time(record[1], payload="replaced")  # one per time
        ctx.timers.register_processing_time(record[1] + 1)
        ctx.timers.delete_processing_time(record[1] + 1)

    def on_timer(timer: FiredTimer, ctx: Context) -> None:
        if timer.payload == "boom":
            raise RuntimeError("boom")
        ctx.emit((timer.domain, ctx.key, timer.time, timer.payload))

    h = JobHarness(Job(name="p", process=process, key_by=lambda r: r[0], on_timer=on_timer),
                   processing_time_ms=1_000)  # fmt: skip
    h.run([("x", 1_500), ("y", 1_200), ("z", 3_000)])
    assert h.processing_time == 1_000 and h.watermark is None
    assert h.advance_processing_time(2_000) == [
        (None, ("processing", "y", 1_200, "replaced")),
        (None, ("processing", "x", 1_500, "replaced")),
    ]
    assert h.advance_processing_time(500) == [] and h.processing_time == 2_000
    assert h.timers("processing") == [PendingTimer("processing", 3_000, "z", "replaced")]
    assert h.timers("event") == []


def test_a_timer_that_raises_stays_and_undeclared_state_is_refused() -> None:
    def process(record: str, ctx: Context) -> None:
        ctx.timers.register_event_time(5, payload=record)
        if record == "undeclared":
            ctx.state(last)

    def on_timer(timer: FiredTimer, ctx: Context) -> None:
        raise RuntimeError(f"timer of {ctx.key}")

    h: JobHarness[Any] = JobHarness(
        Job(name="t", process=process, key_by=lambda r: r, on_timer=on_timer)
    )
    with pytest.raises(ValueError, match="state 'last' is not declared"):
        h.process("undeclared", timestamp=0)
    h.process("k", timestamp=0)
    with pytest.raises(RuntimeError, match="timer of k"):
        h.advance_watermark(10)
    assert h.timers() == [PendingTimer("event", 5, "k", "k")]
    with pytest.raises(ValueError, match="2 records but 1 timestamps"):
        h.run(["a", "b"], timestamps=[1])
