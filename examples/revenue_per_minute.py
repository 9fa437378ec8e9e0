"""Revenue per product and minute: tumbling one-minute event-time windows.

Each record is an order: ``Event.key`` is the product, ``Event.value`` the amount in
cents.  When the watermark passes the end of a minute, the job emits
``{"product", "window_start", "window_end", "revenue", "orders"}``; an order arriving
within ``ALLOWED_LATENESS_MS`` after that updates the minute and emits it again; a
later one is sent to the side output ``late``.  Run it with
``examples/revenue_per_minute.yaml``, or over Kafka with
``examples/kafka/revenue_per_minute.yaml``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from keyshift.runtime.sources.generator import Event
from keyshift.runtime.windows import Aggregate, Tumbling, Window, window_job

WINDOW_MS = 60_000
ALLOWED_LATENESS_MS = 5_000

revenue_and_orders: Aggregate[int, list[int], list[int]] = Aggregate(
    create=lambda: [0, 0],
    add=lambda acc, cents: [acc[0] + cents, acc[1] + 1],
    merge=lambda a, b: [a[0] + b[0], a[1] + b[1]],
    result=lambda acc: acc,
    accumulator_type=list[int],
)


def result(product: str, window: Window, acc: list[int]) -> dict[str, Any]:
    revenue, orders = acc
    return {
        "product": product,
        "window_start": window.start,
        "window_end": window.end,
        "revenue": revenue,
        "orders": orders,
    }


def order_amount(event: Event) -> int:
    return event.value


job = window_job(
    name="revenue-per-minute",
    key_by=lambda e: e.key,
    value=order_amount,
    windows=Tumbling(WINDOW_MS),
    aggregate=revenue_and_orders,
    result=result,
    allowed_lateness_ms=ALLOWED_LATENESS_MS,
    late_output="late",
    decode=msgspec.json.Decoder(Event).decode,  # a Kafka record's value: an Event as JSON
)
