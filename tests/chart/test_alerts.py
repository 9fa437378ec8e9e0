"""keyshift's alerts: the chart's PrometheusRule carries ``alerts/keyshift.rules.yaml``,
which Prometheus' own ``promtool`` checks and unit-tests (an alert that fires when a
key group stops, and only then; the lag alert after 10 minutes of growth, never for a
steady lag), which a real Prometheus loads and evaluates against a worker's series, and
which asks only for series keyshift exports, by ``streamjob`` and ``namespace``."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshift.runtime.metrics import WorkerMetrics
from tests.chart.render import find, one, render
from tests.chart.test_monitoring import exported_series
from tests.prometheus_server import PrometheusServer, prometheus_binary

RULES = (
    Path(__file__).resolve().parents[2] / "charts" / "keyshift" / "alerts" / "keyshift.rules.yaml"
)
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="no promtool on PATH (Debian/Ubuntu: apt-get install prometheus)"
)


def test_the_prometheus_rule_carries_the_alerts_when_asked() -> None:
    assert not find(render(), "PrometheusRule")
    rule = one(render({"metrics": {"prometheusRule": {"enabled": True,
                                                      "labels": {"release": "kp"}}}}),
               "PrometheusRule")  # fmt: skip
    assert rule["metadata"]["labels"]["release"] == "kp"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_the_alerts_ask_only_for_exported_series() -> None:
    exprs = [r["expr"] for r in rules()]
    asked = set(re.findall(r"\bkeyshift_[a-z_]+", " ".join(exprs)))
    assert asked and not asked - exported_series(), asked - exported_series()


def test_the_alerts_name_the_streamjob_never_the_scrape_job() -> None:
    """Every alert is per StreamJob: its labels are ``namespace`` and ``streamjob``
    (``job`` is the scrape job's, the same for every StreamJob)."""
    assert {r["alert"] for r in rules()} >= {
        "KeyshiftKeyGroupsFailed", "KeyshiftLagGrowing", "KeyshiftRescaleFailed",
        "KeyshiftRescaleStuck", "KeyshiftStoreUnreachable",
        "KeyshiftAutoscalerAtMaxWhileLagGrows",
    }  # fmt: skip
    for rule in rules():
        assert not re.search(r"\bjob\b", rule["expr"]), rule["alert"]
        assert "$labels.job " not in yaml.safe_dump(rule["annotations"]), rule["alert"]
        assert "namespace, streamjob" in rule["expr"], rule["alert"]


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_a_stopped_key_group_fires_the_alert_after_a_minute(tmp_path: Path) -> None:
    """One worker of job ``orders`` reports a stopped key group from minute 2 on: the
    alert is pending at minute 2 and fires from minute 3, never before."""
    assert PROMTOOL is not None
    labels = '{streamjob="orders", namespace="shop", worker="orders-worker-0"}'
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "30s",
        "tests": [{
            "interval": "30s",
            "input_series": [
                {"series": f"keyshift_key_groups_failed{labels}", "values": "0 0 0 0 1x12"},
                {"series": f"keyshift_store_lost_commits_total{labels}", "values": "0x16"},
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "KeyshiftKeyGroupsFailed", "exp_alerts": []},
                {"eval_time": "2m30s", "alertname": "KeyshiftKeyGroupsFailed", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "KeyshiftKeyGroupsFailed", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "streamjob": "orders",
                                   "namespace": "shop"},
                    "exp_annotations": {
                        "summary": "StreamJob orders: 1 key groups stopped",
                        "description": yaml.safe_load(RULES.read_text())["groups"][0]["rules"][0][
                            "annotations"]["description"]
                        .replace("{{ $labels.streamjob }}", "orders")
                        .replace("{{ $labels.namespace }}", "shop"),
                    },
                }]},
                {"eval_time": "4m", "alertname": "KeyshiftStoreLostCommits", "exp_alerts": []},
            ],
        }],
    }  # fmt: skip
    path = tmp_path / "alerts_test.yaml"
    path.write_text(yaml.safe_dump(tests))
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def expected(alert: str, value: str | None = None, **labels: str) -> dict[str, Any]:
    """The ``exp_alerts`` entry of ``alert`` with ``labels``: its annotations rendered
    (``value``: what the template makes of ``$value``)."""
    rule = next(r for r in rules() if r["alert"] == alert)
    annotations = {}
    for key, text in rule["annotations"].items():
        for name, label in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", label)
        text = re.sub(r"\{\{ \$value[^}]*\}\}", value or "", text)
        assert "{{" not in text, text
        annotations[key] = text
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


