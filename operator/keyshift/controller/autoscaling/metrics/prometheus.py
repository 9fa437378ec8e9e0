"""Load metrics from Prometheus: the ``MetricsProvider`` the operator uses.

``PrometheusMetricsProvider`` runs PromQL over the workers' metrics (names in
docs/design.md, "Metrics") through ``prometheus_api_client.PrometheusConnect`` and
turns the answers into the same ``LoadSample`` as ``DirectScrapeProvider``.
The PromQL and the arithmetic live in pure functions, tested without a server:

- ``queries_for(job, window, overrides)``: the named PromQL of one collect;
- ``parse_vector``: one answer of the query API -> ``Series``;
- ``to_load_sample``: the answers (or why a query failed) -> ``LoadSample``.

Every query of a collect is evaluated at the same instant ``at``; the window is
``[at - window, at]``.  The rules, as in ``direct``: missing or
partial data is never read as zero.  A value that cannot be measured is
``None`` and ``complete`` is False with the reason in ``missing``:

- Prometheus unreachable or a query failing: the values that need it are
  ``None``, one reason per distinct error.
- A worker is *present* when its ``keyshift_records_processed_total`` has a
  sample now (Prometheus marks the series stale at the first failed scrape, so a
  stopped worker disappears at once, while its ``rate()`` over the window would
  still answer).  An expected worker that is not present is named in
  ``missing`` and left out of ``per_worker``.
- A worker is *reporting* when it is present and its first sample in the window
  is at most ``coverage_tolerance(window)`` after the window's start (a
  subquery of ``timestamp()``: the sample times, not the evaluation times) and
  its counters did not go back (``resets``) inside the window.
- Arrival rate: per key group, ``deriv`` over the window of the highest end
  offset any worker reports for it (``max by (key_group)``), so a key group
  reported by two workers during a handoff, or moving between them, makes no
  spike or dip; summed over key groups.  Lag: per key group the highest lag
  reported, summed.  A key group seen in the window but reported by no worker
  now (no running owner) makes the sample incomplete.  Processed rate per key
  group: ``deriv`` of the highest source position reported for it, the same way
  (the load a rescale plans its ranges with, with the arrival rate).
- A query override (``spec.autoscaler.queries``) that returns no series is
  missing, not zero; ``$job`` (the StreamJob's name; its label on keyshift's
  series is ``streamjob``), ``$namespace`` and ``$window`` in an override are
  replaced by the job's name, its namespace (``local`` for ``keyshift run``) and
  the window as a PromQL duration.  Overrides of ``processedRate`` and
  ``busyRatio`` must return one series per worker with a ``worker`` label; those
  of ``arrivalRate`` and ``lag`` are summed.

The built-in queries select ``{streamjob="<name>", namespace="<namespace>"}``.
Neither label is one Prometheus sets on a target, except ``namespace`` with
Kubernetes discovery (a PodMonitor): there it is the pod's namespace, the same
value, so no scrape config needs ``honor_labels``.  The missing-data reason
names the selector when no series of the job is found at all.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from keyshift.api.spec import AutoscalerSpec, InvalidSpec, QueriesSpec
from keyshift.controller.autoscaling.metrics.base import (
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
    LoadSample,
    ScalingMetric,
    WorkerLoad,
    WorkerTarget,
    failed_key_groups,
    key_groups_named,
)
from keyshift.runtime.metrics import LOCAL_NAMESPACE

__all__ = [
    "PrometheusMetricsProvider",
    "Series",
    "coverage_tolerance",
    "describe_query_error",
    "job_selector",
    "overridden_queries",
    "parse_vector",
    "promql_duration",
    "promql_string",
    "queries_for",
    "subquery_step",
    "to_load_sample",
]


#: A worker's first sample may come this fraction of the window after its start and
#: still count as covering the window.
START_SLACK = 0.05

_PLACEHOLDER = re.compile(r"\$(job|namespace|window)\b")


# -- PromQL (pure) --------------------------------------------------------------------


def promql_duration(seconds: float) -> str:
    """A PromQL duration (``60s``, ``2500ms``); PromQL has no fractional durations."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"a PromQL duration must be positive, not {seconds!r} s")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def subquery_step(window_seconds: float) -> float:
    """Resolution of the window's subqueries: 60 points per window, at least 1 s."""
    return max(1.0, window_seconds / 60)


