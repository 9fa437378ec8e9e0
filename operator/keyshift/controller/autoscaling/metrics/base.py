"""What the autoscaler and the live view read: a ``LoadSample`` of a job's load over a
window, and the ``MetricsProvider`` interface that makes one (``direct``: scraping the
workers, in local mode; ``prometheus``: querying Prometheus, on Kubernetes).

A provider turns the workers' metrics (names in docs/design.md, "Metrics") into one
``LoadSample`` per call: rates over a window, lag, and what is missing.  Missing or
partial data is never read as zero load: a value that cannot be measured is ``None``,
and ``complete`` is False with the reason in ``missing`` whenever anything the sample
should cover is absent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from keyshift.controller.core.assignment import describe_ranges

# Sample names as exposed by prometheus_client (counters carry ``_total``).
PROCESSED = "keyshift_records_processed_total"
STARTED = "keyshift_worker_start_time_seconds"
BUSY = "keyshift_busy_seconds_total"
CACHE_HITS = "keyshift_state_cache_hits_total"
CACHE_MISSES = "keyshift_state_cache_misses_total"
GENERATION = "keyshift_assignment_generation"
OWNED = "keyshift_key_groups_owned"
FINISHED = "keyshift_key_groups_finished"
END_OFFSET = "keyshift_source_end_offset"
POSITION = "keyshift_source_position"
LAG = "keyshift_source_lag_records"
FAILED_SINCE = "keyshift_key_group_failed_timestamp_seconds"
FAILED_OFFSET = "keyshift_key_group_failed_offset"

_WORKER_SERIES = (PROCESSED, BUSY, CACHE_HITS, CACHE_MISSES, GENERATION, OWNED)
_KEY_GROUP_SERIES = (END_OFFSET, POSITION, LAG)


class ScalingMetric(StrEnum):
    """The autoscaler's inputs, named once (as Flink's ``ScalingMetric``): the queries one
    Prometheus collect runs, the keys of a decision's inputs and of a worker's load in the
    status document."""

    ARRIVAL_RATE = "arrival_rate"
    """Records per second arriving at the job's input, over all key groups."""
    PROCESSED_RATE = "processed_rate"
    """Records per second processed (per worker, or over all of them)."""
    BUSY_RATIO = "busy_ratio"
    """Fraction of the time a worker is busy processing (0..1)."""
    CACHE_HIT_RATIO = "cache_hit_ratio"
    """Fraction of state reads the worker's cache answered."""
    LAG = "lag"
    """Records not yet processed, over all key groups (or a worker's)."""
    LAG_TREND = "lag_trend"
    """How fast the lag grows, records per second (negative: catching up)."""
    WORKER_LAG = "worker_lag"
    """Records not yet processed in the key groups one worker owns."""
    KEY_GROUP_ARRIVAL = "key_group_arrival"
    """Records per second arriving, per key group."""
    KEY_GROUP_PROCESSED = "key_group_processed"
    """Records per second processed, per key group."""
    KEY_GROUP_LAG = "key_group_lag"
    """Records not yet processed, per key group."""
    KEY_GROUPS_OWNED = "key_groups_owned"
    KEY_GROUPS_FINISHED = "key_groups_finished"
    GENERATION = "generation"
    """The assignment generation a worker runs."""
    FAILED_SINCE = "failed_since"
    """When a key group its worker stopped stopped (per worker, key group and reason)."""
    FAILED_OFFSET = "failed_offset"
    """The record a stopped key group stopped at."""
    LAST_SEEN = "last_seen"
    """A worker's newest sample's time."""
    FIRST_SEEN = "first_seen"
    """A worker's oldest sample in the window (whether it covers the window)."""
    RESTARTS = "restarts"
    """Counter resets in the window (the worker restarted)."""


# -- the interface ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerTarget:
    ordinal: int
    name: str  # e.g. "counter-worker-0"
    metrics_url: str  # e.g. "http://127.0.0.1:9100/metrics"


@dataclass(frozen=True, slots=True)
class FailedKeyGroup:
    """A key group its worker stopped: a user function's error (``errorPolicy: fail``),
    a poison record (``onPoison: fail``) or the store's (retried with back-off).  Why in
    words is in the worker's ``/healthz`` and log, not in metrics (it may quote data)."""

    key_group: int
    worker: str
    reason: str  # user-function, poison-record or store
    since: float  # unix time
    offset: int | None  # the record it stopped at, when a record is the cause