def promtool_test(tmp_path: Path, tests: dict[str, Any]) -> None:
    assert PROMTOOL is not None
    path = tmp_path / "alerts_test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "30s",
                                    "tests": [tests]}))  # fmt: skip
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_lag_alert_fires_after_ten_minutes_of_growth(tmp_path: Path) -> None:
    """Job ``orders`` (two key groups, two workers reporting key group 1 during a
    handoff) gains 100 records of lag a minute; job ``steady`` keeps a lag of 5000,
    and job ``orders`` of namespace ``other`` one that falls.  Only ``orders`` of
    ``shop`` fires, once its lag has grown for 10 minutes; the autoscaler alert fires
    too once its decisions say ``at_max``."""
    shop = 'streamjob="orders", namespace="shop"'
    steady = '{streamjob="steady", namespace="shop", worker="steady-worker-0", key_group="0"}'
    other = '{streamjob="orders", namespace="other", worker="orders-worker-0", key_group="0"}'
    promtool_test(tmp_path, {
        "interval": "30s",
        "input_series": [
            {"series": f'keyshift_source_lag_records{{{shop}, worker="orders-worker-0", '
                       'key_group="0"}', "values": "0+50x60"},
            {"series": f'keyshift_source_lag_records{{{shop}, worker="orders-worker-0", '
                       'key_group="1"}', "values": "0+20x60"},
            {"series": f'keyshift_source_lag_records{{{shop}, worker="orders-worker-1", '
                       'key_group="1"}', "values": "0+20x60"},  # the same key group: once
            {"series": f"keyshift_source_lag_records{steady}", "values": "5000x60"},
            {"series": f"keyshift_source_lag_records{other}", "values": "9000-10x60"},
            {"series": f'keyshift_scaling_decisions_total{{{shop}, direction="none", '
                       'reason="at_max"}', "values": "0x20 1+1x40"},
        ],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "KeyshiftLagGrowing", "exp_alerts": []},
            {"eval_time": "9m", "alertname": "KeyshiftLagGrowing", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "KeyshiftLagGrowing", "exp_alerts": [
                # (50 + 20 records) / 30 s: key group 1 counted once
                expected("KeyshiftLagGrowing", "2.333", streamjob="orders", namespace="shop")]},
            {"eval_time": "12m", "alertname": "KeyshiftAutoscalerAtMaxWhileLagGrows",
             "exp_alerts": []},  # at_max only since minute 10: not yet for 5 minutes
            {"eval_time": "17m", "alertname": "KeyshiftAutoscalerAtMaxWhileLagGrows",
             "exp_alerts": [expected("KeyshiftAutoscalerAtMaxWhileLagGrows",
                                     streamjob="orders", namespace="shop")]},
        ],
    })  # fmt: skip


@needs_promtool
def test_rescale_and_store_alerts(tmp_path: Path) -> None:
    """A rescale rolled back fires at once; one running for 11 minutes is stuck; a worker
    without its store for 2 minutes fires, one that reconnects within a minute does not."""
    shop = 'streamjob="orders", namespace="shop"'
    promtool_test(tmp_path, {
        "interval": "30s",
        "input_series": [
            {"series": f'keyshift_rescale_duration_seconds_count{{{shop}, reason="autoscaler", '
                       'outcome="rolled_back"}', "values": "0 0 1x10"},
            {"series": f'keyshift_rescale_duration_seconds_count{{{shop}, reason="user", '
                       'outcome="succeeded"}', "values": "0 1 2x10"},
            {"series": f"keyshift_rescale_in_progress_seconds{{{shop}}}",
             "values": "0 0 30+30x30"},
            {"series": f'keyshift_store_connected{{{shop}, worker="orders-worker-0"}}',
             "values": "1 1 0x10"},
            {"series": f'keyshift_store_connected{{{shop}, worker="orders-worker-1"}}',
             "values": "1 1 0 1x10"},
        ],
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "KeyshiftRescaleFailed", "exp_alerts": [
                expected("KeyshiftRescaleFailed", streamjob="orders", namespace="shop",
                         reason="autoscaler", outcome="rolled_back")]},
            {"eval_time": "5m", "alertname": "KeyshiftRescaleStuck", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "KeyshiftRescaleStuck", "exp_alerts": [
                expected("KeyshiftRescaleStuck", "11m 30s", streamjob="orders",
                         namespace="shop")]},
            {"eval_time": "1m30s", "alertname": "KeyshiftStoreUnreachable", "exp_alerts": []},
            {"eval_time": "4m", "alertname": "KeyshiftStoreUnreachable", "exp_alerts": [
                expected("KeyshiftStoreUnreachable", streamjob="orders", namespace="shop",
                         worker="orders-worker-0")]},
        ],
    })  # fmt: skip