def coverage_tolerance(window_seconds: float) -> float:
    """How long after the window's start a worker's first sample may come and still
    cover the window.  At least one subquery step: the first step of the subquery
    lies up to a step after the window's start and sees the newest sample before it."""
    return max(subquery_step(window_seconds), START_SLACK * window_seconds)


def expand_override(
    query: str, job: str, window_seconds: float, namespace: str = LOCAL_NAMESPACE
) -> str:
    """Replace ``$job`` (the job's name, unquoted), ``$namespace`` (its namespace,
    unquoted) and ``$window`` (a PromQL duration)."""
    values = {"job": job, "namespace": namespace, "window": promql_duration(window_seconds)}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], query)


def job_selector(job: str, namespace: str = LOCAL_NAMESPACE) -> str:
    """The label matchers of one StreamJob's series: ``{streamjob="...", namespace="..."}``."""
    return f"{{streamjob={promql_string(job)}, namespace={promql_string(namespace)}}}"


def queries_for(
    job: str,
    window_seconds: float,
    overrides: QueriesSpec | None = None,
    namespace: str = LOCAL_NAMESPACE,
) -> dict[str, str]:
    """The named PromQL of one collect of ``job`` (in ``namespace``) over a window of
    ``window_seconds``."""
    w = promql_duration(window_seconds)
    sub = f"[{w}:{promql_duration(subquery_step(window_seconds))}]"
    sel = job_selector(job, namespace)
    kg_lag = f"max by (key_group) ({LAG}{sel})"
    queries: dict[str, str] = {
        # per key group: the highest end offset any worker reports (handoffs)
        ScalingMetric.KEY_GROUP_ARRIVAL: f"deriv((max by (key_group) ({END_OFFSET}{sel})){sub})",
        ScalingMetric.KEY_GROUP_LAG: kg_lag,
        ScalingMetric.KEY_GROUP_PROCESSED: f"deriv((max by (key_group) ({POSITION}{sel})){sub})",
        ScalingMetric.LAG_TREND: f"deriv((sum({kg_lag})){sub})",
        ScalingMetric.PROCESSED_RATE: f"sum by (worker) (rate({PROCESSED}{sel}[{w}]))",
        ScalingMetric.BUSY_RATIO: f"sum by (worker) (rate({BUSY}{sel}[{w}]))",
        ScalingMetric.CACHE_HIT_RATIO: (
            f"sum by (worker) (rate({CACHE_HITS}{sel}[{w}])) / ("
            f"sum by (worker) (rate({CACHE_HITS}{sel}[{w}])) + "
            f"sum by (worker) (rate({CACHE_MISSES}{sel}[{w}])))"
        ),
        ScalingMetric.LAST_SEEN: f"max by (worker) (timestamp({PROCESSED}{sel}))",
        ScalingMetric.FIRST_SEEN: (
            f"min by (worker) (min_over_time(timestamp({PROCESSED}{sel}){sub}))"
        ),
        ScalingMetric.RESTARTS: f"sum by (worker) (resets({PROCESSED}{sel}[{w}]))",
        ScalingMetric.KEY_GROUPS_OWNED: f"max by (worker) ({OWNED}{sel})",
        ScalingMetric.GENERATION: f"max by (worker) ({GENERATION}{sel})",
        ScalingMetric.WORKER_LAG: f"sum by (worker) ({LAG}{sel})",
        ScalingMetric.FAILED_SINCE: f"max by (worker, key_group, reason) ({FAILED_SINCE}{sel})",
        ScalingMetric.KEY_GROUPS_FINISHED: f"max by (worker) ({FINISHED}{sel})",
        ScalingMetric.FAILED_OFFSET: f"max by (worker, key_group) ({FAILED_OFFSET}{sel})",
    }
    if overrides is not None:
        if overrides.arrival_rate:
            queries[ScalingMetric.ARRIVAL_RATE] = expand_override(
                overrides.arrival_rate, job, window_seconds, namespace
            )
        if overrides.lag:
            lag = expand_override(overrides.lag, job, window_seconds, namespace)
            queries[ScalingMetric.LAG] = lag
            queries[ScalingMetric.LAG_TREND] = f"deriv((sum({lag})){sub})"
        if overrides.processed_rate:
            queries[ScalingMetric.PROCESSED_RATE] = expand_override(
                overrides.processed_rate, job, window_seconds, namespace
            )
        if overrides.busy_ratio:
            queries[ScalingMetric.BUSY_RATIO] = expand_override(
                overrides.busy_ratio, job, window_seconds, namespace
            )
    return queries


