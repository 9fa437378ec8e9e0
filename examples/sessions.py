"""User sessions: event-time session windows that close after ``GAP_MS`` of inactivity.

Each record is a user's action: ``Event.key`` is the user, ``Event.value`` a score.
When a session ends (the watermark passes its last action + ``GAP_MS``) the job emits
``{"user", "start", "end", "events", "total"}``; an action arriving late but within
``ALLOWED_LATENESS_MS`` extends or merges sessions and emits the result again; later
ones go to the side output ``late``.  Run it with ``examples/sessions.yaml``, or over
Kafka with ``examples/kafka/sessions.yaml``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from keyshift.runtime.sources.generator import Event
from keyshift.runtime.windows import Aggregate, Sessions, Window, window_job

GAP_MS = 30_000
ALLOWED_LATENESS_MS = 10_000

events_and_total: Aggregate[int, list[int], list[int]] = Aggregate(
    create=lambda: [0, 0],
    add=lambda acc, score: [acc[0] + 1, acc[1] + score],
    merge=lambda a, b: [a[0] + b[0], a[1] + b[1]],
    result=lambda acc: acc,
    accumulator_type=list[int],
)


def result(user: str, window: Window, acc: list[int]) -> dict[str, Any]:
    events, total = acc
    return {
        "user": user,
        "start": window.start,
        "end": window.end,
        "events": events,
        "total": total,
    }


def score(event: Event) -> int:
    return event.value


job = window_job(
    name="sessions",
    key_by=lambda e: e.key,
    value=score,
    windows=Sessions(GAP_MS),
    aggregate=events_and_total,
    result=result,
    allowed_lateness_ms=ALLOWED_LATENESS_MS,
    late_output="late",
    decode=msgspec.json.Decoder(Event).decode,  # a Kafka record's value: an Event as JSON
)
