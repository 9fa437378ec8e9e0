"""The autoscaler through the real PromQL path: a real Prometheus scrapes a local job.

``keyshift run`` keeps ``.keyshift/<job>/prometheus-targets.json`` (file service
discovery) current; the test's Prometheus reads it (mirrored into its own
targets file), and the job's ``spec.autoscaler.prometheus.url`` points at it.
A step up in the generator's rate makes the job scale up.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controller.localjob import LocalJob
from tests.controller.test_local_autoscale import HIGH, KEY_GROUPS, LOW, STEP_UP_AT, autoscaled
from tests.prometheus_server import PrometheusServer
from tests.support import counter_manifest, write_manifest

pytestmark = pytest.mark.slow


@pytest.fixture
def mirrored_targets(prometheus: PrometheusServer, tmp_path: Path) -> Iterator[Path]:
    """Copy the run directory's file-SD file into Prometheus' targets file as it changes."""
    source = tmp_path / ".keyshift" / "promscaled" / "prometheus-targets.json"
    stop = threading.Event()

    def mirror() -> None:
        last = None
        while not stop.wait(0.2):
            try:
                text = source.read_text()
            except OSError:
                continue
            if text != last:
                tmp = prometheus.targets_file.with_suffix(".mirror")
                tmp.write_text(text)
                tmp.replace(prometheus.targets_file)
                last = text

    thread = threading.Thread(target=mirror, daemon=True)
    thread.start()
    yield source
    stop.set()
    thread.join(5)
    prometheus.set_targets([])


async def test_a_step_up_scales_the_job_through_prometheus(
    tmp_path: Path, prometheus: PrometheusServer, mirrored_targets: Path
) -> None:
    """``mirrored_targets`` feeds Prometheus the run directory's file-SD file."""
    points = [[0, LOW], [STEP_UP_AT, LOW], [STEP_UP_AT + 1, HIGH]]
    doc = counter_manifest(
        "promscaled", key_groups=KEY_GROUPS, parallelism=1, store_url="redis://127.0.0.1:1",
        source={"seed": 3, "keys": 2000, "rate": {"shape": "points", "points": points}},
        checkpoint_interval="200ms",
        autoscaler={
            "enabled": True, "minParallelism": 1, "maxParallelism": 4,
            "metricsWindowSeconds": 8, "intervalSeconds": 3, "cooldownSeconds": 8,
            "catchUpSeconds": 20, "prometheus": {"url": prometheus.url},
        },
    )  # fmt: skip
    doc["spec"]["job"] = "examples.busy_counter:job"
    job = LocalJob(tmp_path, write_manifest(tmp_path, doc), "promscaled").start()
    try:

        def scaled_up(s: dict[str, Any]) -> bool:
            return any(r["to"] > 1 for r in autoscaled(s))

        try:
            status = await asyncio.to_thread(
                job.wait_status, scaled_up, STEP_UP_AT + 60, "a scale-up decided from Prometheus"
            )
        except TimeoutError as exc:
            raise AssertionError(
                f"{exc}\nprometheus targets: {prometheus.targets()}\n"
                f"targets file: {prometheus.targets_file.read_text()}\n{prometheus.log()}"
            ) from exc
        up = next(d for d in status["autoscaler"]["decisions"] if d["action"] == "scale_up")
        assert up["inputs"]["arrival_rate"] > LOW * 2, up
        assert job.interrupt() == 0
    finally:
        job.close()
