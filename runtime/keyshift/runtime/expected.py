"""The exact expected state of the example jobs, computed from the generator alone.

The generator makes record ``(kg, offset)`` a pure function of the seed, so the
state after a key group has processed offsets ``[0, n)`` is known without
running anything; fault tests compare the store against it for equality.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from keyshift.api.spec import GeneratorSource
from keyshift.runtime.api import encode_key
from keyshift.runtime.sources.generator import Event, Generator

CHUNK = 10_000


def counter_state(
    source: GeneratorSource, key_groups: int, key_group: int, n: int
) -> dict[str, dict[str, int]]:
    """``examples/counter.py`` after offsets ``[0, n)`` of ``key_group``:
    ``{"count": {key: count}, "total": {key: sum of values}}``."""
    generator = Generator(source, key_groups, created_at=0.0)
    count: dict[str, int] = {}
    total: dict[str, int] = {}
    for start in range(0, n, CHUNK):
        for event in generator.read(key_group, start, min(n, start + CHUNK)):
            count[event.key] = count.get(event.key, 0) + 1
            total[event.key] = total.get(event.key, 0) + event.value
    return {"count": count, "total": total}


def counter_state_encoded(
    source: GeneratorSource, key_groups: int, key_group: int, n: int
) -> dict[str, dict[bytes, bytes]]:
    """The same, as the store holds it (msgpack keys and values)."""
    import msgspec

    encoder = msgspec.msgpack.Encoder()
    decoded = counter_state(source, key_groups, key_group, n)
    return {
        state: {encode_key(k): encoder.encode(v) for k, v in values.items()}
        for state, values in decoded.items()
    }


# -- windows (examples/revenue_per_minute.py, examples/sessions.py) -------------------------


@dataclass(frozen=True)
class WindowResults:
    """What a windowed example produces for offsets ``[0, n)`` of one key group."""

    results: list[dict[str, Any]]
    """The final result of every window, as the job emits it (its last, complete firing)."""
    late: list[int]
    """Offsets of the records dropped as late (sent to the side output)."""


def _event_times(
    source: GeneratorSource, key_groups: int, key_group: int, n: int, created_at: float
) -> Iterator[tuple[int, Event, int]]:
    """``(offset, record, event time)`` in processing order."""
    generator = Generator(source, key_groups, created_at)
    for start in range(0, n, CHUNK):
        for i, event in enumerate(generator.read(key_group, start, min(n, start + CHUNK))):
            yield start + i, event, generator.event_time(key_group, start + i)


def _advance(watermark: int | None, to: int) -> int:
    return to if watermark is None else max(watermark, to)


def revenue_per_minute_results(
    source: GeneratorSource,
    key_groups: int,
    key_group: int,
    n: int,
    *,
    created_at: float,
    out_of_orderness_ms: int,
    window_ms: int,
    lateness_ms: int,
) -> WindowResults:
    """Tumbling windows of ``window_ms`` per product (revenue, orders).

    Records are processed in offset order; the watermark when a record is processed is
    the largest event time before it minus ``out_of_orderness_ms`` (``None`` first; the
    input is assumed never to pause for ``idleTimeout``).  A record is late when its
    window's cleanup time ``end - 1 + lateness_ms`` is at or below that watermark;
    every other record counts in its window, whose last firing (at the latest at the
    end of the input) holds them all."""
    windows: dict[tuple[str, int], list[int]] = {}
    late: list[int] = []
    watermark: int | None = None
    for offset, event, ts in _event_times(source, key_groups, key_group, n, created_at):
        start = ts - ts % window_ms
        if watermark is not None and start + window_ms - 1 + lateness_ms <= watermark:
            late.append(offset)
        else:
            revenue, orders = windows.get((event.key, start), (0, 0))
            windows[(event.key, start)] = [revenue + event.value, orders + 1]
        watermark = _advance(watermark, ts - out_of_orderness_ms)
    results = [
        {
            "product": product,
            "window_start": start,
            "window_end": start + window_ms,
            "revenue": revenue,
            "orders": orders,
        }
        for (product, start), (revenue, orders) in sorted(windows.items())
    ]
    return WindowResults(results, late)


def sessions_results(
    source: GeneratorSource,
    key_groups: int,
    key_group: int,
    n: int,
    *,
    created_at: float,
    out_of_orderness_ms: int,
    gap_ms: int,
    lateness_ms: int,
) -> WindowResults:
    """Session windows with ``gap_ms`` per user (events, total of values).

    The watermark as in :func:`revenue_per_minute_results`.  A record at ``t`` is late
    when ``t + gap_ms - 1 + lateness_ms`` is at or below the watermark; otherwise its
    window ``[t, t + gap_ms)`` merges with every open session of the user it overlaps or
    touches.  A session is closed for good (its last firing is final) once the watermark
    after a record reaches its ``end - 1 + lateness_ms``; a later record cannot join it
    and opens a new session, even if the two touch."""
    open_sessions: dict[str, list[list[int]]] = {}  # user -> [start, end, events, total]
    closed: list[tuple[str, list[int]]] = []
    late: list[int] = []
    watermark: int | None = None
    for offset, event, ts in _event_times(source, key_groups, key_group, n, created_at):
        if watermark is not None and ts + gap_ms - 1 + lateness_ms <= watermark:
            late.append(offset)
        else:
            session = [ts, ts + gap_ms, 1, event.value]
            kept = []
            for other in open_sessions.get(event.key, []):
                if other[0] <= session[1] and session[0] <= other[1]:
                    session = [
                        min(session[0], other[0]),
                        max(session[1], other[1]),
                        session[2] + other[2],
                        session[3] + other[3],
                    ]
                else:
                    kept.append(other)
            open_sessions[event.key] = [*kept, session]
        watermark = _advance(watermark, ts - out_of_orderness_ms)
        for user, sessions in open_sessions.items():
            done = [s for s in sessions if s[1] - 1 + lateness_ms <= watermark]
            if done:
                closed += [(user, s) for s in done]
                open_sessions[user] = [s for s in sessions if s not in done]
    closed += [(user, s) for user, sessions in open_sessions.items() for s in sessions]
    results = [
        {"user": user, "start": start, "end": end, "events": events, "total": total}
        for user, (start, end, events, total) in sorted(closed)
    ]
    return WindowResults(results, late)
