"""Jobs the benchmarks run.

``rescale_job``: one ValueState per key holding a 100-byte blob (an 8-byte
running sum and padding); every record updates it and emits the wall-clock
time it was processed, so that the benchmark can see, from the job's output,
when each key group stopped and resumed processing.
"""

from __future__ import annotations

import time

from keyshift.runtime.api import Context, Job, MapState, ValueState
from keyshift.runtime.sources.generator import Event

VALUE_BYTES = 100
blob = ValueState("blob", bytes, default=b"")


def initial_value(key_index: int) -> bytes:
    """The value the benchmark preloads for key ``key-<key_index>``."""
    return key_index.to_bytes(8, "big") + bytes(VALUE_BYTES - 8)


def process(event: Event, ctx: Context) -> None:
    state = ctx.state(blob)
    value = state.value()
    total = (int.from_bytes(value[:8], "big") if value else 0) + event.value
    tail = value[8:VALUE_BYTES] if len(value) >= VALUE_BYTES else bytes(VALUE_BYTES - 8)
    state.update((total & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") + tail)
    ctx.emit(time.time())


rescale_job: Job[Event] = Job(
    name="rescale-bench", process=process, key_by=lambda e: e.key, states=[blob]
)


def busy_process(event: Event, ctx: Context) -> None:
    """``process`` after ``examples/busy_counter.py``'s CPU work (~250 us per record)."""
    from examples.busy_counter import work

    work()
    process(event, ctx)


busy_rescale_job: Job[Event] = Job(
    name="rescale-bench-busy", process=busy_process, key_by=lambda e: e.key, states=[blob]
)
"""The loaded case: ``rescale_job`` with a busy counter's CPU cost per record."""


# -- per-entry maps versus a map as one value ----------------------------------------------

entries_map = MapState("entries", int, int)
"""A map stored per entry: each record reads and updates one entry."""
whole_map = ValueState("whole", dict[int, int], default=None)
"""The same map as one value (the layout of MapState before it was stored per entry):
each record decodes, updates and encodes the key's whole map."""


def map_key(event: Event) -> int:
    """The map key a record touches: its value, drawn uniformly from ``[1, maxValue]``."""
    return event.value


def per_entry_process(event: Event, ctx: Context) -> None:
    m = ctx.state(entries_map)
    k = map_key(event)
    m.put(k, (m.get(k) or 0) + 1)


def one_value_process(event: Event, ctx: Context) -> None:
    state = ctx.state(whole_map)
    m = state.value() or {}
    k = map_key(event)
    m[k] = m.get(k, 0) + 1
    state.update(m)


per_entry_job: Job[Event] = Job(
    name="map-per-entry", process=per_entry_process, key_by=lambda e: e.key, states=[entries_map]
)
one_value_job: Job[Event] = Job(
    name="map-one-value", process=one_value_process, key_by=lambda e: e.key, states=[whole_map]
)


# -- key churn (benchmarks/state_ttl.py) --------------------------------------------------

CHURN_TTL_SECONDS = 10.0
CHURN_VALUE = bytes(64)
last_seen = ValueState("last", bytes, default=b"")
last_seen_expiring = ValueState("last", bytes, default=b"", ttl=CHURN_TTL_SECONDS)


def remember_key(event: Event, ctx: Context) -> None:
    ctx.state(last_seen).update(CHURN_VALUE)


def remember_key_expiring(event: Event, ctx: Context) -> None:
    ctx.state(last_seen_expiring).update(CHURN_VALUE)


churn_job: Job[Event] = Job(
    name="churn", process=remember_key, key_by=lambda e: e.key, states=[last_seen]
)
"""64 bytes per key, kept forever."""
churn_ttl_job: Job[Event] = Job(
    name="churn-ttl", process=remember_key_expiring, key_by=lambda e: e.key,
    states=[last_seen_expiring],
)  # fmt: skip
"""64 bytes per key, expiring ``CHURN_TTL_SECONDS`` after the key's last record."""
