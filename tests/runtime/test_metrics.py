"""The worker's metrics: the cache counters are brought up to date from two threads."""

from __future__ import annotations

from keyshift.runtime.metrics import WorkerMetrics


def test_a_stale_cache_total_neither_fails_nor_counts_twice() -> None:
    """The HTTP thread may read the cache's totals just before the event loop reports
    newer ones: its older figures must not raise (a counter cannot go down), nor add."""
    m = WorkerMetrics("j", "w")
    m.cache_counts(hits=100, misses=10)
    m.cache_counts(hits=90, misses=8)  # read before the last update
    m.cache_counts(hits=120, misses=12)
    hits = m.registry.get_sample_value("keyshift_state_cache_hits_total", m.labels)
    misses = m.registry.get_sample_value("keyshift_state_cache_misses_total", m.labels)
    assert (hits, misses) == (120, 12)
