"""The direct-scrape metrics provider, used in local mode (``base``: what it makes).

``DirectScrapeProvider`` scrapes every worker's ``/metrics`` itself and keeps
the scrapes of the last window in memory.  The arithmetic lives in pure
functions so that it is tested without I/O:

- ``read_scrape``: exposition text -> ``WorkerSnapshot`` (or why it is unusable);
- ``worker_rates``: two snapshots of one worker -> its rates (``None`` on a
  counter reset);
- ``summarize``: the scrape rounds of a window -> ``LoadSample``.

Rules of ``summarize``:

- A worker's rates come from its oldest and newest usable scrape in the window
  after its last counter reset (a counter that went down, or a changed
  ``keyshift_worker_start_time_seconds``, means the worker restarted).  A worker
  is *reporting* when that span covers the whole window; otherwise it is named
  in ``missing`` and its rates cover only the part it has.
- A worker whose newest scrape failed is left out of ``per_worker`` (its counts
  would be stale) and named in ``missing`` with the error.
- Arrival rate and lag trend are computed per key group, from whichever workers
  report it in each scrape (a key group reported by two workers at one instant,
  during a handoff: the highest end offset and position), so a key group moving
  between workers does not create a fake spike or dip.  A key group absent from
  the newest scrape (no running owner) makes the sample incomplete.
- Processed rate per key group likewise: the rate of its source position (the
  next offset to process, carried across a handoff with the key group), from
  whichever workers report it; :func:`key_group_load` turns the arrival and
  processed rates into the load a rescale plans its ranges with.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from keyshift.controller.autoscaling.metrics.base import (
    _KEY_GROUP_SERIES,
    _WORKER_SERIES,
    BUSY,
    CACHE_HITS,
    CACHE_MISSES,
    END_OFFSET,
    FAILED_OFFSET,
    FAILED_SINCE,
    FINISHED,
    GENERATION,
    LAG,
    OWNED,
    POSITION,
    PROCESSED,
    STARTED,
    FailedKeyGroup,
    LoadSample,
    WorkerLoad,
    WorkerTarget,
    failed_key_groups,
    key_groups_named,
)
from keyshift.errors import KeyshiftError

#: Scrapes up to this fraction of the window older than the window are kept, so
#: that a collect interval dividing the window keeps a full window despite jitter.
WINDOW_SLACK = 0.05


# -- snapshots (pure) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyGroupReading:
    end_offset: int
    position: int
    lag: int


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """What one scrape of one worker says."""

    job: str
    worker: str
    records_processed: float
    busy_seconds: float
    cache_hits: float
    cache_misses: float
    started_at: float | None  # the worker's start time; changes when the worker restarts
    generation: int
    key_groups_owned: int
    key_groups: Mapping[int, KeyGroupReading]
    failed: tuple[FailedKeyGroup, ...] = ()
    key_groups_finished: int = 0


class MetricsFormatError(KeyshiftError, ValueError):
    """The exposition text is not a keyshift worker's metrics."""


def parse_exposition(text: str) -> WorkerSnapshot:
    """Parse one worker's ``/metrics`` text; raise ``MetricsFormatError`` if unusable."""
    worker_values: dict[str, list[tuple[dict[str, str], float]]] = {}
    created: list[tuple[dict[str, str], float]] = []
    per_kg: dict[str, dict[int, float]] = {name: {} for name in (*_KEY_GROUP_SERIES, FAILED_OFFSET)}
    failed_since: list[tuple[dict[str, str], float]] = []
    finished = 0
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise MetricsFormatError(f"unparsable exposition: {exc}") from exc
    for family in families:
        for sample in family.samples:
            name = sample.name
            if name in _WORKER_SERIES:
                worker_values.setdefault(name, []).append((sample.labels, sample.value))
            elif name == STARTED:
                created.append((sample.labels, sample.value))
            elif name == FAILED_SINCE:
                failed_since.append((sample.labels, sample.value))
            elif name == FINISHED and math.isfinite(sample.value):
                finished += int(sample.value)
            elif name in per_kg:
                raw = sample.labels.get("key_group")
                try:
                    kg = int(raw) if raw is not None else -1
                except ValueError:
                    kg = -1
                if kg < 0:
                    raise MetricsFormatError(f"{name} has a bad key_group label {raw!r}")
                per_kg[name][kg] = sample.value
    values: dict[str, float] = {}
    identity: tuple[str, str] | None = None
    for name in _WORKER_SERIES:
        samples = worker_values.get(name, [])
        if not samples:
            raise MetricsFormatError(f"no {name}")
        if len(samples) > 1:
            raise MetricsFormatError(f"{len(samples)} series of {name}, expected one worker")
        labels, value = samples[0]
        if not math.isfinite(value):
            raise MetricsFormatError(f"{name} is {value}")
        values[name] = value
        if name == PROCESSED:
            identity = (labels.get("streamjob", ""), labels.get("worker", ""))
    assert identity is not None
    readings: dict[int, KeyGroupReading] = {}
    ends, positions, lags = per_kg[END_OFFSET], per_kg[POSITION], per_kg[LAG]
    for kg, end in ends.items():
        # The runtime sets the three gauges together; a key group without all
        # three (not expected from the runtime) is not read.
        if kg in positions and kg in lags:
            readings[kg] = KeyGroupReading(int(end), int(positions[kg]), int(lags[kg]))
    return WorkerSnapshot(
        job=identity[0],
        worker=identity[1],
        records_processed=values[PROCESSED],
        busy_seconds=values[BUSY],
        cache_hits=values[CACHE_HITS],
        cache_misses=values[CACHE_MISSES],
        started_at=created[0][1] if len(created) == 1 else None,
        generation=int(values[GENERATION]),
        key_groups_owned=int(values[OWNED]),
        key_groups=readings,
        failed=failed_key_groups(identity[1], failed_since, per_kg[FAILED_OFFSET]),
        key_groups_finished=finished,
    )


