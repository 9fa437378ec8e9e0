"""keyshift's alerts: the chart's PrometheusRule carries ``alerts/keyshift.rules.yaml``,
which Prometheus' own ``promtool`` checks and unit-tests (an alert that fires when a
key group stops, and only then), and which asks only for series keyshift exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart.render import find, one, render
from tests.chart.test_monitoring import exported_series

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


def test_the_alerts_ask_only_for_exported_series() -> None:
    exprs = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    asked = set(re.findall(r"\bkeyshift_[a-z_]+", " ".join(exprs)))
    assert asked and not asked - exported_series(), asked - exported_series()


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
    labels = '{job="orders", namespace="shop", worker="orders-worker-0"}'
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
                    "exp_labels": {"severity": "warning", "job": "orders", "namespace": "shop"},
                    "exp_annotations": {
                        "summary": "StreamJob orders: 1 key groups stopped",
                        "description": yaml.safe_load(RULES.read_text())["groups"][0]["rules"][0][
                            "annotations"]["description"]
                        .replace("{{ $labels.job }}", "orders")
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