def overridden_queries(overrides: QueriesSpec | None) -> frozenset[str]:
    """The names of the queries ``overrides`` replaces."""
    if overrides is None:
        return frozenset()
    names = {
        ScalingMetric.ARRIVAL_RATE: overrides.arrival_rate,
        ScalingMetric.LAG: overrides.lag,
        ScalingMetric.PROCESSED_RATE: overrides.processed_rate,
        ScalingMetric.BUSY_RATIO: overrides.busy_ratio,
    }
    return frozenset(name for name, query in names.items() if query)


# -- answers (pure) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Series:
    """One element of an instant query's answer."""

    labels: Mapping[str, str]
    value: float  # may be NaN or infinite: the readers below skip those


def parse_vector(result: Any) -> list[Series]:
    """The ``data.result`` of an instant query (a vector, or a scalar) as ``Series``;
    ``ValueError`` for anything else (a range vector, a string, garbage)."""
    if (
        isinstance(result, list)
        and len(result) == 2
        and isinstance(result[0], int | float)
        and isinstance(result[1], str)
    ):
        return [Series({}, _number(result[1]))]  # a scalar
    if not isinstance(result, list):
        raise ValueError(f"unexpected query result {result!r:.100}")
    out: list[Series] = []
    for item in result:
        if not isinstance(item, dict):
            raise ValueError(f"unexpected query result element {item!r:.100}")
        if "values" in item:
            raise ValueError("the query returns a range vector, expected an instant vector")
        metric, value = item.get("metric"), item.get("value")
        if not isinstance(metric, dict) or not isinstance(value, list) or len(value) != 2:
            raise ValueError(f"unexpected query result element {item!r:.100}")
        out.append(Series({str(k): str(v) for k, v in metric.items()}, _number(value[1])))
    return out


def _number(text: object) -> float:
    try:
        return float(str(text))
    except ValueError:
        raise ValueError(f"not a number: {text!r:.50}") from None


Answer = Sequence[Series] | str  # the series, or why the query failed


def _finite(series: Sequence[Series]) -> list[Series]:
    return [s for s in series if math.isfinite(s.value)]


def _by_label(series: Sequence[Series], label: str) -> dict[str, float]:
    """Finite values by the value of ``label`` (series without it are left out; two
    series with the same value: the highest)."""
    out: dict[str, float] = {}
    for s in _finite(series):
        key = s.labels.get(label)
        if key is not None:
            out[key] = max(out[key], s.value) if key in out else s.value
    return out


def _by_key_group(series: Sequence[Series]) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in _by_label(series, "key_group").items():
        try:
            kg = int(key)
        except ValueError:
            continue
        if kg >= 0:
            out[kg] = value
    return out


def _ago(seconds: float) -> str:
    return f"{seconds:.1f} s"