def read_scrape(text: str, *, job: str, name: str) -> WorkerSnapshot | str:
    """Parse a scrape of worker ``name`` of ``job``; a string says why it is unusable.

    The labels must name the expected job and worker: in local mode a port may
    be reused by another worker after a restart.
    """
    try:
        snapshot = parse_exposition(text)
    except MetricsFormatError as exc:
        return f"unusable metrics: {exc}"
    if snapshot.job != job or snapshot.worker != name:
        return (
            f"answers as worker {snapshot.worker!r} of job {snapshot.job!r}, "
            f"not {name!r} of {job!r}"
        )
    return snapshot


# -- rates (pure) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerRates:
    seconds: float
    processed_rate: float
    busy_ratio: float
    cache_hit_ratio: float | None


def counters_reset(older: WorkerSnapshot, newer: WorkerSnapshot) -> bool:
    """True if the worker's counters started again between the two snapshots."""
    if (
        older.started_at is not None
        and newer.started_at is not None
        and older.started_at != newer.started_at
    ):
        return True
    return (
        newer.records_processed < older.records_processed
        or newer.busy_seconds < older.busy_seconds
        or newer.cache_hits < older.cache_hits
        or newer.cache_misses < older.cache_misses
    )


def worker_rates(
    older_at: float, older: WorkerSnapshot, newer_at: float, newer: WorkerSnapshot
) -> WorkerRates | None:
    """The rates between two snapshots of one worker; ``None`` if they cannot be had
    (no time between them, or a counter reset: its increase is unknown)."""
    seconds = newer_at - older_at
    if seconds <= 0 or counters_reset(older, newer):
        return None
    hits = newer.cache_hits - older.cache_hits
    misses = newer.cache_misses - older.cache_misses
    return WorkerRates(
        seconds=seconds,
        processed_rate=(newer.records_processed - older.records_processed) / seconds,
        busy_ratio=min(1.0, (newer.busy_seconds - older.busy_seconds) / seconds),
        cache_hit_ratio=hits / (hits + misses) if hits + misses > 0 else None,
    )


@dataclass(frozen=True, slots=True)
class ScrapeRound:
    """One collect: every scraped worker's snapshot, or why there is none."""

    at: float
    results: Mapping[str, WorkerSnapshot | str]


def prune(rounds: Iterable[ScrapeRound], now: float, window_seconds: float) -> list[ScrapeRound]:
    """The rounds inside the window ending at ``now`` (with ``WINDOW_SLACK``)."""
    oldest = now - window_seconds * (1 + WINDOW_SLACK)
    return [r for r in rounds if oldest <= r.at <= now]


def _combined_key_groups(round_: ScrapeRound) -> dict[int, KeyGroupReading]:
    """Key group readings of one round; one reported twice (handoff): the highest."""
    out: dict[int, KeyGroupReading] = {}
    for result in round_.results.values():
        if isinstance(result, str):
            continue
        for kg, reading in result.key_groups.items():
            seen = out.get(kg)
            if seen is None:
                out[kg] = reading
            else:
                end = max(seen.end_offset, reading.end_offset)
                position = max(seen.position, reading.position)
                out[kg] = KeyGroupReading(end, position, max(0, end - position))
    return out


