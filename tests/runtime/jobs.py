"""Jobs used by the runtime tests."""

from __future__ import annotations

from keyshift.runtime.api import Context, Job, ListState, MapState, ValueState
from keyshift.runtime.sources.generator import Event

count = ValueState("count", int, default=0)
BAD_VALUE = 13


def process(event: Event, ctx: Context) -> None:
    c = ctx.state(count)
    c.update(c.value() + 1)  # written before the failure: must not stick
    if event.value == BAD_VALUE:
        raise RuntimeError(f"cannot handle {event.value}")
    ctx.emit(event.key)


flaky: Job[Event] = Job(name="flaky", process=process, key_by=lambda e: e.key, states=[count])


# -- collections stored per entry -------------------------------------------------------

SLOTS = 40
"""Map keys per record key in ``visits``: ``event.value % SLOTS``."""
totals = MapState("visits", int, int)
recent = ListState("recent", int)


def visit(event: Event, ctx: Context) -> None:
    """Counts per ``value % SLOTS`` in a map, the values in a list; every 25th value of a
    key emits the map's total (an iteration) and the list's length."""
    visits = ctx.state(totals)
    slot = event.value % SLOTS
    visits.put(slot, (visits.get(slot) or 0) + 1)
    values = ctx.state(recent)
    values.append(event.value)
    if event.value % 25 == 0:
        ctx.emit({"key": event.key, "total": sum(n for _, n in visits.items()), "n": len(values)})


visits: Job[Event] = Job(
    name="visits", process=visit, key_by=lambda e: e.key, states=[totals, recent]
)


def iterate_all(event: Event, ctx: Context) -> None:
    """Puts a value, then iterates the whole map (to meet a map too large to iterate)."""
    m = ctx.state(totals)
    m.put(event.value, 1)
    ctx.emit(len(m))


iterating: Job[Event] = Job(
    name="iterating", process=iterate_all, key_by=lambda e: e.key, states=[totals]
)


# -- expiring state ---------------------------------------------------------------------

TTL_SECONDS = 0.5
seen = ValueState("seen", int, default=0)
last_value = ValueState("last", int, ttl=TTL_SECONDS)
"""The key's last value, forgotten ``TTL_SECONDS`` after it was written."""
values_seen = MapState("values", int, int, ttl=TTL_SECONDS)
"""Per key, value -> offset it was last seen at; each entry forgotten on its own."""
offsets_seen = ListState("offsets", int, ttl=TTL_SECONDS)
"""Per key, the offsets of its records; each element forgotten on its own."""


def remember_last(event: Event, ctx: Context) -> None:
    """Counts the key's records (kept), remembers its last value and the values it saw
    (both expire)."""
    n = ctx.state(seen)
    n.update(n.value() + 1)
    ctx.state(last_value).update(event.value)
    ctx.state(values_seen).put(event.value, ctx.offset)
    ctx.state(offsets_seen).append(ctx.offset)


expiring: Job[Event] = Job(
    name="expiring", process=remember_last, key_by=lambda e: e.key,
    states=[seen, last_value, values_seen, offsets_seen],
)  # fmt: skip
