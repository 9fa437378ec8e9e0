"""The process checks of local runs (``keyshift run``'s pool and supervisor), through
psutil so that they work where there is no ``/proc`` (macOS)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from keyshift.controller.local.pool import _is_our_worker, pid_alive, stop_pid
from keyshift.store.server import wait_until


def test_pid_alive_is_false_for_a_zombie_and_an_unknown_pid() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        stop_pid(child.pid, timeout=10)
        # stopped but not reaped: a zombie, which does not count as alive
        wait_until(lambda: not pid_alive(child.pid), 10, "the child to exit")
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)  # reaped: no such process


def test_a_worker_is_recognised_by_its_command_line(tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    fake = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "keyshift.runtime", str(manifest)]
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _is_our_worker(fake.pid, manifest)
        assert not _is_our_worker(fake.pid, tmp_path / "other.yaml")
        assert not _is_our_worker(other.pid, manifest)
    finally:
        for p in (fake, other):
            p.kill()
            p.wait()
