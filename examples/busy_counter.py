"""The counter of ``examples/counter.py`` with real work per record.

Each record costs about ``WORK_SECONDS`` of CPU before it is counted, as
parsing, scoring or enrichment would, so that a few thousand records per
second keep a worker busy and the autoscaler has something to decide. The
state is the counter's (``count`` and ``total`` per key), so the same exactness
checks apply. Run it with ``examples/quickstart.yaml``.
"""

from __future__ import annotations

import time

from examples.counter import count, total
from examples.counter import process as count_event
from keyshift.runtime.api import Context, Job
from keyshift.runtime.sources.generator import Event

WORK_SECONDS = 0.00025


def work(seconds: float = WORK_SECONDS) -> None:
    """Stand-in for per-record CPU work: spin for ``seconds``."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def process(event: Event, ctx: Context) -> None:
    work()
    count_event(event, ctx)


job: Job[Event] = Job(
    name="busy-counter", process=process, key_by=lambda e: e.key, states=[count, total]
)
