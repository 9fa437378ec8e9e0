"""Fixtures of the controller tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.prometheus_server import PrometheusServer, prometheus_binary


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
