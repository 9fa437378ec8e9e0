"""The worker's metrics: the cache counters are brought up to date from two threads."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from keyshift.runtime.metrics import LOCAL_NAMESPACE, NAMESPACE_ENV, WorkerMetrics


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


def test_labels_name_the_streamjob_not_the_scrape_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """``streamjob`` and ``namespace``, never ``job`` (Prometheus' own label: it would
    become ``exported_job``); the namespace comes from ``KEYSHIFT_NAMESPACE`` (the pod's,
    set by the operator), ``local`` without it; no ``_created`` series."""
    monkeypatch.delenv(NAMESPACE_ENV, raising=False)
    assert WorkerMetrics("j", "w").labels == {"streamjob": "j", "namespace": LOCAL_NAMESPACE,
                                              "worker": "w"}  # fmt: skip
    monkeypatch.setenv(NAMESPACE_ENV, "shop")
    m = WorkerMetrics("orders", "orders-worker-0")
    m.records_processed.inc(3)
    m.cache_size(used=1200, limit=64_000_000)
    families = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    for family in families.values():
        for sample in family.samples:
            assert "job" not in sample.labels, sample
            assert not sample.name.endswith("_created"), sample
            if family.name != "keyshift_build_info":
                assert sample.labels["streamjob"] == "orders", sample
                assert sample.labels["namespace"] == "shop", sample
    (info,) = families["keyshift_build_info"].samples
    assert info.value == 1 and info.labels["version"]
    assert families["keyshift_state_cache_bytes"].samples[0].value == 1200
    assert families["keyshift_state_cache_max_bytes"].samples[0].value == 64_000_000
    assert families["keyshift_key_groups_failed"].samples[0].value == 0
    assert families["keyshift_worker_start_time_seconds"].samples[0].value > 0


def test_a_key_group_given_up_and_claimed_again_shows_its_offsets_again() -> None:
    m = WorkerMetrics("j", "w")
    labels = {**m.labels, "key_group": "3"}
    m.source(3, end=100, position=40)
    assert m.registry.get_sample_value("keyshift_source_lag_records", labels) == 60
    m.forget_key_group(3)
    assert m.registry.get_sample_value("keyshift_source_lag_records", labels) is None
    m.source(3, end=150, position=150)
    assert m.registry.get_sample_value("keyshift_source_lag_records", labels) == 0
    assert m.registry.get_sample_value("keyshift_source_position", labels) == 150