class _Answers:
    """The answers of one collect, read by name; what is missing is noted in ``missing``."""

    def __init__(
        self, answers: Mapping[str, Answer], overridden: frozenset[str], missing: list[str]
    ) -> None:
        self.answers = answers
        self.overridden = overridden
        self.missing = missing

    def failures(self) -> None:
        """One line per query error, naming the queries it failed."""
        failures: dict[str, list[str]] = {}
        for name, answer in self.answers.items():
            if isinstance(answer, str):
                failures.setdefault(answer, []).append(name)
        for error, names in failures.items():
            every = len(names) == len(self.answers)
            which = "all queries" if every else "queries " + ", ".join(sorted(names))
            self.missing.append(f"prometheus: {error} ({which})")

    def get(self, name: str) -> Sequence[Series] | None:
        answer = self.answers.get(name)
        if answer is None:
            self.missing.append(f"{name}: not queried")
            return None
        return None if isinstance(answer, str) else answer

    def per_worker(self, name: str) -> dict[str, float] | None:
        series = self.get(name)
        if series is None:
            return None
        if name in self.overridden and _finite(series) and not _by_label(series, "worker"):
            self.missing.append(f"{name}: the query override returns no series with a worker label")
        return _by_label(series, "worker")

    def total(self, name: str) -> float | None:
        """The sum of an overridden query's series; none is missing, not zero."""
        series = self.get(name)
        if series is None:
            return None
        values = [s.value for s in _finite(series)]
        if not values:
            self.missing.append(f"{name}: the query override returned no series")
            return None
        return sum(values)


def to_load_sample(
    answers: Mapping[str, Answer],
    *,
    job: str,
    workers: Sequence[WorkerTarget],
    at: float,
    window_seconds: float,
    overridden: frozenset[str] = frozenset(),
    namespace: str = LOCAL_NAMESPACE,
) -> LoadSample:
    """The ``LoadSample`` of ``job`` (in ``namespace``) from the answers to
    ``queries_for`` at ``at``, in the steps the direct provider takes too: the workers'
    loads, the key groups' rates, then the sums."""
    missing: list[str] = []
    read = _Answers(answers, overridden, missing)
    read.failures()
    if not workers:
        missing.append("workers: none expected")
    per_worker, reporting = _worker_loads(read, workers, at, window_seconds, job, namespace)
    kg = _key_group_rates(read, workers)

    arrival: float | None = None
    if ScalingMetric.ARRIVAL_RATE in overridden:
        arrival = read.total(ScalingMetric.ARRIVAL_RATE)
    elif kg.arrival is not None and kg.arrival:
        went_back = sorted(k for k, r in kg.arrival.items() if r < -1e-9)
        if went_back:
            missing.append(
                f"{key_groups_named(went_back)}: end offset went back in the window, no rate"
            )
        else:
            arrival = sum(max(0.0, r) for r in kg.arrival.values())

    lag: int | None = None
    if ScalingMetric.LAG in overridden:
        value = read.total(ScalingMetric.LAG)
        lag = None if value is None else max(0, round(value))
    elif kg.lag and not kg.unowned:
        lag = sum(kg.lag.values())  # (with a key group unowned: a lower bound only)

    trend: float | None = None
    trend_series = read.get(ScalingMetric.LAG_TREND)
    if trend_series is not None:
        trends = [s.value for s in _finite(trend_series)]
        if trends:
            trend = sum(trends)
        elif lag is not None:  # (no lag: the reason is given already)
            missing.append("lag trend: no answer (fewer than two samples in the window)")

    rates = [w.processed_rate for w in per_worker]
    known = len(per_worker) == len(workers) and all(r is not None for r in rates)
    return LoadSample(
        at=at,
        window_seconds=window_seconds,
        workers_expected=len(workers),
        workers_reporting=reporting,
        arrival_rate=arrival,
        processed_rate=sum(r for r in rates if r is not None) if known and rates else None,
        lag=lag,
        lag_trend=trend,
        per_worker=tuple(per_worker),
        lag_by_key_group=kg.lag,
        complete=not missing,
        missing=tuple(missing),
        arrival_by_key_group={k: max(0.0, r) for k, r in sorted((kg.arrival or {}).items())},
        processed_by_key_group=kg.processed,
    )