def failed_key_groups(
    worker: str, since: Iterable[tuple[Mapping[str, str], float]], offsets: Mapping[int, float]
) -> tuple[FailedKeyGroup, ...]:
    """A worker's stopped key groups from the samples of its failure metrics (the
    ``since`` samples' labels carry ``key_group`` and ``reason``)."""
    found: dict[int, FailedKeyGroup] = {}
    for labels, value in since:
        try:
            kg = int(labels.get("key_group", ""))
        except ValueError:
            continue
        if kg < 0 or not math.isfinite(value):
            continue
        offset = offsets.get(kg)
        found[kg] = FailedKeyGroup(
            key_group=kg,
            worker=worker,
            reason=labels.get("reason", ""),
            since=value,
            offset=None if offset is None or not math.isfinite(offset) else int(offset),
        )
    return tuple(found[kg] for kg in sorted(found))


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    ordinal: int
    name: str
    processed_rate: float | None  # records/s over the window
    busy_ratio: float | None  # busy seconds per wall second over the window (0..1)
    key_groups_owned: int
    generation: int
    cache_hit_ratio: float | None  # hits / (hits + misses) over the window
    lag: int  # sum of keyshift_source_lag_records of its key groups
    failed_key_groups: tuple[FailedKeyGroup, ...] = ()
    key_groups_finished: int = 0  # bounded input ended, all processed and committed


@dataclass(frozen=True, slots=True)
class LoadSample:
    at: float  # unix time of the newest scrape
    window_seconds: float  # time actually covered by the rates
    workers_expected: int
    workers_reporting: int  # workers with usable data at both ends of the window
    arrival_rate: float | None  # records/s arriving: d/dt of sum(end offset) over key groups
    processed_rate: float | None  # sum over workers
    lag: int | None  # total records behind
    lag_trend: float | None  # records/s change of the total lag over the window
    per_worker: tuple[WorkerLoad, ...]
    lag_by_key_group: dict[int, int]
    complete: bool  # every expected worker reported at both ends of the window
    missing: tuple[str, ...]  # what is missing and why ("counter-worker-2: connection refused")
    arrival_by_key_group: Mapping[int, float] = field(default_factory=dict)
    """Records/s arriving per key group over the window (those with a rate)."""
    processed_by_key_group: Mapping[int, float] = field(default_factory=dict)
    """Records/s processed per key group over the window: the rate of its position."""


def key_group_load(sample: LoadSample | None, key_groups: int) -> tuple[float, ...] | None:
    """The load per key group a rescale plans its ranges with, or None when the window
    does not cover every key group (plan by count then): per key group the higher of its
    arrival and processed rates, in records/s. The arrival rate is the demand a saturated
    worker cannot show by its processed rate; the processed rate that of a key group
    catching up on a backlog."""
    if sample is None:
        return None
    out: list[float] = []
    for kg in range(key_groups):
        rates = [
            r
            for r in (sample.arrival_by_key_group.get(kg), sample.processed_by_key_group.get(kg))
            if r is not None and math.isfinite(r)
        ]
        if not rates:
            return None
        out.append(max(0.0, *rates))
    return tuple(out) if sum(out) > 0 else None


def key_groups_named(key_groups: Sequence[int]) -> str:
    """``key group 3``, ``key groups 0-31``, ``key groups 0-2, 5``: one line of what is
    missing for many key groups, not one each."""
    if len(key_groups) == 1:
        return f"key group {key_groups[0]}"
    return f"key groups {describe_ranges(key_groups)}"


def job_processed_rate(sample: LoadSample | None, key_groups: int) -> float | None:
    """The records/s the job processed over the window, the figure a person reads beside
    its input rate: the sum of the key groups' position rates when the window has one for
    every key group, else the sum over the workers (``processed_rate``). The key groups'
    rates count what a worker processed before it left the window; the sum over the
    workers running at its end does not, and after a scale-down would show a drop in
    throughput that is not there."""
    if sample is None:
        return None
    by_key_group = sample.processed_by_key_group
    if key_groups > 0 and all(kg in by_key_group for kg in range(key_groups)):
        return sum(max(0.0, by_key_group[kg]) for kg in range(key_groups))
    return sample.processed_rate


@dataclass(frozen=True, slots=True)
class IdleSample:
    """What the autoscaler looks at while the job is scaled to zero (no worker to scrape):
    the input beyond the positions committed in the store, and the earliest timer."""

    at: float
    backlog: int | None
    """Records in the input beyond the committed positions (None: unknown, see ``missing``)."""
    next_timer_at: float | None
    """Unix time the earliest timer of the job is due (None: no timer)."""
    missing: str = ""
    """Why the backlog is unknown."""
    arrival_rate: float | None = None
    """Records/s arriving since the previous sample (None: no previous sample)."""


class MetricsProvider(Protocol):
    async def collect(self, job: str, workers: Sequence[WorkerTarget]) -> LoadSample: ...

    async def close(self) -> None: ...
