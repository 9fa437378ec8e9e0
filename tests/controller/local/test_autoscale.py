"""The autoscaler on a real local job: the load steps up and down, the job follows.

``keyshift run`` with real worker processes and ``examples/busy_counter.py``
(about 250 us of work per record, so that a few thousand records per second
saturate a worker). The scaling test goes through the real PromQL path, the one
the operator always takes: a real Prometheus scrapes the workers (found through
the file-SD file ``keyshift run`` keeps in its run directory, mirrored into the
test Prometheus' targets file) and the job's ``spec.autoscaler.prometheus.url``
points at it. The recommend-mode test goes through the direct-scrape provider,
``keyshift run``'s default, so that each provider is used end to end once.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controller.local.localjob import LocalJob
from tests.prometheus_server import PrometheusServer
from tests.support import counter_manifest, write_manifest

pytestmark = pytest.mark.slow

KEY_GROUPS = 16
STEP_UP_AT, STEP_DOWN_AT = 15, 50
LOW, HIGH = 400, 3600  # records/s: ~0.1 and ~0.9 of one worker's capacity


Provider = Callable[[Path, str], dict[str, Any]]
"""``provider(workdir, job)``: the ``autoscaler`` fields that choose the metrics source."""


@pytest.fixture
def provider(prometheus: PrometheusServer) -> Iterator[Provider]:
    """The job's metrics come from the test Prometheus, which scrapes its workers."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def mirror(source: Path) -> None:
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

    def use(workdir: Path, job: str) -> dict[str, Any]:
        source = workdir / ".keyshift" / job / "prometheus-targets.json"
        thread = threading.Thread(target=mirror, args=(source,), daemon=True)
        thread.start()
        threads.append(thread)
        return {"prometheus": {"url": prometheus.url}}

    yield use
    stop.set()
    for thread in threads:
        thread.join(5)
    prometheus.set_targets([])


def manifest(tmp_path: Path, job: str, mode: str, provider: Provider) -> Path:
    points = [[0, LOW], [STEP_UP_AT, LOW], [STEP_UP_AT + 1, HIGH],
              [STEP_DOWN_AT, HIGH], [STEP_DOWN_AT + 1, LOW]]  # fmt: skip
    doc = counter_manifest(
        job, key_groups=KEY_GROUPS, parallelism=1, store_url="redis://127.0.0.1:1",
        source={"seed": 5, "keys": 2000, "rate": {"shape": "points", "points": points}},
        checkpoint_interval="200ms",
        autoscaler={
            "enabled": True, "mode": mode, "minParallelism": 1, "maxParallelism": 4,
            "metricsWindowSeconds": 6, "intervalSeconds": 3, "cooldownSeconds": 8,
            "scaleDownStabilizationSeconds": 12, "catchUpSeconds": 20,
            **provider(tmp_path, job),
        },
    )  # fmt: skip
    doc["spec"]["job"] = "examples.busy_counter:job"
    return write_manifest(tmp_path, doc)


def autoscaled(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in status["rescales"] if r["reason"] == "autoscaler"]


async def test_the_job_scales_up_with_the_load_and_back_down_after_it(
    tmp_path: Path, local_jobs: list[LocalJob], provider: Provider
) -> None:
    path = manifest(tmp_path, "autoscaled", "scale", provider)
    job = LocalJob(tmp_path, path, "autoscaled").start()
    local_jobs.append(job)

    up = await asyncio.to_thread(
        job.wait_status, lambda s: any(r["to"] > 1 for r in autoscaled(s)), STEP_UP_AT + 75,
        "a scale-up after the load rose",
    )  # fmt: skip
    first = autoscaled(up)[0]
    assert first["from"] == 1 and first["to"] >= 2 and first["outcome"] == "succeeded"
    assert up["autoscaler"]["mode"] == "scale"

    down = await asyncio.to_thread(
        job.wait_status,
        lambda s: s["parallelism"] == 1 and autoscaled(s)[-1]["to"] == 1,
        STEP_DOWN_AT + 75, "a scale-down after the load fell",
    )  # fmt: skip
    actions = [(r["from"], r["to"]) for r in autoscaled(down)]
    assert actions[0][1] > 1 and actions[-1][1] == 1, actions
    # no flapping: every scale-up comes before every scale-down. The way up may take
    # several steps: on a 2-core machine each added worker process adds less than a
    # worker's capacity, and the autoscaler, measuring the capacity per worker anew
    # after each rescale (busy time), steps again (1 -> 2 -> 3 -> 4 was seen)
    ups = [to > before for before, to in actions]
    assert ups == sorted(ups, reverse=True), actions
    assert sum(not up for up in ups) <= 2, actions
    saved = json.loads((job.run_dir / "autoscaler.json").read_text())
    assert "scale_down" in {d["action"] for d in saved["decisions"]}

    explained = job.cli("explain", "autoscaled", "--last", "20")
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert "scale_down" in explained.stdout or "scale down" in explained.stdout.lower()
    assert job.interrupt() == 0


async def test_recommend_mode_reports_without_acting(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    """Recommend mode decides as scale mode does and only reports; its metrics come from
    the direct-scrape provider (the scaling test above takes the Prometheus one)."""
    path = manifest(tmp_path, "advised", "recommend", lambda workdir, job: {})
    job = LocalJob(tmp_path, path, "advised").start()
    local_jobs.append(job)

    def recommended_up(s: dict[str, Any]) -> bool:
        auto = s.get("autoscaler") or {}
        return any(d["action"] == "scale_up" for d in auto.get("decisions") or [])

    status = await asyncio.to_thread(
        job.wait_status, recommended_up, STEP_UP_AT + 75, "a scale-up recommendation"
    )
    assert status["parallelism"] == 1 and not autoscaled(status)
    assert job.interrupt() == 0
