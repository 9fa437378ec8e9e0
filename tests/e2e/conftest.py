"""Fixtures for the end-to-end tests: ``k8s`` (the API emulator) and ``pod_runner``.

``pod_runner`` plays the StatefulSet controller and the kubelet against ``k8s`` (see
``tests/e2e/kubelet.py``): StatefulSets get Pods, Pods get local processes.  It is stopped
(every process killed) after the test; when the test failed, the pods' logs are printed
(pytest shows them under "Captured stdout teardown").
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import pods_scraped
from tests.e2e.kubelet import PodRunner
from tests.k8s import KubernetesEmulator, k8s  # noqa: F401
from tests.prometheus_server import PrometheusServer

_failed = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_failed] = True
    return report


@pytest.fixture
def pod_runner(
    k8s: KubernetesEmulator,  # noqa: F811
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[PodRunner]:
    """A ``PodRunner`` watching every namespace of ``k8s``; stopped after the test."""
    runner = PodRunner(k8s.url, tmp_path / "kubelet").start()
    try:
        yield runner
    finally:
        runner.stop()
        if request.node.stash.get(_failed, False):
            print(runner.logs())


@pytest.fixture
def pod_targets(
    k8s: KubernetesEmulator,  # noqa: F811 (the fixture above)
    pod_runner: PodRunner,
    prometheus: PrometheusServer,
) -> Iterator[None]:
    """Keep Prometheus' targets equal to the worker pods' local metrics ports."""
    with pods_scraped(k8s, pod_runner, prometheus):
        yield
