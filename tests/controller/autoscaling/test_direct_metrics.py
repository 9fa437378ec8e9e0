"""The metrics provider: parsing and rate arithmetic (pure, explicit timestamps),
and the direct scrape over real HTTP servers serving real worker registries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from keyshift.controller.autoscaling.metrics.base import (
    LoadSample,
    WorkerTarget,
    job_processed_rate,
    key_group_load,
)
from keyshift.controller.autoscaling.metrics.direct import (
    DirectScrapeProvider,
    KeyGroupReading,
    ScrapeRound,
    WorkerSnapshot,
    counters_reset,
    prune,
    read_scrape,
    summarize,
    worker_rates,
)
from keyshift.runtime.metrics import WorkerMetrics

JOB = "counter"
W0, W1 = "counter-worker-0", "counter-worker-1"
TARGETS = (
    WorkerTarget(0, W0, "http://unused/0"),
    WorkerTarget(1, W1, "http://unused/1"),
)


def snap(metrics: WorkerMetrics, *, drop_start_time: bool = False) -> WorkerSnapshot:
    text = metrics.exposition().decode()
    if drop_start_time:
        lines = [line for line in text.splitlines() if "_start_time_seconds" not in line]
        text = "\n".join(lines) + "\n"
    result = read_scrape(text, job=JOB, name=metrics.labels["worker"])
    assert isinstance(result, WorkerSnapshot), result
    return result


def advance(m: WorkerMetrics, records: int, busy: float, hits: int = 0, misses: int = 0) -> None:
    m.records_processed.inc(records)
    m.busy_seconds.inc(busy)
    m.cache_hits.inc(hits)
    m.cache_misses.inc(misses)


# -- parsing ------------------------------------------------------------------------


def test_parse_real_exposition() -> None:
    m = WorkerMetrics(JOB, W0)
    advance(m, 1200, 3.5)
    m.cache_counts(hits=90, misses=10)
    m.assignment_generation.set(7)
    m.key_groups_owned.set(2)
    m.source(3, end=1000, position=400)
    m.source(4, end=500, position=500)
    m.commit_duration.observe(0.01)

    s = snap(m)

    assert (s.job, s.worker) == (JOB, W0)
    assert s.records_processed == 1200
    assert s.busy_seconds == 3.5
    assert (s.cache_hits, s.cache_misses) == (90, 10)
    assert (s.generation, s.key_groups_owned) == (7, 2)
    assert s.started_at is not None
    assert dict(s.key_groups) == {
        3: KeyGroupReading(end_offset=1000, position=400, lag=600),
        4: KeyGroupReading(end_offset=500, position=500, lag=0),
    }

    m.forget_key_group(3)
    assert set(snap(m).key_groups) == {4}


def test_unusable_scrapes_say_why() -> None:
    m = WorkerMetrics(JOB, W0)
    text = m.exposition().decode()
    assert read_scrape(text, job="other", name=W0) == (
        f"answers as worker {W0!r} of job {JOB!r}, not {W0!r} of 'other'"
    )
    wrong_worker = read_scrape(text, job=JOB, name=W1)
    assert isinstance(wrong_worker, str)
    assert "answers as worker" in wrong_worker
    foreign = read_scrape("some_other_metric 1\n", job=JOB, name=W0)
    assert foreign == "unusable metrics: no keyshift_records_processed_total"
    garbage = read_scrape("{{{ not prometheus\n", job=JOB, name=W0)
    assert isinstance(garbage, str)
    assert garbage.startswith("unusable metrics")


# -- rates ----------------------------------------------------------------------------


def test_rates_from_two_snapshots() -> None:
    m = WorkerMetrics(JOB, W0)
    advance(m, 100, 1.0, hits=10, misses=10)
    older = snap(m)
    advance(m, 500, 4.0, hits=30, misses=10)
    newer = snap(m)

    rates = worker_rates(1000.0, older, 1010.0, newer)

    assert rates is not None
    assert rates.seconds == 10.0
    assert rates.processed_rate == pytest.approx(50.0)
    assert rates.busy_ratio == pytest.approx(0.4)
    assert rates.cache_hit_ratio == pytest.approx(0.75)  # 30 / 40 in the window, not overall
    assert worker_rates(1010.0, newer, 1010.0, newer) is None  # no time between them
    idle = worker_rates(1010.0, newer, 1020.0, newer)
    assert idle is not None
    assert (idle.processed_rate, idle.busy_ratio, idle.cache_hit_ratio) == (0.0, 0.0, None)


def test_full_window_sample() -> None:
    m0, m1 = WorkerMetrics(JOB, W0), WorkerMetrics(JOB, W1)
    rounds = []
    for i, t in enumerate((1000.0, 1010.0, 1020.0)):
        if i:
            advance(m0, 300, 2.0)
            advance(m1, 100, 9.0)
        m0.source(0, end=1000 + 100 * i, position=1000 + 100 * i)
        m1.source(1, end=1000 + 150 * i, position=1000 + 100 * i)  # falls behind by 5/s
        m0.assignment_generation.set(2)
        m1.assignment_generation.set(2)
        m0.key_groups_owned.set(1)
        m1.key_groups_owned.set(1)
        rounds.append(ScrapeRound(t, {W0: snap(m0), W1: snap(m1)}))

    sample = summarize(rounds, TARGETS)

    assert sample.complete
    assert sample.missing == ()
    assert (sample.at, sample.window_seconds) == (1020.0, 20.0)
    assert (sample.workers_expected, sample.workers_reporting) == (2, 2)
    assert sample.arrival_rate == pytest.approx(25.0)  # 10/s + 15/s
    assert sample.processed_rate == pytest.approx(40.0)  # 30/s + 10/s
    assert sample.lag == 100
    assert sample.lag_by_key_group == {0: 0, 1: 100}
    assert sample.lag_trend == pytest.approx(5.0)
    w0, w1 = sample.per_worker
    assert (w0.name, w0.ordinal, w0.processed_rate, w0.busy_ratio) == (W0, 0, 30.0, 0.2)
    assert (w1.name, w1.processed_rate, w1.busy_ratio, w1.lag) == (W1, 10.0, 0.9, 100)
    assert (w1.generation, w1.key_groups_owned) == (2, 1)


def test_single_scrape_has_no_rates() -> None:
    m0 = WorkerMetrics(JOB, W0)
    m0.source(0, end=10, position=4)
    sample = summarize([ScrapeRound(1000.0, {W0: snap(m0)})], TARGETS[:1])

    assert not sample.complete
    assert sample.missing == ("window: only one scrape so far, rates need two",)
    assert (sample.arrival_rate, sample.processed_rate, sample.lag_trend) == (None, None, None)
    assert sample.per_worker[0].processed_rate is None
    assert sample.lag == 6  # a level, not a rate: known from one scrape


@pytest.mark.parametrize("drop_start_time", [False, True])
def test_counter_reset_never_gives_a_negative_rate(drop_start_time: bool) -> None:
    before = WorkerMetrics(JOB, W0)
    advance(before, 1000, 8.0, hits=50)
    s0 = snap(before, drop_start_time=drop_start_time)
    restarted = WorkerMetrics(JOB, W0)  # the worker process started again
    advance(restarted, 50, 0.5, hits=5)
    s1 = snap(restarted, drop_start_time=drop_start_time)
    advance(restarted, 200, 1.0, hits=20)
    s2 = snap(restarted, drop_start_time=drop_start_time)

    assert counters_reset(s0, s1)
    assert not counters_reset(s1, s2)
    assert worker_rates(1000.0, s0, 1010.0, s1) is None
    rounds = [ScrapeRound(t, {W0: s}) for t, s in ((1000.0, s0), (1010.0, s1), (1020.0, s2))]

    sample = summarize(rounds, TARGETS[:1])

    (w0,) = sample.per_worker
    assert w0.processed_rate == pytest.approx(20.0)  # only the time since the restart
    assert w0.busy_ratio == pytest.approx(0.1)
    assert sample.processed_rate == pytest.approx(20.0)
    assert not sample.complete
    assert sample.workers_reporting == 0
    assert sample.missing == (
        f"{W0}: counters went back (worker restarted) 10.0 s before the newest scrape; "
        "rates cover the last 10.0 s",
        "key groups: no worker reports any (no assignment running)",
    )


def test_restart_that_overtakes_the_old_counts_is_seen_by_start_time() -> None:
    before = WorkerMetrics(JOB, W0)
    advance(before, 10, 0.1)
    s0 = snap(before)
    restarted = WorkerMetrics(JOB, W0)
    advance(restarted, 500, 1.0)
    s1 = snap(restarted)
    assert s1.started_at != s0.started_at
    assert counters_reset(s0, s1)
    assert worker_rates(1000.0, s0, 1010.0, s1) is None


def test_key_group_moving_between_workers_makes_no_spike() -> None:
    """Four key groups, 10 records/s each; key group 1 moves from worker 0 to
    worker 1 inside the window, and at the middle scrape both report it (the old
    owner's gauge is stale until it forgets the key group)."""
    m0, m1 = WorkerMetrics(JOB, W0), WorkerMetrics(JOB, W1)
    # t = 1000: worker 0 owns 0, 1; worker 1 owns 2, 3.
    for kg in (0, 1):
        m0.source(kg, end=0, position=0)
    for kg in (2, 3):
        m1.source(kg, end=0, position=0)
    r0 = ScrapeRound(1000.0, {W0: snap(m0), W1: snap(m1)})
    # t = 1010: worker 0 last saw key group 1 at t = 1005; worker 1 has claimed it.
    m0.source(0, end=100, position=100)
    m0.source(1, end=50, position=50)
    for kg in (1, 2, 3):
        m1.source(kg, end=100, position=100)
    r1 = ScrapeRound(1010.0, {W0: snap(m0), W1: snap(m1)})
    # t = 1020: worker 0 has forgotten key group 1.
    m0.forget_key_group(1)
    m0.source(0, end=200, position=200)
    for kg in (1, 2, 3):
        m1.source(kg, end=200, position=190)
    r2 = ScrapeRound(1020.0, {W0: snap(m0), W1: snap(m1)})

    sample = summarize([r0, r1, r2], TARGETS)
    assert sample.complete, sample.missing
    assert sample.arrival_rate == pytest.approx(40.0)
    assert sample.lag_by_key_group == {0: 0, 1: 10, 2: 10, 3: 10}
    assert sample.lag_trend == pytest.approx(1.5)  # 30 records behind after 20 s
    # At the middle instant the stale reading of the old owner is not used.
    middle = summarize([r0, r1], TARGETS)
    assert middle.arrival_rate == pytest.approx(40.0)
    assert middle.lag_by_key_group == {0: 0, 1: 0, 2: 0, 3: 0}
    # per key group: arrival and processed (position) rates, across the move
    assert sample.arrival_by_key_group == pytest.approx({0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0})
    assert sample.processed_by_key_group == pytest.approx({0: 10.0, 1: 9.5, 2: 9.5, 3: 9.5})
    assert key_group_load(sample, 4) == pytest.approx((10.0, 10.0, 10.0, 10.0))


def test_a_scale_down_inside_the_window_shows_no_drop_in_the_jobs_processed_rate() -> None:
    """Two key groups, 20 records/s each, processed as they come; worker 1 hands key
    group 1 to worker 0 and stops halfway through the window. The job processed 40/s
    throughout; the workers running at the end (worker 0 alone) processed 30/s."""
    m0, m1 = WorkerMetrics(JOB, W0), WorkerMetrics(JOB, W1)
    m0.source(0, end=0, position=0)
    m1.source(1, end=0, position=0)
    r0 = ScrapeRound(1000.0, {W0: snap(m0), W1: snap(m1)})
    advance(m0, 200, 1.0)
    advance(m1, 200, 1.0)
    m0.source(0, end=200, position=200)
    m1.source(1, end=200, position=200)
    r1 = ScrapeRound(1010.0, {W0: snap(m0), W1: snap(m1)})
    advance(m0, 400, 2.0)  # its own key group and the one handed to it
    m0.source(0, end=400, position=400)
    m0.source(1, end=400, position=400)
    r2 = ScrapeRound(1020.0, {W0: snap(m0)})  # worker 1 is gone

    sample = summarize([r0, r1, r2], TARGETS[:1])

    assert sample.processed_rate == pytest.approx(30.0)  # worker 0: 600 records in 20 s
    assert sample.arrival_rate == pytest.approx(40.0)
    assert job_processed_rate(sample, 2) == pytest.approx(40.0)
    # a key group without a rate in the window: the sum over the workers
    assert job_processed_rate(sample, 3) == pytest.approx(30.0)
    assert job_processed_rate(None, 2) is None


def test_key_groups_missing_for_one_reason_are_named_in_one_line() -> None:
    """A job (re)started: its workers refused the first scrape, so each key group has
    one reading: one line for all of them, not one each (`keyshift explain` reads it)."""
    m0, m1 = WorkerMetrics(JOB, W0), WorkerMetrics(JOB, W1)
    for kg in (0, 1, 2):
        m0.source(kg, end=100, position=100)
    for kg in (3, 5):
        m1.source(kg, end=100, position=100)
    r0 = ScrapeRound(1000.0, {W0: "connection refused", W1: "connection refused"})
    r1 = ScrapeRound(1005.0, {W0: snap(m0), W1: snap(m1)})

    sample = summarize([r0, r1], TARGETS)

    lines = [m for m in sample.missing if "one scrape only" in m]
    assert lines == ["key groups 0-3, 5: reported in one scrape only, no rate"]
    # worker 1 goes away: its key groups have no running owner, said once
    r2 = ScrapeRound(1010.0, {W0: snap(m0), W1: "connection refused"})
    later = summarize([r0, r1, r2], TARGETS)
    lines = [m for m in later.missing if "newest scrape" in m]
    assert lines == [
        "key groups 3, 5: not reported in the newest scrape (no running owner; "
        "last seen 5.0 s before)"
    ]


def test_key_group_load_needs_every_key_group() -> None:
    def sample(arrival: dict[int, float], processed: dict[int, float]) -> LoadSample:
        return LoadSample(
            at=0.0, window_seconds=10.0, workers_expected=1, workers_reporting=1,
            arrival_rate=None, processed_rate=None, lag=None, lag_trend=None, per_worker=(),
            lag_by_key_group={}, complete=True, missing=(),
            arrival_by_key_group=arrival, processed_by_key_group=processed,
        )  # fmt: skip

    # the higher of arrival (demand a saturated worker cannot show) and processed rate
    assert key_group_load(sample({0: 5.0, 1: 2.0}, {0: 3.0, 1: 4.0}), 2) == (5.0, 4.0)
    assert key_group_load(sample({0: 5.0}, {1: 4.0}), 2) == (5.0, 4.0)
    assert key_group_load(sample({0: 5.0}, {}), 2) is None  # key group 1 unknown: by count
    assert key_group_load(sample({0: 0.0, 1: 0.0}, {}), 2) is None  # nothing measured
    assert key_group_load(None, 2) is None


def test_key_group_without_a_running_owner_is_reported() -> None:
    m0 = WorkerMetrics(JOB, W0)
    m0.source(0, end=0, position=0)
    m0.source(1, end=0, position=0)
    r0 = ScrapeRound(1000.0, {W0: snap(m0)})
    m0.source(0, end=100, position=100)
    m0.source(1, end=100, position=100)
    r1 = ScrapeRound(1010.0, {W0: snap(m0)})
    m0.forget_key_group(1)  # released; the new owner has not claimed it yet
    m0.source(0, end=200, position=200)
    r2 = ScrapeRound(1020.0, {W0: snap(m0)})

    sample = summarize([r0, r1, r2], TARGETS[:1])

    assert sample.arrival_rate == pytest.approx(20.0)  # key group 1 rated while seen
    assert sample.lag_by_key_group == {0: 0}
    assert not sample.complete
    assert sample.missing == (
        "key group 1: not reported in the newest scrape "
        "(no running owner; last seen 10.0 s before)",
    )


def test_missing_worker_is_named_not_read_as_zero() -> None:
    m0, m1 = WorkerMetrics(JOB, W0), WorkerMetrics(JOB, W1)
    m0.source(0, end=0, position=0)
    m1.source(1, end=0, position=0)
    r0 = ScrapeRound(1000.0, {W0: snap(m0), W1: snap(m1)})
    advance(m0, 100, 1.0)
    m0.source(0, end=100, position=100)
    r1 = ScrapeRound(1010.0, {W0: snap(m0), W1: "connection refused"})

    sample = summarize([r0, r1], TARGETS)

    assert not sample.complete
    assert sample.workers_reporting == 1
    assert [w.name for w in sample.per_worker] == [W0]  # no zero-filled entry for W1
    assert sample.processed_rate == pytest.approx(10.0)
    assert f"{W1}: connection refused" in sample.missing
    assert any(m.startswith("key group 1: not reported") for m in sample.missing)
    assert sample.lag_by_key_group == {0: 0}

    nobody = summarize([r0, ScrapeRound(1010.0, {W0: "timeout", W1: "timeout"})], TARGETS)
    assert (nobody.processed_rate, nobody.lag, nobody.per_worker) == (None, None, ())
    assert nobody.workers_reporting == 0
    assert not nobody.complete


def test_worker_that_joined_inside_the_window_is_partial() -> None:
    m0, m1 = WorkerMetrics(JOB, W0), WorkerMetrics(JOB, W1)
    rounds = [ScrapeRound(1000.0, {W0: snap(m0)})]
    for t in (1010.0, 1020.0):
        advance(m0, 100, 1.0)
        advance(m1, 50, 1.0)
        rounds.append(ScrapeRound(t, {W0: snap(m0), W1: snap(m1)}))

    sample = summarize(rounds, TARGETS)

    assert sample.workers_reporting == 1
    assert sample.per_worker[1].processed_rate == pytest.approx(5.0)
    assert f"{W1}: no data at the start of the window (not scraped yet); " in sample.missing[0]


def test_prune_keeps_the_window() -> None:
    rounds = [ScrapeRound(float(t), {}) for t in range(0, 71)]
    kept = prune(rounds, now=70.0, window_seconds=60.0)
    assert kept[0].at == 7.0  # 63 s: the window plus 5% slack for jitter
    assert kept[-1].at == 70.0


# -- the direct scrape over real HTTP -------------------------------------------------------------

Serve = Callable[[WorkerMetrics], Awaitable[tuple[web.AppRunner, str]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []

    async def start(metrics: WorkerMetrics) -> tuple[web.AppRunner, str]:
        async def handler(_request: web.Request) -> web.Response:
            return web.Response(
                body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )

        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        port = int(runner.addresses[0][1])
        return runner, f"http://127.0.0.1:{port}/metrics"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_direct_scrape_over_http(serve: Serve) -> None:
    m0, m1 = WorkerMetrics(JOB, W0), WorkerMetrics(JOB, W1)
    _, url0 = await serve(m0)
    runner1, url1 = await serve(m1)
    targets = [WorkerTarget(0, W0, url0), WorkerTarget(1, W1, url1)]
    now = [1000.0]
    provider = DirectScrapeProvider(window_seconds=60.0, timeout=1.0, clock=lambda: now[0])
    try:
        m0.source(0, end=1000, position=1000)
        m1.source(1, end=1000, position=900)
        first = await provider.collect(JOB, targets)
        assert not first.complete
        assert first.lag == 100
        assert first.processed_rate is None

        advance(m0, 500, 2.0, hits=9, misses=1)
        advance(m1, 300, 6.0)
        m0.source(0, end=1500, position=1500)
        m1.source(1, end=1500, position=1200)
        now[0] = 1010.0
        second = await provider.collect(JOB, targets)

        assert second.complete, second.missing
        assert (second.at, second.window_seconds) == (1010.0, 10.0)
        assert second.workers_reporting == 2
        assert second.arrival_rate == pytest.approx(100.0)
        assert second.processed_rate == pytest.approx(80.0)
        assert second.lag == 300
        assert second.lag_trend == pytest.approx(20.0)
        w0, w1 = second.per_worker
        assert (w0.processed_rate, w0.busy_ratio, w0.cache_hit_ratio) == (50.0, 0.2, 0.9)
        assert (w1.processed_rate, w1.busy_ratio) == (30.0, 0.6)

        await runner1.cleanup()
        advance(m0, 500, 2.0)
        now[0] = 1020.0
        third = await provider.collect(JOB, targets)

        assert not third.complete
        assert f"{W1}: connection refused" in third.missing
        assert [w.name for w in third.per_worker] == [W0]
        assert third.processed_rate == pytest.approx(50.0)  # worker 0 only, not 0 for worker 1
        assert third.workers_reporting == 1

        # The window slides: at 1075 the scrape of 1000 is out of it (1010 too, with slack).
        advance(m0, 500, 2.0)
        now[0] = 1075.0
        fourth = await provider.collect(JOB, targets[:1])
        assert fourth.complete, fourth.missing
        assert fourth.window_seconds == 55.0
        assert fourth.per_worker[0].processed_rate == pytest.approx(500 / 55)
    finally:
        await provider.close()


async def test_direct_scrape_timeout_is_reported(serve: Serve) -> None:
    stuck = asyncio.Event()

    async def hang(_request: web.Request) -> web.Response:
        await stuck.wait()
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", hang)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{int(runner.addresses[0][1])}/metrics"
    provider = DirectScrapeProvider(timeout=0.2)
    try:
        sample = await provider.collect(JOB, [WorkerTarget(0, W0, url)])
        assert f"{W0}: no answer within 0.2 s" in sample.missing
        assert not sample.complete
        assert sample.per_worker == ()
    finally:
        stuck.set()
        await provider.close()
        await runner.cleanup()
