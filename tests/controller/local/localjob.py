"""``keyshift run`` as a user runs it: a real supervisor process with its workers
and embedded Valkey, driven through the CLI and its run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from keyshift.store import RedisStateStore, open_store
from keyshift.store.server import wait_until

REPO = Path(__file__).resolve().parents[3]


class LocalJob:
    def __init__(
        self,
        workdir: Path,
        manifest: Path,
        job: str,
        *,
        extra_args: tuple[str, ...] = (),
        keep_running: bool = True,
    ) -> None:
        """``keep_running``: a bounded job does not end the run when it finishes (the
        tests' faults and rescales come after the input may have been processed)."""
        self.workdir = workdir
        self.manifest = manifest
        self.job = job
        self.extra_args = (*extra_args, "--keep-running") if keep_running else extra_args
        self.run_dir = workdir / ".keyshift" / job
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"keyshift-run-{job}.log"
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}

    # -- the supervisor -----------------------------------------------------------

    def start(self, timeout: float = 30.0) -> LocalJob:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "keyshift.controller.cli", "run", str(self.manifest),
                 *self.extra_args],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        wait_until(self._started, timeout, "keyshift run to start")
        return self

    def _started(self) -> bool:
        """Running, and its supervisor file is its own (not a killed run's)."""
        self._alive()
        try:
            data = json.loads((self.run_dir / "supervisor.json").read_text())
        except (OSError, ValueError):
            return False
        return self.process is not None and data.get("pid") == self.process.pid

    def _alive(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"keyshift run exited {self.process.returncode}:\n{self.log()}")
        return True

    def interrupt(self, timeout: float = 60.0) -> int:
        """Ctrl-C, as a user stops it; return the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=timeout)
        self.process = None
        return code

    def kill(self) -> None:
        """SIGKILL the supervisor only (its workers die with it)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.interrupt()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    # -- what a user reads and does ----------------------------------------------

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keyshift.controller.cli", *args],
            cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def status(self) -> dict[str, Any]:
        result = self.cli("status", self.job, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        data: dict[str, Any] = json.loads(result.stdout)
        return data

    def scale(self, parallelism: int) -> None:
        result = self.cli("scale", self.job, str(parallelism), "--wait", "--timeout", "90")
        assert result.returncode == 0, result.stdout + result.stderr + self.log()

    def controller_record(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir / "controller.json").read_text())
        return data

    def store_url(self) -> str:
        return str(json.loads((self.run_dir / "supervisor.json").read_text())["store_url"])

    def store(self) -> RedisStateStore:
        return open_store(self.store_url())

    def wait_status(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def check() -> bool:
            nonlocal found
            found = self.status()
            return bool(predicate(found))

        wait_until(check, timeout, what, interval=0.2)
        return found

    def worker_pid(self, ordinal: int) -> int:
        for w in self.status()["workers"]:
            if w["ordinal"] == ordinal and w["pid"]:
                return int(w["pid"])
        raise AssertionError(f"worker {ordinal} has no pid")


def until(seconds: float) -> float:
    return time.monotonic() + seconds