def _ago(seconds: float) -> str:
    return f"{seconds:.1f} s"


def summarize(rounds: Sequence[ScrapeRound], workers: Sequence[WorkerTarget]) -> LoadSample:
    """The load over ``rounds`` (oldest first, already pruned to the window), in the
    steps the Prometheus provider takes too: the workers' loads, the key groups' rates,
    then the sums."""
    if not rounds:
        raise ValueError("summarize needs at least one scrape round")
    oldest, newest = rounds[0], rounds[-1]
    window = newest.at - oldest.at
    has_window = len(rounds) >= 2 and window > 0
    missing: list[str] = []
    if not has_window:
        missing.append("window: only one scrape so far, rates need two")
    if not workers:
        missing.append("workers: none expected")
    per_worker, reporting = _worker_loads(rounds, workers, has_window, missing)
    rates = _key_group_rates(rounds, workers, has_window, missing)
    lag_by_key_group = {kg: rates.newest[kg].lag for kg in sorted(rates.newest)}
    worker_rates_known = [w.processed_rate for w in per_worker if w.processed_rate is not None]
    return LoadSample(
        at=newest.at,
        window_seconds=window,
        workers_expected=len(workers),
        workers_reporting=reporting,
        arrival_rate=sum(rates.arrival.values()) if rates.arrival else None,
        processed_rate=sum(worker_rates_known) if worker_rates_known else None,
        lag=sum(lag_by_key_group.values()) if lag_by_key_group else None,
        lag_trend=sum(rates.trend.values()) if rates.trend else None,
        per_worker=tuple(per_worker),
        lag_by_key_group=lag_by_key_group,
        complete=not missing,
        missing=tuple(missing),
        arrival_by_key_group=rates.arrival,
        processed_by_key_group=rates.processed,
    )


def _worker_loads(
    rounds: Sequence[ScrapeRound],
    workers: Sequence[WorkerTarget],
    has_window: bool,
    missing: list[str],
) -> tuple[list[WorkerLoad], int]:
    """Each worker's load over the window, and how many covered all of it; what is not
    known is added to ``missing``."""
    oldest, newest = rounds[0], rounds[-1]
    per_worker: list[WorkerLoad] = []
    reporting = 0
    for target in workers:
        name = target.name
        latest = newest.results.get(name)
        if not isinstance(latest, WorkerSnapshot):
            missing.append(f"{name}: {latest if latest is not None else 'not scraped'}")
            continue
        series = [(r.at, s) for r in rounds if isinstance(s := r.results.get(name), WorkerSnapshot)]
        start = 0
        reset_at: float | None = None
        for i in range(1, len(series)):
            if counters_reset(series[i - 1][1], series[i][1]):
                start, reset_at = i, series[i][0]
        segment = series[start:]
        rates = worker_rates(*segment[0], *segment[-1]) if len(segment) >= 2 else None
        covered = newest.at - segment[0][0]
        if has_window:
            if segment[0][0] == oldest.at:
                reporting += 1
            elif reset_at is not None:
                missing.append(
                    f"{name}: counters went back (worker restarted) "
                    f"{_ago(newest.at - reset_at)} before the newest scrape; "
                    + (f"rates cover the last {_ago(covered)}" if rates else "no rates yet")
                )
            else:
                at_start = oldest.results.get(name)
                why = at_start if isinstance(at_start, str) else "not scraped yet"
                missing.append(
                    f"{name}: no data at the start of the window ({why}); "
                    + (f"rates cover the last {_ago(covered)}" if rates else "no rates yet")
                )
        per_worker.append(
            WorkerLoad(
                ordinal=target.ordinal,
                name=name,
                processed_rate=rates.processed_rate if rates else None,
                busy_ratio=rates.busy_ratio if rates else None,
                key_groups_owned=latest.key_groups_owned,
                generation=latest.generation,
                cache_hit_ratio=rates.cache_hit_ratio if rates else None,
                lag=sum(r.lag for r in latest.key_groups.values()),
                failed_key_groups=latest.failed,
                key_groups_finished=latest.key_groups_finished,
            )
        )
    return per_worker, reporting


@dataclass(frozen=True, slots=True)
class _ScrapedRates:
    """Per key group over the window: records/s arriving and processed, and the lag's
    trend; and each key group's newest reading."""

    arrival: dict[int, float]
    processed: dict[int, float]
    trend: dict[int, float]
    newest: dict[int, KeyGroupReading]


