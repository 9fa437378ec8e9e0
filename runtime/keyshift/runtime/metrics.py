"""The worker's Prometheus metrics (names and labels as in docs/design.md, "Metrics").

Each worker has its own registry, so several workers can live in one process
(tests, benchmarks).  Labels: ``streamjob`` (the StreamJob's name), ``namespace``
(its namespace: ``KEYSHIFT_NAMESPACE``, which the operator sets from the pod
through the downward API; ``local`` for a ``keyshift run``), ``worker``; per key
group metrics add ``key_group``.  Not ``job``: Prometheus keeps that name for the
scrape job and would rename the worker's own to ``exported_job``.

No ``_created`` series (``disable_created_metrics``): a restart shows in
``keyshift_worker_start_time_seconds``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

disable_created_metrics()  # type: ignore[no-untyped-call]

#: The ``namespace`` label of a worker that runs outside Kubernetes (``keyshift run``).
LOCAL_NAMESPACE = "local"
#: The environment variable the operator sets to the pod's namespace.
NAMESPACE_ENV = "KEYSHIFT_NAMESPACE"


def keyshift_version() -> str:
    """The installed keyshift's version (``unknown`` when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("keyshift")
    except PackageNotFoundError:
        return "unknown"


def worker_namespace() -> str:
    """The namespace this worker's metrics name: ``$KEYSHIFT_NAMESPACE``, else ``local``."""
    return os.environ.get(NAMESPACE_ENV) or LOCAL_NAMESPACE


@dataclass(frozen=True, slots=True)
class FailureMark:
    """A stopped key group, as its metrics show it (no error text: it may quote data)."""

    reason: str
    """``user-function``, ``poison-record`` or ``store``."""
    since: float
    """Unix time of the failure."""
    offset: int | None
    """The record it stopped at (user-function and poison-record failures)."""


