"""Windows on top of keyed state and timers: tumbling, sliding and session windows.

:func:`window_job` builds an ordinary :class:`~keyshift.runtime.api.Job` that
aggregates each key's records per window and emits one result per window::

    job = window_job(
        name="revenue",
        key_by=lambda e: e.key,
        value=lambda e: e.value,
        windows=Tumbling(60_000),
        aggregate=Reduce(operator.add, int),
        result=lambda key, window, total: {"key": key, "start": window.start, "total": total},
        allowed_lateness_ms=5_000,
    )

Semantics (Flink's, in event time).  A window ``[start, end)`` fires when the
watermark reaches ``end - 1``: its result is emitted.  Until the watermark
reaches ``end - 1 + allowed_lateness_ms`` (its *cleanup time*) the window is
kept: a record for it still updates it and, the window having fired, emits the
updated result at once (a late firing).  After the cleanup time the window is
gone; a record whose windows are all past their cleanup time is *late*: it is
not aggregated, and it is emitted to the side output ``late_output`` (counted
by the runtime, and written to ``spec.sideOutputs.<name>`` when configured).

Session windows merge: a record at ``t`` opens ``[t, t + gap)``, and windows of
a key that overlap or touch become one; the merged window fires again when due.

State: one :class:`~keyshift.runtime.api.MapState` per key, window start ->
:class:`Pane` (end, accumulator, fired).  Timers: one event-time timer per
distinct firing or cleanup time of the key's windows (those of windows merged away
stay, and fire for nothing).  The decisions are pure functions (:func:`add_value`,
:func:`advance`, :func:`timer_times`).
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, cast

import msgspec

from keyshift.runtime.api import Context, Job, MapState
from keyshift.runtime.timers import FiredTimer

R = TypeVar("R")
IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")
IN_contra = TypeVar("IN_contra", contravariant=True)
OUT_co = TypeVar("OUT_co", covariant=True)


# -- windows and assigners -------------------------------------------------------------


@dataclass(frozen=True, order=True, slots=True)
class Window:
    """The event times ``[start, end)`` (milliseconds)."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        """The last time in the window: it fires when the watermark reaches this."""
        return self.end - 1

    def intersects(self, other: Window) -> bool:
        """Overlapping or touching (session windows that do merge)."""
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: Window) -> Window:
        return Window(min(self.start, other.start), max(self.end, other.end))


class WindowAssigner(Protocol):
    merging: ClassVar[bool]

    def assign(self, timestamp: int) -> list[Window]:
        """The windows a record with this event time belongs to, by start."""
        ...


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")


@dataclass(frozen=True)
class Tumbling:
    """Fixed, non-overlapping windows of ``size_ms``, aligned to the epoch plus ``offset_ms``."""

    size_ms: int
    offset_ms: int = 0
    merging: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _positive(size_ms=self.size_ms)

    def assign(self, timestamp: int) -> list[Window]:
        start = timestamp - (timestamp - self.offset_ms) % self.size_ms
        return [Window(start, start + self.size_ms)]


@dataclass(frozen=True)
class Sliding:
    """Windows of ``size_ms`` starting every ``slide_ms``: a record is in ``ceil(size/slide)``
    of them (fewer if ``slide_ms`` does not divide ``size_ms``)."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0
    merging: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _positive(size_ms=self.size_ms, slide_ms=self.slide_ms)

    def assign(self, timestamp: int) -> list[Window]:
        last = timestamp - (timestamp - self.offset_ms) % self.slide_ms
        starts = range(last, timestamp - self.size_ms, -self.slide_ms)
        return [Window(s, s + self.size_ms) for s in reversed(starts)]


@dataclass(frozen=True)
class Sessions:
    """Per key, records closer than ``gap_ms`` (``<=``) to one another form one session."""

    gap_ms: int
    merging: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _positive(gap_ms=self.gap_ms)

    def assign(self, timestamp: int) -> list[Window]:
        return [Window(timestamp, timestamp + self.gap_ms)]


def merge_windows(windows: Iterable[Window]) -> list[tuple[Window, list[Window]]]:
    """Intersecting windows merged: ``(cover, members)`` for each group, by start."""
    groups: list[tuple[Window, list[Window]]] = []
    for w in sorted(windows):
        if groups and groups[-1][0].intersects(w):
            cover, members = groups[-1]
            groups[-1] = (cover.cover(w), [*members, w])
        else:
            groups.append((w, [w]))
    return groups


