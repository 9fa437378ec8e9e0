"""The Prometheus metrics provider: the PromQL it builds and the conversion of the
answers to a ``LoadSample`` (pure), then the real thing: a real Prometheus (the
``prometheus`` fixture) scraping in-process metric endpoints through a handoff,
and real worker processes over the generator."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_client import CONTENT_TYPE_LATEST

from keyshift.api.names import worker_name
from keyshift.api.spec import AutoscalerSpec, QueriesSpec
from keyshift.controller.autoscaling.metrics.base import (
    FailedKeyGroup,
    LoadSample,
    WorkerTarget,
    key_group_load,
)
from keyshift.controller.autoscaling.metrics.base import (
    ScalingMetric as M,
)
from keyshift.controller.autoscaling.metrics.prometheus import (
    Answer,
    PrometheusMetricsProvider,
    Series,
    coverage_tolerance,
    describe_query_error,
    overridden_queries,
    parse_vector,
    promql_duration,
    queries_for,
    to_load_sample,
)
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.metrics import WorkerMetrics
from keyshift.store import Assignment, open_store
from keyshift.store.server import LocalServer, free_port
from tests.prometheus_server import PrometheusServer
from tests.support import WorkerProcess, counter_manifest, wait_for, write_manifest

JOB = "counter"
W0, W1 = "counter-worker-0", "counter-worker-1"
TARGETS = (
    WorkerTarget(0, W0, "http://unused/0"),
    WorkerTarget(1, W1, "http://unused/1"),
)
AT, WINDOW = 10_000.0, 60.0


# -- the PromQL -----------------------------------------------------------------------


def test_default_queries() -> None:
    q = queries_for(JOB, 60, namespace="shop")
    sel = '{streamjob="counter", namespace="shop"}'
    assert q[M.KEY_GROUP_ARRIVAL] == (
        f"deriv((max by (key_group) (keyshift_source_end_offset{sel}))[60s:1s])"
    )
    assert q[M.KEY_GROUP_LAG] == f"max by (key_group) (keyshift_source_lag_records{sel})"
    assert q[M.KEY_GROUP_PROCESSED] == (
        f"deriv((max by (key_group) (keyshift_source_position{sel}))[60s:1s])"
    )
    assert q[M.LAG_TREND] == (
        f"deriv((sum(max by (key_group) (keyshift_source_lag_records{sel})))[60s:1s])"
    )
    assert q[M.PROCESSED_RATE] == (
        f"sum by (worker) (rate(keyshift_records_processed_total{sel}[60s]))"
    )
    assert q[M.BUSY_RATIO] == f"sum by (worker) (rate(keyshift_busy_seconds_total{sel}[60s]))"
    assert q[M.LAST_SEEN] == f"max by (worker) (timestamp(keyshift_records_processed_total{sel}))"
    assert q[M.FIRST_SEEN] == (
        f"min by (worker) (min_over_time(timestamp(keyshift_records_processed_total{sel})[60s:1s]))"
    )
    assert q[M.RESTARTS] == f"sum by (worker) (resets(keyshift_records_processed_total{sel}[60s]))"
    assert M.ARRIVAL_RATE not in q and M.LAG not in q  # the sums of the per key group ones
    assert "keyshift_state_cache_hits_total" in q[M.CACHE_HIT_RATIO]
    assert {
        M.KEY_GROUPS_OWNED,
        M.GENERATION,
        M.WORKER_LAG,
    } <= set(q)


def test_windows_and_job_names_are_valid_promql() -> None:
    assert promql_duration(60) == "60s"
    assert promql_duration(8.5) == "8500ms"
    with pytest.raises(ValueError, match="positive"):
        promql_duration(0.0001)
    assert "[300s:5s]" in queries_for(JOB, 300)[M.KEY_GROUP_ARRIVAL]  # 60 points per window
    assert "[8500ms:1s]" in queries_for(JOB, 8.5)[M.KEY_GROUP_ARRIVAL]
    assert (
        '{streamjob="a\\"b\\\\c", namespace="local"}' in queries_for('a"b\\c', 60)[M.PROCESSED_RATE]
    )
    assert coverage_tolerance(60) == 3.0 and coverage_tolerance(8) == 1.0


def test_query_overrides() -> None:
    overrides = QueriesSpec.model_validate(
        {
            "arrivalRate": 'sum(rate(kafka_topic_partition_current_offset{topic="$job"}[$window]))',
            "lag": 'sum(kafka_consumergroup_lag{consumergroup="$job"})',
            "busyRatio": 'avg by (worker) (my_busy{app="$job", ns="$namespace"})',
        }
    )
    q = queries_for("orders", 30, overrides, namespace="shop")
    assert (
        q[M.ARRIVAL_RATE] == 'sum(rate(kafka_topic_partition_current_offset{topic="orders"}[30s]))'
    )
    assert q[M.LAG] == 'sum(kafka_consumergroup_lag{consumergroup="orders"})'
    assert (
        q[M.LAG_TREND]
        == 'deriv((sum(sum(kafka_consumergroup_lag{consumergroup="orders"})))[30s:1s])'
    )
    assert q[M.BUSY_RATIO] == 'avg by (worker) (my_busy{app="orders", ns="shop"})'
    assert q[M.PROCESSED_RATE] == queries_for("orders", 30, namespace="shop")[M.PROCESSED_RATE]
    assert overridden_queries(overrides) == {
        M.ARRIVAL_RATE,
        M.LAG,
        M.BUSY_RATIO,
    }
    assert overridden_queries(None) == frozenset()
    # a regex anchor is not a placeholder
    anchored = QueriesSpec.model_validate({"lag": 'sum(lag{group=~"^$job$"})'})
    assert queries_for("o", 30, anchored)[M.LAG] == 'sum(lag{group=~"^o$"})'


# -- answers -> LoadSample ----------------------------------------------------------------


def s(value: float, **labels: str) -> Series:
    return Series(labels, value)


def per_worker(v0: float, v1: float) -> list[Series]:
    return [s(v0, worker=W0), s(v1, worker=W1)]


def full() -> dict[str, Answer]:
    """Both workers there for the whole window; 8 key groups at 50 records/s each."""
    return {
        M.KEY_GROUP_ARRIVAL: [s(50.0, key_group=str(kg)) for kg in range(8)],
        M.KEY_GROUP_LAG: [s(3, key_group=str(kg)) for kg in range(8)],
        M.LAG_TREND: [s(0.25)],
        M.PROCESSED_RATE: per_worker(200.0, 199.0),
        M.BUSY_RATIO: per_worker(0.25, 1.2),
        M.CACHE_HIT_RATIO: per_worker(0.9, math.nan),  # NaN: no reads at all (0/0)
        M.LAST_SEEN: per_worker(AT - 0.5, AT - 0.7),
        M.FIRST_SEEN: per_worker(AT - WINDOW - 0.4, AT - WINDOW + 0.6),  # within tolerance
        M.RESTARTS: per_worker(0, 0),
        M.KEY_GROUPS_OWNED: per_worker(4, 4),
        M.GENERATION: per_worker(3, 3),
        M.WORKER_LAG: per_worker(12, 12),
        M.FAILED_SINCE: [],  # no key group stopped
        M.KEY_GROUPS_FINISHED: per_worker(0, 0),
        M.FAILED_OFFSET: [],
    }


def sample(answers: dict[str, Answer], overridden: frozenset[str] = frozenset()) -> LoadSample:
    return to_load_sample(
        answers, job=JOB, workers=TARGETS, at=AT, window_seconds=WINDOW, overridden=overridden
    )


def test_failed_key_groups_are_read_per_worker() -> None:
    answers = full()
    answers[M.FAILED_SINCE] = [
        s(1_700_000_000.0, worker=W1, key_group="5", reason="user-function"),
        s(1_700_000_100.0, worker=W0, key_group="2", reason="store"),
    ]
    answers[M.FAILED_OFFSET] = [s(77, worker=W1, key_group="5")]
    got = sample(answers)
    assert got.complete, got.missing
    by_worker = {w.name: w.failed_key_groups for w in got.per_worker}
    assert by_worker[W1] == (FailedKeyGroup(5, W1, "user-function", 1_700_000_000.0, 77),)
    assert by_worker[W0] == (FailedKeyGroup(2, W0, "store", 1_700_000_100.0, None),)


def test_finished_key_groups_are_read_per_worker() -> None:
    answers = full()
    answers[M.KEY_GROUPS_FINISHED] = per_worker(4, 3)
    got = sample(answers)
    assert got.complete, got.missing
    assert {w.name: w.key_groups_finished for w in got.per_worker} == {W0: 4, W1: 3}


def test_complete_sample() -> None:
    got = sample(full())
    assert got.complete, got.missing
    assert got.missing == ()
    assert (got.at, got.window_seconds) == (AT, WINDOW)
    assert (got.workers_expected, got.workers_reporting) == (2, 2)
    assert got.arrival_rate == pytest.approx(400)
    assert got.processed_rate == pytest.approx(399)
    assert got.lag == 24 and got.lag_trend == 0.25
    assert got.lag_by_key_group == dict.fromkeys(range(8), 3)
    w0, w1 = got.per_worker
    assert (w0.name, w0.ordinal, w0.processed_rate, w0.busy_ratio) == (W0, 0, 200.0, 0.25)
    assert (w0.key_groups_owned, w0.generation, w0.lag, w0.cache_hit_ratio) == (4, 3, 12, 0.9)
    assert w1.busy_ratio == 1.0  # clamped
    assert w1.cache_hit_ratio is None


def test_absent_worker_is_named_not_read_as_zero() -> None:
    answers = full()
    # Stopped: no sample now (stale), though rate() over the window still answers.
    answers[M.LAST_SEEN] = [s(AT - 0.5, worker=W0)]
    got = sample(answers)
    assert not got.complete
    assert any(m.startswith(f"{W1}: no sample in Prometheus now") for m in got.missing)
    assert [w.name for w in got.per_worker] == [W0]
    assert got.workers_reporting == 1
    assert got.processed_rate is None  # a partial sum would read the missing worker as zero
    assert got.arrival_rate == pytest.approx(400)  # per key group, still measured


def test_worker_joined_inside_the_window_is_partial() -> None:
    answers = full()
    answers[M.FIRST_SEEN] = per_worker(AT - WINDOW, AT - 10)
    got = sample(answers)
    assert not got.complete and got.workers_reporting == 1
    assert got.missing == (f"{W1}: data only for the last 10.0 s of the 60 s window "
                           "(joined or came back within it)",)  # fmt: skip
    assert got.per_worker[1].processed_rate == 199.0  # what it has, with the reason


def test_restarted_worker_is_partial() -> None:
    answers = full()
    answers[M.RESTARTS] = per_worker(0, 1)
    got = sample(answers)
    assert got.workers_reporting == 1
    assert got.missing == (f"{W1}: counters went back (worker restarted) within the window",)


def test_worker_without_a_rate_has_none() -> None:
    answers = full()
    answers[M.BUSY_RATIO] = [s(0.25, worker=W0)]
    got = sample(answers)
    assert got.missing == (f"{W1}: no busy ratio (Prometheus returned none for it)",)
    assert got.per_worker[1].busy_ratio is None


def test_no_series_at_all_says_why_and_reads_nothing_as_zero() -> None:
    got = sample({name: [] for name in full()})
    assert not got.complete
    assert got.per_worker == ()
    assert (got.arrival_rate, got.processed_rate, got.lag, got.lag_trend) == (None,) * 4
    text = "\n".join(got.missing)
    assert f"{W0}: no sample in Prometheus now" in text and f"{W1}: no sample" in text
    # the selector it looked for, and where to look
    assert 'keyshift_records_processed_total{streamjob="counter", namespace="local"}' in text
    assert "scraping the workers" in text
    assert "key groups: no worker reports any" in text


def test_unreachable_prometheus_is_one_reason() -> None:
    got = sample(dict.fromkeys(full(), "connection refused"))
    assert got.missing == ("prometheus: connection refused (all queries)",)
    assert not got.complete and got.per_worker == () and got.workers_reporting == 0
    assert (got.arrival_rate, got.processed_rate, got.lag, got.lag_trend) == (None,) * 4


def test_one_failed_query_affects_only_its_values() -> None:
    answers = full()
    answers[M.BUSY_RATIO] = "HTTP 503: overloaded"
    got = sample(answers)
    assert got.missing == ("prometheus: HTTP 503: overloaded (queries busy_ratio)",)
    assert all(w.busy_ratio is None for w in got.per_worker)
    assert all(w.processed_rate is not None for w in got.per_worker)
    assert got.arrival_rate == pytest.approx(400) and got.workers_reporting == 2


def test_key_group_without_a_running_owner() -> None:
    answers = full()
    answers[M.KEY_GROUP_LAG] = [s(3, key_group=str(kg)) for kg in range(8) if kg != 5]
    got = sample(answers)
    assert got.missing == ("key group 5: not reported now (no running owner)",)
    assert got.lag is None  # the sum of the others would hide key group 5's growing lag
    assert 5 not in got.lag_by_key_group
    assert got.arrival_rate == pytest.approx(400)


def test_many_key_groups_missing_for_one_reason_are_one_line() -> None:
    """A worker of a 32-key-group job went away and another just started: one line per
    reason, the key groups as ranges, not a line each (`keyshift explain` reads them)."""
    answers = full()
    answers[M.KEY_GROUP_ARRIVAL] = [s(50, key_group=str(kg)) for kg in range(20)]
    answers[M.KEY_GROUP_LAG] = [s(3, key_group=str(kg)) for kg in (*range(8), *range(20, 24))]
    got = sample(answers)
    assert got.missing == (
        "key groups 8-19: not reported now (no running owner)",
        "key groups 20-23: no arrival rate yet (fewer than two samples)",
    )


def test_handoff_double_reporting_takes_the_highest() -> None:
    """If the per key group series still carry the worker (a user's recording rule, say),
    a key group two workers report counts once, at its highest value."""
    answers = full()
    answers[M.KEY_GROUP_ARRIVAL] = [
        *(s(50.0, key_group=str(kg), worker=W0) for kg in range(5)),
        *(s(50.0, key_group=str(kg), worker=W1) for kg in range(4, 8)),
    ]
    answers[M.KEY_GROUP_LAG] = [s(3, key_group=str(kg)) for kg in range(8)]
    answers[M.KEY_GROUP_LAG] = [
        *answers[M.KEY_GROUP_LAG],
        s(1, key_group="4"),
    ]
    got = sample(answers)
    assert got.complete, got.missing
    assert got.arrival_rate == pytest.approx(400)
    assert got.lag == 24
    # the built-in queries take the highest per key group in PromQL already
    assert "max by (key_group)" in queries_for(JOB, 60)[M.KEY_GROUP_ARRIVAL]


def test_end_offset_going_back_gives_no_rate() -> None:
    answers = full()
    answers[M.KEY_GROUP_ARRIVAL] = [
        s(-20.0 if kg == 2 else 50.0, key_group=str(kg)) for kg in range(8)
    ]
    got = sample(answers)
    assert got.arrival_rate is None
    assert got.missing == ("key group 2: end offset went back in the window, no rate",)


def test_overrides_that_return_nothing_are_missing_not_zero() -> None:
    answers = full()
    answers[M.ARRIVAL_RATE] = []
    answers[M.LAG] = [s(700.0, partition="0"), s(300.0, partition="1")]
    answers[M.PROCESSED_RATE] = [s(399.0)]  # no worker label
    got = sample(
        answers,
        overridden=frozenset({M.ARRIVAL_RATE, M.LAG, M.PROCESSED_RATE}),
    )
    assert got.arrival_rate is None
    assert got.lag == 1000  # summed
    assert got.processed_rate is None
    assert "arrival_rate: the query override returned no series" in got.missing
    assert "processed_rate: the query override returns no series with a worker label" in (
        got.missing
    )
    assert f"{W0}: no processed rate (the query override returned none for it)" in got.missing
    assert not got.complete

    answers[M.ARRIVAL_RATE] = [s(250.0), s(150.0)]
    answers[M.PROCESSED_RATE] = per_worker(200.0, 199.0)
    got = sample(
        answers,
        overridden=frozenset({M.ARRIVAL_RATE, M.LAG, M.PROCESSED_RATE}),
    )
    assert got.complete, got.missing
    assert got.arrival_rate == 400.0


def test_no_workers_expected() -> None:
    got = to_load_sample(full(), job=JOB, workers=(), at=AT, window_seconds=WINDOW)
    assert "workers: none expected" in got.missing and not got.complete


def test_parse_vector() -> None:
    vector = [
        {"metric": {"worker": W0}, "value": [AT, "1.5"]},
        {"metric": {}, "value": [AT, "NaN"]},
    ]
    a, b = parse_vector(vector)
    assert (a.labels, a.value) == ({"worker": W0}, 1.5)
    assert math.isnan(b.value)
    assert parse_vector([AT, "+Inf"]) == [Series({}, math.inf)]  # a scalar
    assert parse_vector([]) == []
    with pytest.raises(ValueError, match="range vector"):
        parse_vector([{"metric": {}, "values": [[AT, "1"]]}])
    with pytest.raises(ValueError, match="not a number"):
        parse_vector([{"metric": {}, "value": [AT, "x"]}])


def test_query_errors_in_words() -> None:
    exc = PrometheusApiClientException(
        'HTTP Status Code 400 (b\'{"status":"error","errorType":"bad_data",'
        '"error":"1:5: parse error: unclosed left parenthesis"}\')'
    )
    assert describe_query_error(exc, 5) == "HTTP 400: 1:5: parse error: unclosed left parenthesis"
    assert describe_query_error(TimeoutError(), 2.5) == "no answer within 2.5 s"


def test_constructor_and_spec() -> None:
    with pytest.raises(ValueError, match="not both"):
        PrometheusMetricsProvider("http://p:9090", token="t", username="u", password="p")
    with pytest.raises(ValueError, match="both username and password"):
        PrometheusMetricsProvider("http://p:9090", username="u")
    spec = AutoscalerSpec.model_validate(
        {
            "metricsWindowSeconds": 30,
            "prometheus": {"url": "https://prom.example:9090/", "insecureSkipVerify": True},
            "queries": {"lag": "sum(x)"},
        }
    )
    provider = PrometheusMetricsProvider.from_spec(spec, credentials={"token": "secret"})
    assert provider.url == "https://prom.example:9090"
    assert provider.window_seconds == 30 and provider.queries == spec.queries
    with pytest.raises(ValueError, match="no Prometheus URL"):
        PrometheusMetricsProvider.from_spec(AutoscalerSpec())


async def test_unreachable_prometheus_over_http() -> None:
    provider = PrometheusMetricsProvider(f"http://127.0.0.1:{free_port()}", window_seconds=10)
    try:
        started = time.monotonic()
        got = await provider.collect(JOB, TARGETS)
        assert time.monotonic() - started < 5
    finally:
        await provider.close()
    assert got.missing == ("prometheus: connection refused (all queries)",)
    assert got.arrival_rate is None and got.processed_rate is None and got.lag is None
    with pytest.raises(RuntimeError, match="closed"):
        await provider.collect(JOB, TARGETS)


# -- a real Prometheus ----------------------------------------------------------------------


class FakeWorkers:
    """Worker metric registries served over HTTP, advanced by the test: every key
    group's end offset grows at ``per_key_group`` records/s; lag 5 each."""

    def __init__(
        self, job: str, key_groups: int, per_key_group: float, namespace: str = "shop"
    ) -> None:
        self.job = job
        self.metrics = [WorkerMetrics(job, worker_name(job, i), namespace) for i in range(2)]
        self.owned: list[set[int]] = [set(), set()]
        self.key_groups = key_groups
        self.per_key_group = per_key_group
        self.t0 = time.time()
        self.runners: list[web.AppRunner] = []
        self.ports: list[int] = []

    def tick(self) -> None:
        end = int(self.per_key_group * (time.time() - self.t0)) + 10
        for m, owned in zip(self.metrics, self.owned, strict=True):
            for kg in owned:
                m.source(kg, end=end, position=end - 5)
            m.records_processed.inc(len(owned))
            m.busy_seconds.inc(0.01)
            m.key_groups_owned.set(len(owned))
            m.assignment_generation.set(1)

    def release(self, ordinal: int, kg: int) -> None:
        self.owned[ordinal].discard(kg)
        self.metrics[ordinal].forget_key_group(kg)

    async def start(self) -> None:
        for m in self.metrics:

            async def handle(_: web.Request, m: WorkerMetrics = m) -> web.Response:
                self.tick()
                return web.Response(
                    body=m.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
                )

            app = web.Application()
            app.router.add_get("/metrics", handle)
            runner = web.AppRunner(app)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)
            self.ports.append(port)

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()

    def targets(self) -> tuple[WorkerTarget, ...]:
        return tuple(
            WorkerTarget(i, m.labels["worker"], f"http://127.0.0.1:{p}/metrics")
            for i, (m, p) in enumerate(zip(self.metrics, self.ports, strict=True))
        )


