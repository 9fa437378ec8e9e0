"""A real Prometheus server for tests (the Debian ``prometheus`` package; CI installs
it with apt).

It listens on a free loopback port, keeps its TSDB in a directory of its own,
scrapes every second, and finds its targets through a file (``file_sd_configs``)
the test writes with ``set_targets``.  No ``honor_labels``: keyshift's metrics
name the StreamJob ``streamjob`` and ``namespace``, never ``job``, so a
Prometheus as configured by default keeps them as they are.  New
targets are picked up within about 6 s (file discovery plus the discovery
manager's update interval): ``wait_until_scraped`` polls the targets API until
every target is up, with a deadline.  ``rule_files`` are loaded and evaluated
every second (``rules()``, ``alerts()``).  The process is stopped by its PID.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from keyshift.store.server import free_port, stop_process

SCRAPE_JOB = "keyshift-workers"

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: {rule_files}
scrape_configs:
  - job_name: {job}
    metrics_path: /metrics
    file_sd_configs:
      - files: [{targets}]
        refresh_interval: 1s
"""


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class PrometheusServer:
    def __init__(
        self, directory: Path, binary: str | None = None, rule_files: Sequence[Path] = ()
    ) -> None:
        found = binary or prometheus_binary()
        if found is None:
            raise FileNotFoundError("no prometheus binary on PATH")
        self.binary = found
        self.rule_files = [str(path) for path in rule_files]
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.targets_file = directory / "targets.json"
        self.config_file = directory / "prometheus.yml"
        self.data_dir = directory / "data"
        self.log_path = directory / "prometheus.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._expected: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> PrometheusServer:
        self.data_dir.mkdir(exist_ok=True)
        if not self.targets_file.exists():
            self.set_targets([])
        self.config_file.write_text(
            CONFIG.format(
                job=SCRAPE_JOB,
                targets=json.dumps(str(self.targets_file)),
                rule_files=json.dumps(self.rule_files),
            )
        )
        self.port = free_port()
        cmd = [
            self.binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                cmd, cwd=self.directory, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with {self.process.returncode}; log:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"prometheus not ready within {timeout:g} s; log:\n{self.log()}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_process(process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def set_targets(self, targets: Sequence[str], labels: Mapping[str, str] | None = None) -> None:
        """Replace the scraped targets (``host:port``), written atomically."""
        groups = [{"targets": list(targets), "labels": dict(labels or {})}] if targets else []
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets_file)
        self._expected = set(targets)

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=5, trust_env=False)
        response.raise_for_status()
        return response.json()

    def targets(self) -> dict[str, str]:
        """The active targets of the test scrape job: ``host:port -> health``."""
        active = self.get("/api/v1/targets", state="active")["data"]["activeTargets"]
        return {
            t["discoveredLabels"]["__address__"]: t["health"]
            for t in active
            if t["scrapePool"] == SCRAPE_JOB
        }

    def wait_until_scraped(self, timeout: float = 20.0) -> None:
        """Until exactly the targets last set are active and every one is up."""
        deadline = time.monotonic() + timeout
        seen: dict[str, str] = {}
        while True:
            try:
                seen = self.targets()
            except httpx.HTTPError:
                seen = {}
            if set(seen) == self._expected and all(h == "up" for h in seen.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"prometheus did not scrape {sorted(self._expected)} within {timeout:g} s "
                    f"(targets: {seen})"
                )
            time.sleep(0.2)

    def rules(self) -> list[dict[str, Any]]:
        """The rule groups Prometheus loaded (``/api/v1/rules``)."""
        groups: list[dict[str, Any]] = self.get("/api/v1/rules")["data"]["groups"]
        return groups

    def alerts(self) -> list[dict[str, Any]]:
        """The pending and firing alerts (``/api/v1/alerts``)."""
        alerts: list[dict[str, Any]] = self.get("/api/v1/alerts")["data"]["alerts"]
        return alerts

    def _ready(self) -> bool:
        try:
            response = httpx.get(f"{self.url}/-/ready", timeout=1, trust_env=False)
        except httpx.HTTPError:
            return False
        return response.status_code == 200