# -- aggregate functions ---------------------------------------------------------------


class AggregateFunction(Protocol[IN_contra, ACC, OUT_co]):
    """Flink's AggregateFunction: an accumulator per window."""

    @property
    def accumulator_type(self) -> Any:
        """The accumulator's type as stored (msgpack): ``Any`` keeps plain msgpack values."""
        ...

    def create(self) -> ACC: ...
    def add(self, accumulator: ACC, value: IN_contra) -> ACC: ...
    def merge(self, a: ACC, b: ACC) -> ACC: ...
    def result(self, accumulator: ACC) -> OUT_co: ...


@dataclass(frozen=True)
class Aggregate(Generic[IN, ACC, OUT]):
    """An aggregate from four functions.  Accumulators are stored with msgpack: give
    ``accumulator_type`` to get them back typed (a tuple otherwise comes back a list)."""

    create: Callable[[], ACC]
    add: Callable[[ACC, IN], ACC]
    merge: Callable[[ACC, ACC], ACC]
    result: Callable[[ACC], OUT]
    accumulator_type: Any = Any


@dataclass(frozen=True)
class Reduce(Generic[IN]):
    """Combine a window's values pairwise with ``fn``; the result is a value like the inputs
    (``type``: how it is stored and read back, e.g. ``int`` or an ``msgspec.Struct``)."""

    fn: Callable[[IN, IN], IN]
    type: Any = Any

    @property
    def accumulator_type(self) -> Any:
        return self.type | None

    def create(self) -> IN | None:
        return None

    def add(self, accumulator: IN | None, value: IN) -> IN | None:
        return value if accumulator is None else self.fn(accumulator, value)

    def merge(self, a: IN | None, b: IN | None) -> IN | None:
        if a is None or b is None:
            return b if a is None else a
        return self.fn(a, b)

    def result(self, accumulator: IN | None) -> IN | None:
        return accumulator


# -- the pure decisions ----------------------------------------------------------------


class Pane(msgspec.Struct, Generic[ACC], array_like=True, frozen=True):
    """A window's state: its end (the start is the map key), accumulator, and whether it fired."""

    end: int
    acc: ACC
    fired: bool = False


Panes = dict[int, Pane[Any]]
"""A key's open windows: start -> pane."""


def cleanup_time(window: Window, lateness_ms: int) -> int:
    """When the window is dropped; a record for it at this watermark or later is late."""
    return window.max_timestamp + lateness_ms


def _is_due(time: int, watermark: int | None) -> bool:
    return watermark is not None and time <= watermark


@dataclass(frozen=True)
class Added:
    """The outcome of one record: the key's new panes, and the windows to emit now."""

    panes: Panes
    emit: list[Window]
    late: bool
    """Every window of the record was past its cleanup time: nothing changed."""


def add_value(
    panes: Panes,
    assigner: WindowAssigner,
    aggregate: AggregateFunction[Any, Any, Any],
    value: Any,
    timestamp: int,
    watermark: int | None,
    lateness_ms: int,
) -> Added:
    """Add a record's value to its windows (merging sessions).  A window updated while its
    end is already due (watermark >= end - 1) is emitted at once: a (late) firing."""
    windows = [
        w
        for w in assigner.assign(timestamp)
        if not _is_due(cleanup_time(w, lateness_ms), watermark)
    ]
    if not windows:
        return Added(panes, [], late=True)
    out = dict(panes)
    touched: list[tuple[Window, Any]] = []
    if assigner.merging:
        (new,) = windows
        existing = [Window(start, p.end) for start, p in panes.items()]
        for cover, members in merge_windows([*existing, new]):
            if new in members:
                members.remove(new)  # the others are the key's open windows
                acc = out.pop(members[0].start).acc if members else aggregate.create()
                for m in members[1:]:
                    acc = aggregate.merge(acc, out.pop(m.start).acc)
                touched.append((cover, aggregate.add(acc, value)))
    else:
        for w in windows:
            pane = panes.get(w.start)
            acc = aggregate.create() if pane is None else pane.acc
            touched.append((w, aggregate.add(acc, value)))
    emit: list[Window] = []
    for w, acc in touched:
        due = _is_due(w.max_timestamp, watermark)
        out[w.start] = Pane(w.end, acc, fired=due)
        if due:
            emit.append(w)
    return Added(out, emit, late=False)