def _worker_loads(
    read: _Answers,
    workers: Sequence[WorkerTarget],
    at: float,
    window_seconds: float,
    job: str,
    namespace: str,
) -> tuple[list[WorkerLoad], int]:
    """Each worker's load over the window, and how many covered all of it."""
    missing, overridden = read.missing, read.overridden
    last_seen = read.per_worker(ScalingMetric.LAST_SEEN)
    first_seen = read.per_worker(ScalingMetric.FIRST_SEEN)
    restarts = read.per_worker(ScalingMetric.RESTARTS)
    processed = read.per_worker(ScalingMetric.PROCESSED_RATE)
    busy = read.per_worker(ScalingMetric.BUSY_RATIO)
    hit_ratio = read.per_worker(ScalingMetric.CACHE_HIT_RATIO) or {}
    owned = read.per_worker(ScalingMetric.KEY_GROUPS_OWNED)
    generation = read.per_worker(ScalingMetric.GENERATION)
    worker_lag = read.per_worker(ScalingMetric.WORKER_LAG) or {}
    failed_series = read.get(ScalingMetric.FAILED_SINCE) or []
    finished = read.per_worker(ScalingMetric.KEY_GROUPS_FINISHED) or {}
    offset_series = read.get(ScalingMetric.FAILED_OFFSET) or []
    window_start = at - window_seconds
    tolerance = coverage_tolerance(window_seconds)

    per_worker: list[WorkerLoad] = []
    reporting = 0
    for target in workers:
        name = target.name
        if last_seen is None:
            continue  # the failure is reported above
        if name not in last_seen:
            missing.append(
                f"{name}: no sample in Prometheus now (down, not scraped, or not exporting)"
            )
            continue
        problems: list[str] = []
        first = None if first_seen is None else first_seen.get(name)
        if first_seen is None or restarts is None:
            pass  # coverage unknown: not reporting; the failure is reported above
        elif first is None or first > window_start + tolerance:
            since = f"only for the last {_ago(at - first)}" if first is not None else "none"
            problems.append(
                f"data {since} of the {window_seconds:g} s window (joined or came back within it)"
            )
        elif restarts.get(name, 0.0) > 0:
            problems.append("counters went back (worker restarted) within the window")
        else:
            reporting += 1
        rate = None if processed is None else processed.get(name)
        ratio = None if busy is None else busy.get(name)
        checks: tuple[tuple[str, str, dict[str, float] | None], ...] = (
            ("processed rate", ScalingMetric.PROCESSED_RATE, processed),
            ("busy ratio", ScalingMetric.BUSY_RATIO, busy),
            ("key groups owned", ScalingMetric.KEY_GROUPS_OWNED, owned),
            ("generation", ScalingMetric.GENERATION, generation),
        )
        for what, query, values in checks:
            if values is not None and name not in values:  # (None: the query failed)
                how = "the query override" if query in overridden else "Prometheus"
                problems.append(f"no {what} ({how} returned none for it)")
        missing.extend(f"{name}: {p}" for p in problems)
        per_worker.append(
            WorkerLoad(
                ordinal=target.ordinal,
                name=name,
                processed_rate=rate,
                busy_ratio=None if ratio is None else min(1.0, max(0.0, ratio)),
                key_groups_owned=int((owned or {}).get(name, 0)),
                generation=int((generation or {}).get(name, 0)),
                cache_hit_ratio=hit_ratio.get(name),
                lag=round(worker_lag.get(name, 0.0)),
                key_groups_finished=int(finished.get(name, 0)),
                failed_key_groups=failed_key_groups(
                    name,
                    [(s.labels, s.value) for s in failed_series if s.labels.get("worker") == name],
                    _by_key_group([s for s in offset_series if s.labels.get("worker") == name]),
                ),
            )
        )
    if last_seen is not None and workers and not last_seen:
        missing.append(
            f"workers: no series {PROCESSED}{job_selector(job, namespace)} at all: is "
            "Prometheus scraping the workers (a PodMonitor, or their prometheus.io "
            "annotations)? If a relabeling renames `streamjob` or `namespace`, override "
            "the queries"
        )
    return per_worker, reporting