@pytest.fixture
async def fake_workers() -> AsyncIterator[FakeWorkers]:
    fake = FakeWorkers("handoff", key_groups=8, per_key_group=100.0)
    await fake.start()
    yield fake
    await fake.stop()


async def collect_until(
    provider: PrometheusMetricsProvider,
    job: str,
    workers: tuple[WorkerTarget, ...],
    predicate: Callable[[LoadSample], bool],
    seconds: float,
    what: str,
) -> LoadSample:
    samples: list[LoadSample] = []

    async def check() -> bool:
        samples.append(await provider.collect(job, workers))
        return predicate(samples[-1])

    try:
        await wait_for(check, seconds, what, interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last sample: {samples[-1] if samples else None}") from None
    return samples[-1]


async def test_handoff_through_prometheus(
    prometheus: PrometheusServer, fake_workers: FakeWorkers
) -> None:
    """A key group reported by two workers, then moving to one of them: the arrival
    rate and the lag count it once (800 records/s, lag 40), before and after.  A
    StreamJob of the same name in another namespace, scraped by the same Prometheus
    (no honor_labels), is not counted."""
    fake = fake_workers
    fake.owned = [set(range(5)), set(range(4, 8))]  # key group 4 reported by both
    fake.tick()
    twin = FakeWorkers(fake.job, key_groups=8, per_key_group=300.0, namespace="elsewhere")
    twin.owned = [set(range(8)), set()]
    await twin.start()
    prometheus.set_targets([f"127.0.0.1:{p}" for p in [*fake.ports, *twin.ports]])
    await asyncio.to_thread(prometheus.wait_until_scraped, 20)
    window = 4.0
    provider = PrometheusMetricsProvider(prometheus.url, window_seconds=window, namespace="shop")
    try:
        got = await collect_until(
            provider, fake.job, fake.targets(), lambda g: g.complete, 15, "a complete sample"
        )
        assert got.arrival_rate == pytest.approx(800, rel=0.05)
        assert got.lag == 40 and got.lag_by_key_group == dict.fromkeys(range(8), 5)
        assert got.workers_reporting == 2
        assert [w.key_groups_owned for w in got.per_worker] == [5, 4]

        fake.release(0, 4)  # the old owner lets go; the window now holds both phases
        released = time.time()
        seen = []
        while time.time() < released + 3:
            got = await provider.collect(fake.job, fake.targets())
            assert got.complete, got.missing
            assert got.arrival_rate == pytest.approx(800, rel=0.05)
            assert got.lag == 40
            seen.append(got)
            await asyncio.sleep(0.5)
        assert seen[-1].per_worker[0].key_groups_owned == 4
        # per key group, across the handoff: 100 records/s arriving and processed each,
        # counted once (not 200 from two workers, nor 50). One key group's rate over a
        # few scrapes jitters more than the sum's on a loaded machine: the fake computes
        # its offsets when the scrape is served, not at the scrape's timestamp, and the
        # moved key group's max over two workers' series takes both delays (82 and 73
        # records/s seen under load). Within 30%: still far from 50 and 200.
        for got in seen:
            assert got.arrival_by_key_group == pytest.approx(dict.fromkeys(range(8), 100), rel=0.3)
            assert got.processed_by_key_group == pytest.approx(
                dict.fromkeys(range(8), 100), rel=0.3
            )
            assert key_group_load(got, 8) == pytest.approx((100,) * 8, rel=0.3)

        # Overrides: one answering nothing is missing; one that does not parse fails.
        overrides = QueriesSpec.model_validate(
            {
                "arrivalRate": 'sum(rate(no_such_metric{streamjob="$job"}[$window]))',
                "lag": "sum(",
                "busyRatio": (
                    "sum by (worker) (rate(keyshift_busy_seconds_total"
                    '{streamjob="$job", namespace="$namespace"}[$window]))'
                ),
            }
        )
        other = PrometheusMetricsProvider(
            prometheus.url, window_seconds=window, queries=overrides, namespace="shop"
        )
        try:
            got = await other.collect(fake.job, fake.targets())
        finally:
            await other.close()
        assert not got.complete
        assert got.arrival_rate is None and got.lag is None and got.lag_trend is None
        assert "arrival_rate: the query override returned no series" in got.missing
        failed = [m for m in got.missing if m.startswith("prometheus: HTTP 400")]
        assert len(failed) == 1 and failed[0].endswith("(queries lag, lag_trend)"), got.missing
        assert all(w.busy_ratio is not None for w in got.per_worker)
    finally:
        await provider.close()
        await twin.stop()


async def test_real_workers_through_prometheus(
    prometheus: PrometheusServer,
    standalone_server: LocalServer,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    """Two worker processes over the generator (400 records/s, 8 key groups), scraped
    by Prometheus: the provider measures the rate; a stopped worker is named."""
    key_groups, rate, window = 8, 400.0, 8.0
    source = {"seed": 3, "keys": 1000, "rate": {"recordsPerSecond": rate}}
    url = standalone_server.url
    manifest = write_manifest(
        tmp_path,
        counter_manifest(job, key_groups=key_groups, parallelism=2, store_url=url, source=source),
    )
    store = open_store(url, retry_seconds=10)
    provider = PrometheusMetricsProvider(prometheus.url, window_seconds=window)
    try:
        await store.init_job(job, key_groups)
        await store.publish_assignment(
            job, Assignment(1, 2, plan_assignment(key_groups, 2)), expected_generation=0
        )
        workers = [spawn(manifest, i, url) for i in range(2)]
        targets = tuple(
            WorkerTarget(
                w.ordinal, worker_name(job, w.ordinal), f"http://127.0.0.1:{w.http_port}/metrics"
            )
            for w in workers
        )
        prometheus.set_targets([f"127.0.0.1:{w.http_port}" for w in workers])
        await asyncio.to_thread(prometheus.wait_until_scraped, 20)

        def owned_everywhere(g: LoadSample) -> bool:
            return g.complete and [w.key_groups_owned for w in g.per_worker] == [4, 4]

        got = await collect_until(
            provider, job, targets, owned_everywhere, window + 10, "the window to be covered"
        )
        assert got.workers_reporting == 2 and got.workers_expected == 2
        assert got.arrival_rate == pytest.approx(rate, rel=0.25)
        assert got.lag is not None and got.lag < rate / 2  # kept up: under 0.5 s of input
        assert got.lag_trend is not None and abs(got.lag_trend) < rate / 4
        assert got.processed_rate == pytest.approx(got.arrival_rate, rel=0.25)
        for w in got.per_worker:
            assert w.processed_rate == pytest.approx(rate / 2, rel=0.3), w
            assert w.busy_ratio is not None and 0 < w.busy_ratio < 1
            assert w.generation == 1
        assert set(got.lag_by_key_group) == set(range(key_groups))
        load = key_group_load(got, key_groups)  # what a rescale's ranges would follow
        assert load is not None and len(load) == key_groups
        assert sum(load) == pytest.approx(rate, rel=0.25)
        assert set(got.processed_by_key_group) == set(range(key_groups))

        workers[1].stop()
        stopped = targets[1].name
        got = await collect_until(
            provider,
            job,
            targets,
            lambda g: any(m.startswith(f"{stopped}: no sample") for m in g.missing),
            10,
            f"{stopped} to be reported missing",
        )
        assert not got.complete
        assert [w.name for w in got.per_worker] == [targets[0].name]
        assert got.processed_rate is None and got.workers_reporting == 1
    finally:
        await provider.close()
        await store.close()