# -- in a real Prometheus ---------------------------------------------------------------------


class GrowingLag:
    """A worker's ``/metrics`` on a loopback port whose lag grows 1000 records/s."""

    def __init__(self, job: str, namespace: str, growth: float) -> None:
        self.metrics = WorkerMetrics(job, f"{job}-worker-0", namespace)
        self.metrics.store_connected.set(1)
        self.t0 = time.time()
        metrics, t0 = self.metrics, self.t0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                lag = int(growth * (time.time() - t0)) + 10
                metrics.source(0, end=lag + 100, position=100)
                body = metrics.exposition()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fast_lag_rule() -> dict[str, Any]:
    """``KeyshiftLagGrowing`` with its minutes made seconds: the same expression."""
    rule = dict(next(r for r in rules() if r["alert"] == "KeyshiftLagGrowing"))
    assert "[5m:30s]" in rule["expr"] and rule["for"] == "10m"
    return {**rule, "expr": rule["expr"].replace("[5m:30s]", "[5s:1s]"), "for": "3s"}


@pytest.fixture
def prometheus_with_rules(tmp_path: Path) -> Iterator[PrometheusServer]:
    if prometheus_binary() is None:
        pytest.skip("no prometheus binary on PATH (Debian/Ubuntu: apt-get install prometheus)")
    fast = tmp_path / "fast.rules.yaml"
    fast.write_text(yaml.safe_dump({"groups": [{"name": "keyshift-fast",
                                                "rules": [fast_lag_rule()]}]}))  # fmt: skip
    server = PrometheusServer(tmp_path / "prometheus", rule_files=[RULES, fast]).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_real_prometheus_loads_the_rules_and_the_lag_alert_fires(
    prometheus_with_rules: PrometheusServer,
) -> None:
    """Prometheus (no honor_labels) loads every rule and evaluates it without error
    against a worker's real series; the lag alert, its minutes made seconds, fires for
    the job whose lag grows, not for the one whose lag stays."""
    prometheus = prometheus_with_rules
    growing, steady = GrowingLag("orders", "shop", 1000.0), GrowingLag("steady", "shop", 0.0)
    try:
        prometheus.set_targets([growing.target, steady.target])
        prometheus.wait_until_scraped(20)

        deadline = time.monotonic() + 30
        while not any(a["state"] == "firing" for a in prometheus.alerts()):
            assert time.monotonic() < deadline, f"no alert fired: {prometheus.alerts()}"
            time.sleep(0.5)
        (alert,) = [a for a in prometheus.alerts() if a["state"] == "firing"]
        assert alert["labels"] == {"alertname": "KeyshiftLagGrowing", "severity": "warning",
                                   "streamjob": "orders", "namespace": "shop"}  # fmt: skip
        assert float(alert["value"]) == pytest.approx(1000, rel=0.2)
        groups = {g["name"]: g for g in prometheus.rules()}
        loaded = {r["name"]: r for r in groups["keyshift"]["rules"]}
        assert set(loaded) == {r["alert"] for r in rules()}
        for name, rule in loaded.items():
            assert rule["health"] == "ok", (name, rule.get("lastError"))
            assert rule["state"] == "inactive" or name == "KeyshiftLagGrowing", (name, rule)
    finally:
        growing.stop()
        steady.stop()
