"""``keyshift run`` on each example, in a real pseudo-terminal, stopped with Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from keyshift.api.spec import LogSink, load_manifest
from keyshift.store import open_store
from keyshift.store.server import LocalServer, wait_until

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

pytestmark = pytest.mark.slow


class Terminal:
    """A process on a pseudo-terminal; what it prints is collected by a thread."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: exec the command with the terminal as its stdio
            os.chdir(cwd)
            os.environ["PYTHONPATH"] = str(REPO)
            os.execv(argv[0], argv)
        self.pid, self.fd = pid, fd
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                self.output += data

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"did not exit within {timeout}s; screen:\n{self.text()[-3000:]}")


def processing(status_file: Path) -> bool:
    try:
        doc = json.loads(status_file.read_text())
    except (OSError, ValueError):
        return False
    return bool(doc["workers"]) and all((w["processed_rate"] or 0) > 0 for w in doc["workers"])


def run_once(manifest: Path, workdir: Path, job: str) -> str:
    """Run until every worker processes records, then Ctrl-C; return the screen."""
    term = Terminal([sys.executable, "-m", "keyshift.controller.cli", "run", str(manifest)],
                    workdir)  # fmt: skip
    status = workdir / ".keyshift" / job / "status.json"
    wait_until(lambda: processing(status) and "succeeded" in term.text(), 60,
               f"every worker to process records; screen:\n{term.text()[-2000:]}")  # fmt: skip
    term.ctrl_c()
    code = term.wait(60)
    assert code == 0, term.text()[-3000:]
    return term.text()


async def committed_positions(store_dir: Path, job: str, key_groups: int) -> list[int]:
    """Start the job's stopped embedded store on its data and read the positions."""
    server = LocalServer(store_dir).start()
    store = open_store(server.url)
    try:
        return [(await store.key_group_info(job, kg)).position for kg in range(key_groups)]
    finally:
        await store.close()
        server.stop()


@pytest.mark.parametrize("manifest", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_run_in_a_terminal_ctrl_c_and_resume(manifest: Path, tmp_path: Path) -> None:
    job = load_manifest(manifest)
    key_groups = job.spec.key_groups
    store_dir = tmp_path / ".keyshift" / job.name / "store"

    screen = run_once(manifest, tmp_path, job.name)
    assert "workers" in screen and "rescales" in screen  # the live view, not log lines
    first = asyncio.run(committed_positions(store_dir, job.name, key_groups))
    assert sum(first) > 0, "Ctrl-C must leave the processed positions committed"

    # the example's outputs are in the job's run directory, not the working one
    outputs = [s.path for s in (job.spec.sink, *job.spec.side_outputs.values())
               if isinstance(s, LogSink) and s.path]  # fmt: skip
    for output in outputs:
        assert (tmp_path / ".keyshift" / job.name / output).exists()
    if outputs:
        assert f"outputs go to {Path('.keyshift') / job.name / outputs[0]}" in screen
    assert [p.name for p in tmp_path.iterdir()] == [".keyshift"]

    run_once(manifest, tmp_path, job.name)
    second = asyncio.run(committed_positions(store_dir, job.name, key_groups))
    assert all(b >= a for a, b in zip(first, second, strict=True)), "a second run resumes"
    assert sum(second) > sum(first)
    stopped = subprocess.run(
        [sys.executable, "-m", "keyshift.controller.cli", "status", job.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert stopped.returncode == 0, stopped.stderr
    assert "not running" in stopped.stdout and "Ctrl-C stops" not in stopped.stdout
