"""Shared fixtures: real Valkey/Redis servers and a real Prometheus on loopback ports.

A standalone server and a 3-master Redis Cluster are started once per test
session (in a temporary directory) and stopped by PID at the end.  Tests that
need a server of their own (to kill or restart it) use ``LocalServer``
directly.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keyshift.store import MemoryStore, RedisStateStore, open_store
from keyshift.store.server import LocalCluster, LocalServer
from tests.controller.local.localjob import LocalJob
from tests.kafka_broker import KafkaBroker
from tests.prometheus_server import PrometheusServer, prometheus_binary
from tests.support import WorkerProcess


@pytest.fixture(scope="session")
def standalone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    server = LocalServer(tmp_path_factory.mktemp("valkey")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cluster_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), masters=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["standalone", "cluster"])
def store_url(request: pytest.FixtureRequest) -> str:
    """The URL of each kind of store in turn: every test using it runs twice."""
    if request.param == "standalone":
        server: LocalServer = request.getfixturevalue("standalone_server")
        return server.url
    cluster: LocalCluster = request.getfixturevalue("cluster_servers")
    return cluster.url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[RedisStateStore]:
    s = open_store(store_url, retry_seconds=10)
    yield s
    await s.close()


@pytest.fixture
def job() -> str:
    """A job name of its own for each test, so tests never see each other's state."""
    return f"t-{secrets.token_hex(4)}"


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """A real Prometheus per test module (scrape interval 1 s, file-based discovery:
    tests call ``set_targets`` then ``wait_until_scraped``); stopped by its PID."""
    if prometheus_binary() is None:
        pytest.skip("no prometheus binary on PATH (Debian/Ubuntu: apt-get install prometheus)")
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real Kafka-compatible broker (Tansu, memory storage) per test module."""
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the test item, for fixtures that look at the outcome."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(params=["standalone", "cluster", "memory"])
async def worker_store(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Each store backend in turn: Valkey/Redis standalone, Redis Cluster and the
    in-process MemoryStore."""
    if request.param == "memory":
        yield MemoryStore()
        return
    server = request.getfixturevalue(
        "standalone_server" if request.param == "standalone" else "cluster_servers"
    )
    s = open_store(server.url, retry_seconds=10)
    yield s
    await s.close()


@pytest.fixture
def spawn(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes; all are stopped (by PID) when the test ends.  When the
    test failed, the end of each worker's log is printed with its report."""
    started: list[WorkerProcess] = []

    def make(manifest: Path, ordinal: int, store_url: str, **kwargs: Any) -> WorkerProcess:
        worker = WorkerProcess(manifest, ordinal, store_url, tmp_path, **kwargs).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for worker in started:
            print(f"\n--- end of worker {worker.ordinal}'s log ({worker.log_path}) ---")
            print(worker.log())


@pytest.fixture
def local_jobs() -> Iterator[list[LocalJob]]:
    """``keyshift run`` supervisors a test started; each is stopped (Ctrl-C) at the end."""
    jobs: list[LocalJob] = []
    yield jobs
    for job in jobs:
        job.close()