@dataclass(frozen=True, slots=True)
class _QueriedRates:
    """Per key group: records/s arriving (None: the query failed) and processed, the lag
    now, and the key groups with an arrival rate but no owner now."""

    arrival: dict[int, float] | None
    processed: dict[int, float]
    lag: dict[int, int]
    unowned: list[int]


def _key_group_rates(read: _Answers, workers: Sequence[WorkerTarget]) -> _QueriedRates:
    """Each key group's rates and lag, from the per key group queries."""
    missing = read.missing
    kg_arrival_series = read.get(ScalingMetric.KEY_GROUP_ARRIVAL)
    kg_lag_series = read.get(ScalingMetric.KEY_GROUP_LAG)
    kg_arrival = _by_key_group(kg_arrival_series) if kg_arrival_series is not None else None
    lag_by_key_group = (
        {kg: round(v) for kg, v in sorted(_by_key_group(kg_lag_series).items())}
        if kg_lag_series is not None
        else {}
    )
    unowned: list[int] = []
    if kg_arrival is not None and kg_lag_series is not None:
        if not kg_arrival and not lag_by_key_group and workers:
            missing.append(
                "key groups: no worker reports any (no assignment running, or fewer than "
                "two samples in the window)"
            )
        unowned = sorted(set(kg_arrival) - set(lag_by_key_group))
        if unowned:
            missing.append(f"{key_groups_named(unowned)}: not reported now (no running owner)")
        too_new = sorted(set(lag_by_key_group) - set(kg_arrival))
        if too_new:
            missing.append(
                f"{key_groups_named(too_new)}: no arrival rate yet (fewer than two samples)"
            )

    kg_processed_series = read.answers.get(ScalingMetric.KEY_GROUP_PROCESSED)
    processed = (
        {kg: max(0.0, v) for kg, v in sorted(_by_key_group(kg_processed_series).items())}
        if kg_processed_series is not None and not isinstance(kg_processed_series, str)
        else {}
    )  # (not in ``missing``: it only steers a rescale's ranges, which fall back to counts)
    return _QueriedRates(kg_arrival, processed, lag_by_key_group, unowned)


# -- errors ---------------------------------------------------------------------------

_API_ERROR = re.compile(r'"error"\s*:\s*"((?:[^"\\]|\\.)*)"')
_STATUS = re.compile(r"HTTP Status Code (\d+)")


def describe_query_error(exc: BaseException, timeout: float) -> str:
    """A failed query in words ("connection refused", "HTTP 400: parse error ...")."""
    if isinstance(exc, requests.Timeout | TimeoutError):
        return f"no answer within {timeout:g} s"
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if isinstance(exc, PrometheusApiClientException):
        status = _STATUS.search(text)
        error = _API_ERROR.search(text)
        if status:
            detail = error.group(1).replace('\\"', '"') if error else text[:200]
            return f"HTTP {status.group(1)}: {detail}"
    if isinstance(exc, requests.ConnectionError):
        return f"cannot connect: {text[:200]}"
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


# -- the provider ---------------------------------------------------------------------


