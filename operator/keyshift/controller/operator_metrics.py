"""The operator's own Prometheus metrics (names in docs/design.md, "Metrics")."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RESCALE_DURATION = Histogram(
    "keyshift_rescale_duration_seconds",
    "Wall time of finished rescales, from start to the last handoff.",
    ["namespace", "job", "reason", "outcome"],
    buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
PARALLELISM = Gauge(
    "keyshift_job_parallelism", "Workers in the job's current assignment.", ["namespace", "job"]
)
DESIRED_PARALLELISM = Gauge(
    "keyshift_job_desired_parallelism",
    "The parallelism the job is heading for: spec.parallelism, or the autoscaler's choice.",
    ["namespace", "job"],
)
RECONCILE_ERRORS = Counter(
    "keyshift_reconcile_errors_total",
    "Controller ticks that failed (API or store errors); retried on the next tick.",
    ["namespace", "job"],
)
SCALING_DECISIONS = Counter(
    "keyshift_scaling_decisions_total",
    "Autoscaler decisions, by direction (up, down, none, blocked) and reason code.",
    ["direction", "reason"],
)
