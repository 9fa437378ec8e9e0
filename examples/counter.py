"""A per-key counter: for every key, how many records and the sum of their values.

Run it with ``examples/counter.yaml`` (the generator), or over Kafka with
``examples/kafka/counter.yaml``: there each record's value is the JSON of an
``Event``, which ``decode`` turns back into one.
"""

from __future__ import annotations

import msgspec

from keyshift.runtime.api import Context, Job, ValueState
from keyshift.runtime.sources.generator import Event

count = ValueState("count", int, default=0)
total = ValueState("total", int, default=0)


def process(event: Event, ctx: Context) -> None:
    c = ctx.state(count)
    t = ctx.state(total)
    n = c.value() + 1
    s = t.value() + event.value
    c.update(n)
    t.update(s)
    ctx.emit({"key": event.key, "count": n, "total": s})


job: Job[Event] = Job(
    name="counter",
    process=process,
    key_by=lambda e: e.key,
    states=[count, total],
    decode=msgspec.json.Decoder(Event).decode,
)