def _key_group_rates(
    rounds: Sequence[ScrapeRound],
    workers: Sequence[WorkerTarget],
    has_window: bool,
    missing: list[str],
) -> _ScrapedRates:
    """Each key group's rates, from whichever workers report it in each round."""
    newest = rounds[-1]
    points: dict[int, list[tuple[float, KeyGroupReading]]] = {}
    for r in rounds:
        for kg, reading in _combined_key_groups(r).items():
            points.setdefault(kg, []).append((r.at, reading))
    newest_kgs = _combined_key_groups(newest)
    arrival: dict[int, float] = {}
    processed: dict[int, float] = {}
    trend: dict[int, float] = {}
    # said once per reason, the key groups as ranges
    unowned: dict[float, list[int]] = {}  # by the scrape that last saw them
    single: list[int] = []  # reported in one scrape only
    for kg in sorted(points):
        series_kg = points[kg]
        if kg not in newest_kgs:
            unowned.setdefault(series_kg[-1][0], []).append(kg)
        (t0, first), (t1, last) = series_kg[0], series_kg[-1]
        if t1 <= t0:
            if has_window:
                single.append(kg)
            continue
        if last.end_offset < first.end_offset:
            missing.append(
                f"key group {kg}: end offset went back from {first.end_offset} to "
                f"{last.end_offset}, no rate"
            )
            continue
        arrival[kg] = (last.end_offset - first.end_offset) / (t1 - t0)
        trend[kg] = (last.lag - first.lag) / (t1 - t0)
        if last.position >= first.position:  # (a replay after a handoff: no rate)
            processed[kg] = (last.position - first.position) / (t1 - t0)
    for last_seen, kgs in sorted(unowned.items()):
        missing.append(
            f"{key_groups_named(kgs)}: not reported in the newest scrape (no running owner; "
            f"last seen {_ago(newest.at - last_seen)} before)"
        )
    if single:
        missing.append(f"{key_groups_named(single)}: reported in one scrape only, no rate")
    if not points and workers:
        missing.append("key groups: no worker reports any (no assignment running)")
    return _ScrapedRates(arrival, processed, trend, newest_kgs)


# -- the direct scrape ----------------------------------------------------------------------


def describe_error(exc: BaseException, timeout: float) -> str:
    """A scrape failure in words ("connection refused", "no answer within 1 s")."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return f"no answer within {timeout:g} s"
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class DirectScrapeProvider:
    """Scrapes the workers' ``/metrics`` directly (local mode).

    Every ``collect`` is one scrape round of all given workers, concurrently,
    each bounded by ``timeout``; the rounds of the last ``window_seconds`` are
    kept per job.  ``clock`` gives the rounds' unix times (tests pass their own).
    """

    def __init__(
        self,
        window_seconds: float = 60.0,
        timeout: float = 1.0,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if window_seconds <= 0 or timeout <= 0:
            raise ValueError("window_seconds and timeout must be positive")
        self.window_seconds = window_seconds
        self.timeout = timeout
        self._clock = clock
        self._rounds: dict[str, deque[ScrapeRound]] = {}
        self._client: httpx.AsyncClient | None = None
        self._lock = asyncio.Lock()

    async def collect(self, job: str, workers: Sequence[WorkerTarget]) -> LoadSample:
        async with self._lock:
            client = self._client
            if client is None:
                # trust_env=False: worker endpoints are never reached through a proxy.
                client = self._client = httpx.AsyncClient(timeout=self.timeout, trust_env=False)
            # The round's time is taken as the scrapes start: answers come within
            # milliseconds, and a worker that times out does not skew the others.
            now = self._clock()
            results = await asyncio.gather(*(self._scrape(client, job, w) for w in workers))
            ring = self._rounds.setdefault(job, deque())
            if ring and now <= ring[-1].at:
                ring.clear()  # the clock went back: the old rounds cannot be rated against
            ring.append(
                ScrapeRound(now, {w.name: r for w, r in zip(workers, results, strict=True)})
            )
            kept = prune(ring, now, self.window_seconds)
            ring.clear()
            ring.extend(kept)
            return summarize(kept, workers)

    def forget(self, job: str) -> None:
        """Drop a job's scrapes (the job was deleted)."""
        self._rounds.pop(job, None)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _scrape(
        self, client: httpx.AsyncClient, job: str, target: WorkerTarget
    ) -> WorkerSnapshot | str:
        try:
            async with asyncio.timeout(self.timeout):
                response = await client.get(target.metrics_url)
        except (TimeoutError, httpx.HTTPError, OSError) as exc:
            return describe_error(exc, self.timeout)
        if response.status_code != 200:
            return f"HTTP {response.status_code} from {target.metrics_url}"
        return read_scrape(response.text, job=job, name=target.name)
