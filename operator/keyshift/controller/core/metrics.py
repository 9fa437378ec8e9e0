"""The operator's own Prometheus metrics (names in docs/design.md, "Metrics").

A StreamJob is named by ``streamjob`` and ``namespace`` (as on the workers'
metrics), never by ``job``: Prometheus keeps that label for the scrape job.  No
``_created`` series.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from keyshift.runtime.metrics import keyshift_version

disable_created_metrics()  # type: ignore[no-untyped-call]

JOB_LABELS = ["streamjob", "namespace"]

BUILD_INFO = Gauge("keyshift_build_info", "The keyshift version the operator runs (always 1)",
                   ["version"])  # fmt: skip
BUILD_INFO.labels(keyshift_version()).set(1)
RESCALE_DURATION = Histogram(
    "keyshift_rescale_duration_seconds",
    "Wall time of finished rescales, from start to the last handoff.",
    [*JOB_LABELS, "reason", "outcome"],
    buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
PARALLELISM = Gauge(
    "keyshift_job_parallelism", "Workers in the job's current assignment.", JOB_LABELS
)
DESIRED_PARALLELISM = Gauge(
    "keyshift_job_desired_parallelism",
    "The parallelism the job is heading for: spec.parallelism, or the autoscaler's choice.",
    JOB_LABELS,
)
RESCALE_IN_PROGRESS = Gauge(
    "keyshift_rescale_in_progress_seconds",
    "How long the running rescale has run so far; 0 when none runs.",
    JOB_LABELS,
)
RECONCILE_ERRORS = Counter(
    "keyshift_reconcile_errors_total",
    "Controller ticks that failed (API or store errors); retried on the next tick.",
    JOB_LABELS,
)
SCALING_DECISIONS = Counter(
    "keyshift_scaling_decisions_total",
    "Autoscaler decisions, by direction (up, down, none, blocked) and reason code.",
    [*JOB_LABELS, "direction", "reason"],
)