class WorkerMetrics:
    def __init__(self, job: str, worker: str, namespace: str | None = None) -> None:
        self.registry = CollectorRegistry()
        labels = ["streamjob", "namespace", "worker"]
        kg_labels = [*labels, "key_group"]
        self.labels = {
            "streamjob": job,
            "namespace": worker_namespace() if namespace is None else namespace,
            "worker": worker,
        }
        r = self.registry
        Gauge(
            "keyshift_build_info", "The keyshift version this worker runs (always 1)",
            ["version"], registry=r,
        ).labels(keyshift_version()).set(1)  # fmt: skip
        self.start_time = Gauge(
            "keyshift_worker_start_time_seconds",
            "Unix time this worker's metrics started (changes when the worker restarts)",
            labels,
            registry=r,
        ).labels(**self.labels)
        self.start_time.set(time.time())
        self.store_connected = Gauge(
            "keyshift_store_connected",
            "1 while the worker's heartbeat reaches the state store, 0 while it does not",
            labels,
            registry=r,
        ).labels(**self.labels)
        self.cache_bytes = Gauge(
            "keyshift_state_cache_bytes", "Bytes of state the worker's cache holds", labels,
            registry=r,
        ).labels(**self.labels)  # fmt: skip
        self.cache_max_bytes = Gauge(
            "keyshift_state_cache_max_bytes", "The worker's state cache limit in bytes", labels,
            registry=r,
        ).labels(**self.labels)  # fmt: skip
        self.records_processed = Counter(
            "keyshift_records_processed", "Records processed", labels, registry=r
        ).labels(**self.labels)
        self.busy_seconds = Counter(
            "keyshift_busy_seconds", "Seconds spent processing records", labels, registry=r
        ).labels(**self.labels)
        self._end_offset = Gauge(
            "keyshift_source_end_offset", "Records available in the source", kg_labels, registry=r
        )
        self._position = Gauge(
            "keyshift_source_position", "Next offset to process", kg_labels, registry=r
        )
        self._lag = Gauge(
            "keyshift_source_lag_records", "Available minus position", kg_labels, registry=r
        )
        self.cache_hits = Counter(
            "keyshift_state_cache_hits", "State reads served by the cache", labels, registry=r
        ).labels(**self.labels)
        self.cache_misses = Counter(
            "keyshift_state_cache_misses", "State reads loaded from the store", labels, registry=r
        ).labels(**self.labels)
        self.commit_duration = Histogram(
            "keyshift_commit_duration_seconds",
            "Duration of a checkpoint commit (sink flush excluded)",
            labels,
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        ).labels(**self.labels)
        self.commits_fenced = Counter(
            "keyshift_commits_fenced", "Commits or releases the store rejected", labels, registry=r
        ).labels(**self.labels)
        self.commits_lost = Counter(
            "keyshift_store_lost_commits",
            "Times the store was found to have lost this worker's acknowledged commits or "
            "claim (an older AOF, a failover to a lagging replica): the key group replayed "
            "from what the store holds",
            labels,
            registry=r,
        ).labels(**self.labels)
        self.assignment_generation = Gauge(
            "keyshift_assignment_generation", "Assignment generation this worker runs", labels,
            registry=r,
        ).labels(**self.labels)  # fmt: skip
        self.key_groups_owned = Gauge(
            "keyshift_key_groups_owned", "Key groups this worker processes", labels, registry=r
        ).labels(**self.labels)
        self.key_groups_failed = Gauge(
            "keyshift_key_groups_failed",
            "Key groups stopped by an error: a user function's (errorPolicy fail), a poison "
            "record's (onPoison fail), a state value the store holds corrupt, or the store's "
            "(corrupt metadata or a refused command; retried with back-off)",
            labels,
            registry=r,
        ).labels(**self.labels)
        self.key_groups_finished = Gauge(
            "keyshift_key_groups_finished",
            "Key groups whose bounded input ended with every record and timer processed "
            "and committed",
            labels,
            registry=r,
        ).labels(**self.labels)
        self._failed_since = Gauge(
            "keyshift_key_group_failed_timestamp_seconds",
            "Unix time a stopped key group failed, while it is stopped; reason: "
            "user-function, poison-record or store",
            [*kg_labels, "reason"],
            registry=r,
        )
        self._failed_offset = Gauge(
            "keyshift_key_group_failed_offset",
            "Offset of the record a stopped key group stopped at (user-function and "
            "poison-record failures)",
            kg_labels,
            registry=r,
        )
        self._failed_shown: dict[int, FailureMark] = {}
        self._failed_lock = threading.Lock()
        self.state_expired = Counter(
            "keyshift_state_expired",
            "Expired state values and map entries removed from the store (states with a ttl)",
            labels,
            registry=r,
        ).labels(**self.labels)
        self.records_skipped = Counter(
            "keyshift_records_skipped",
            "Records whose user function raised (errorPolicy skip)",
            labels,
            registry=r,
        ).labels(**self.labels)
        self.poison_records = Counter(
            "keyshift_poison_records",
            "Records that could not be decoded, skipped or sent to the dead-letter topic",
            [*labels, "policy"],
            registry=r,
        )
        self._side_outputs = Counter(
            "keyshift_side_output_records",
            "Outputs to named side outputs (late records, ...)",
            [*labels, "output"],
            registry=r,
        )
        self.handoff_seconds = Histogram(
            "keyshift_handoff_duration_seconds",
            "Time from a new assignment to running it",
            labels,
            registry=r,
        ).labels(**self.labels)
        self._gc_pause = Histogram(
            "keyshift_gc_pause_seconds",
            "Pauses of the worker process's garbage collector (the event loop stops while "
            "it runs), by generation: 2 is a full collection",
            [*labels, "generation"],
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self._gc_pauses = {
            generation: self._gc_pause.labels(**self.labels, generation=str(generation))
            for generation in range(3)
        }
        self._source_gauges: dict[int, tuple[Gauge, ...]] = {}
        self._last_hits = 0
        self._last_misses = 0
        self._counts_lock = threading.Lock()

    def source(self, key_group: int, end: int, position: int) -> None:
        """A key group's end offset, position and lag (at every batch: the labelled
        gauges are looked up once per key group)."""
        gauges = self._source_gauges.get(key_group)
        if gauges is None:
            kg = str(key_group)
            gauges = self._source_gauges[key_group] = tuple(
                gauge.labels(**self.labels, key_group=kg)
                for gauge in (self._end_offset, self._position, self._lag)
            )
        end_offset, at, lag = gauges
        end_offset.set(end)
        at.set(position)
        lag.set(max(0, end - position))

    def gc_pause(self, generation: int, seconds: float) -> None:
        """A garbage collection of ``generation`` stopped the process for ``seconds``."""
        self._gc_pauses[generation].observe(seconds)

    def failures(self, failed: Mapping[int, FailureMark]) -> None:
        """Show exactly these stopped key groups (and their count).  Called from the
        event loop and from the HTTP thread before a scrape."""
        with self._failed_lock:
            for kg, mark in list(self._failed_shown.items()):
                if failed.get(kg) != mark:
                    with contextlib.suppress(KeyError):
                        self._failed_since.remove(*self.labels.values(), str(kg), mark.reason)
                    with contextlib.suppress(KeyError):
                        self._failed_offset.remove(*self.labels.values(), str(kg))
                    del self._failed_shown[kg]
            for kg, mark in failed.items():
                if kg in self._failed_shown:
                    continue
                labels = {**self.labels, "key_group": str(kg)}
                self._failed_since.labels(**labels, reason=mark.reason).set(mark.since)
                if mark.offset is not None:
                    self._failed_offset.labels(**labels).set(mark.offset)
                self._failed_shown[kg] = mark
            self.key_groups_failed.set(len(failed))

    def side_output(self, name: str, count: int) -> None:
        self._side_outputs.labels(**self.labels, output=name).inc(count)

    def forget_key_group(self, key_group: int) -> None:
        self._source_gauges.pop(key_group, None)
        kg = str(key_group)
        for gauge in (self._end_offset, self._position, self._lag):
            with contextlib.suppress(KeyError):
                gauge.remove(*self.labels.values(), kg)

    def cache_counts(self, hits: int, misses: int) -> None:
        """Bring the cache counters up to the cache's own running totals.

        Called from the event loop and from the HTTP thread before a scrape: the lock
        keeps the two from adding the same difference twice."""
        with self._counts_lock:
            self.cache_hits.inc(max(0, hits - self._last_hits))
            self.cache_misses.inc(max(0, misses - self._last_misses))
            self._last_hits = max(self._last_hits, hits)
            self._last_misses = max(self._last_misses, misses)

    def cache_size(self, used: int, limit: int) -> None:
        """The cache's bytes held and its limit (``StateCache.total_bytes``, ``max_bytes``)."""
        self.cache_bytes.set(used)
        self.cache_max_bytes.set(limit)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