class PrometheusMetricsProvider:
    """Load samples from a Prometheus server (the operator's provider).

    ``window_seconds`` is the window the rates cover (``metricsWindowSeconds``);
    ``token`` (bearer) or ``username``/``password`` (basic) authenticate;
    ``verify_tls=False`` skips certificate checks (``insecureSkipVerify``);
    ``queries`` are the PromQL overrides; ``namespace`` is the StreamJob's (its
    series' ``namespace`` label).  ``PrometheusConnect`` is synchronous:
    each query runs in a thread, all of one collect concurrently, each bounded
    by ``timeout`` (one immediate retry on a connection error or a 502/503/504).
    """

    def __init__(
        self,
        url: str,
        *,
        window_seconds: float = 60.0,
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
        verify_tls: bool = True,
        queries: QueriesSpec | None = None,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        namespace: str = LOCAL_NAMESPACE,
    ) -> None:
        if window_seconds <= 0 or timeout <= 0:
            raise ValueError("window_seconds and timeout must be positive")
        promql_duration(window_seconds)  # a window PromQL can express
        if token is not None and (username is not None or password is not None):
            raise InvalidSpec("give a bearer token or basic auth credentials, not both")
        if (username is None) != (password is None):
            raise InvalidSpec("basic auth needs both username and password")
        self.url = url.rstrip("/")
        self.window_seconds = window_seconds
        self.timeout = timeout
        self.queries = queries
        self.namespace = namespace
        self._clock = clock
        # The library annotates ``auth: tuple = None`` and ``timeout: int``; requests
        # takes None and floats.
        options: dict[str, Any] = {
            "headers": {"Authorization": f"Bearer {token}"} if token is not None else {},
            "auth": (username, password) if username is not None else None,
            "timeout": timeout,
        }
        self._prom: PrometheusConnect | None = PrometheusConnect(
            url=self.url,
            disable_ssl=not verify_tls,
            retry=Retry(total=1, backoff_factor=0.2, status_forcelist=(502, 503, 504)),
            **options,
        )

    @classmethod
    def from_spec(
        cls,
        spec: AutoscalerSpec,
        *,
        default_url: str | None = None,
        credentials: Mapping[str, str] | None = None,
        namespace: str = LOCAL_NAMESPACE,
    ) -> PrometheusMetricsProvider:
        """The provider a StreamJob's ``spec.autoscaler`` asks for; ``credentials`` are
        the keys of its ``prometheus.secretRef`` Secret (``token``, or ``username`` and
        ``password``)."""
        url = spec.prometheus.url or default_url
        if not url:
            raise InvalidSpec("no Prometheus URL: set spec.autoscaler.prometheus.url")
        creds = credentials or {}
        return cls(
            url,
            window_seconds=spec.metrics_window_seconds,
            token=creds.get("token"),
            username=creds.get("username"),
            password=creds.get("password"),
            verify_tls=not spec.prometheus.insecure_skip_verify,
            queries=spec.queries,
            namespace=namespace,
        )

    async def collect(self, job: str, workers: Sequence[WorkerTarget]) -> LoadSample:
        prom = self._prom
        if prom is None:
            raise RuntimeError("the provider is closed")
        at = self._clock()
        queries = queries_for(job, self.window_seconds, self.queries, self.namespace)
        answers = await asyncio.gather(
            *(asyncio.to_thread(self._query, prom, q, at) for q in queries.values())
        )
        return to_load_sample(
            dict(zip(queries, answers, strict=True)),
            job=job,
            workers=workers,
            at=at,
            window_seconds=self.window_seconds,
            overridden=overridden_queries(self.queries),
            namespace=self.namespace,
        )

    def _query(self, prom: PrometheusConnect, query: str, at: float) -> Answer:
        try:
            result = prom.custom_query(query, params={"time": f"{at:.3f}"})
            return parse_vector(result)
        except (requests.RequestException, PrometheusApiClientException, ValueError) as exc:
            return describe_query_error(exc, self.timeout)

    async def close(self) -> None:
        prom, self._prom = self._prom, None
        if prom is not None:
            prom.close()
