"""Jobs used by the runtime tests."""

from __future__ import annotations

from keyshift.runtime.api import Context, Job, ValueState
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