def advance(panes: Panes, time: int, lateness_ms: int) -> tuple[Panes, list[Window]]:
    """The event time reached ``time``: windows whose end is due fire (once), and those past
    their cleanup time are dropped.  Returns the new panes and the windows to emit."""
    out: Panes = {}
    emit: list[Window] = []
    for start, pane in sorted(panes.items()):
        w = Window(start, pane.end)
        if not pane.fired and w.max_timestamp <= time:
            emit.append(w)
            pane = Pane(pane.end, pane.acc, fired=True)
        if cleanup_time(w, lateness_ms) > time:
            out[start] = pane
    return out, emit


def timer_times(panes: Panes, lateness_ms: int) -> set[int]:
    """The timers the panes need: each unfired window's end - 1, each window's cleanup time."""
    times: set[int] = set()
    for start, pane in panes.items():
        w = Window(start, pane.end)
        if not pane.fired:
            times.add(w.max_timestamp)
        times.add(cleanup_time(w, lateness_ms))
    return times


# -- the job -----------------------------------------------------------------------------


def _default_result(key: Any, window: Window, value: Any) -> Any:
    return {"key": key, "start": window.start, "end": window.end, "value": value}


def window_job(
    *,
    name: str,
    key_by: Callable[[R], Hashable],
    windows: WindowAssigner,
    aggregate: AggregateFunction[Any, Any, Any],
    value: Callable[[R], Any] | None = None,
    result: Callable[[Any, Window, Any], Any] = _default_result,
    allowed_lateness_ms: int = 0,
    late_output: str | None = "late",
    timestamp: Callable[[R], int] | None = None,
    time: Literal["event", "processing"] = "event",
    state_name: str = "windows",
    decode: Callable[[bytes], R] | None = None,
) -> Job[R]:
    """A job that aggregates ``value(record)`` (default: the record) per key and window and
    emits ``result(key, window, aggregate.result(acc))`` when a window fires.

    ``timestamp``: a record's event time (default: the source's).  ``time="processing"``
    windows by the wall clock at processing instead (no lateness, nothing is late).
    ``late_output``: the side output of late records (``None``: drop them silently).
    ``decode``: the job's decoder of Kafka record values (see :class:`Job`).
    """
    if allowed_lateness_ms < 0:
        raise ValueError(f"allowed_lateness_ms must be >= 0, got {allowed_lateness_ms}")
    processing = time == "processing"
    lateness = 0 if processing else allowed_lateness_ms
    pane_type: Any = cast(Any, Pane)[aggregate.accumulator_type]
    stored = MapState(state_name, int, pane_type)
    extract: Callable[[R], Any] = value if value is not None else (lambda r: r)

    def update(ctx: Context, before: Panes, after: Panes, emit: list[Window]) -> None:
        """Write the changed panes, add the timers they need, emit the fired windows' results."""
        handle = ctx.state(stored)
        for start in before.keys() - after.keys():
            handle.remove(start)
        for start, pane in after.items():
            if before.get(start) != pane:
                handle.put(start, pane)
        # timers of windows merged away are left to fire: they find nothing to do
        register = (
            ctx.timers.register_processing_time if processing else ctx.timers.register_event_time
        )
        for t in sorted(timer_times(after, lateness) - timer_times(before, lateness)):
            register(t)
        for w in emit:
            pane = after.get(w.start) or before[w.start]  # dropped as it fired: lateness 0
            ctx.emit(result(ctx.key, w, aggregate.result(pane.acc)))

    def process(record: R, ctx: Context) -> None:
        if processing:
            ts, watermark = int(_time.time() * 1000), None
        else:
            assert ctx.timestamp is not None, "event-time windows need a timestamp"
            ts, watermark = ctx.timestamp, ctx.watermark
        panes: Panes = dict(ctx.state(stored).items())
        added = add_value(panes, windows, aggregate, extract(record), ts, watermark, lateness)
        if added.late:
            if late_output is not None:
                ctx.emit(record, output=late_output)
            return
        update(ctx, panes, added.panes, added.emit)

    def on_timer(timer: FiredTimer, ctx: Context) -> None:
        panes: Panes = dict(ctx.state(stored).items())
        after, emit = advance(panes, timer.time, lateness)
        update(ctx, panes, after, emit)

    return Job(
        name=name,
        process=process,
        key_by=key_by,
        states=[stored],
        on_timer=on_timer,
        timestamp=timestamp,
        decode=decode,
    )
