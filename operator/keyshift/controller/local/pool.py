"""Workers as local processes: the WorkerPool of ``keyshift run``.

Each worker is ``python -m keyshift.runtime`` with its own HTTP port, logging
to ``<run dir>/logs/worker-<i>.log``. Like a kubelet, the pool restarts a
worker that exits, after ``restart_delay`` seconds (doubling on repeated
crashes, up to a minute; a worker that was ready for ``BACKOFF_RESET_SECONDS``
starts the back-off over, so that a crash loop backs off but a healthy worker
killed now and then comes back at once). Workers get SIGTERM if the pool's process dies, and
a new pool stops the workers a previous one left behind (their PIDs are in
``<run dir>/workers.json``), so no worker outlives its controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from keyshift.api.names import worker_name
from keyshift.controller.core.pool import WorkerInfo
from keyshift.runtime.api import JOB_PATH_ENV
from keyshift.runtime.config import OUTPUT_DIR_ENV
from keyshift.runtime.metrics import LOCAL_NAMESPACE, NAMESPACE_ENV
from keyshift.store.server import free_port


def job_path(manifest: Path) -> list[str]:
    """Where a local run's workers look for the job's module: the current directory, the
    manifest's folder and its parent."""
    folder = manifest.resolve().parent
    return [os.getcwd(), str(folder), str(folder.parent)]


PR_SET_PDEATHSIG = 1
STOP_TIMEOUT = 20.0
MAX_RESTART_DELAY = 60.0
BACKOFF_RESET_SECONDS = 10.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux only: the kernel ends the worker when the supervisor dies (even by SIGKILL).
    Elsewhere the next run stops leftover workers (``LocalWorkerPool`` adopts none)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class _Process:
    ordinal: int
    port: int
    popen: subprocess.Popen[bytes]
    started_at: float
    restarts: int = 0
    ready: bool = False
    last_ready_at: float | None = None
    exited_at: float | None = None
    detail: str = ""


class LocalWorkerPool:
    def __init__(
        self,
        job: str,
        manifest: Path,
        store_url: str,
        run_dir: Path,
        *,
        restart_delay: float = 5.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.job = job
        self.manifest = manifest
        self.store_url = store_url
        self.run_dir = run_dir
        self.restart_delay = restart_delay
        self.env = env or {}
        self.log_dir = run_dir / "logs"
        self.pids_file = run_dir / "workers.json"
        self._procs: dict[int, _Process] = {}
        self._http = httpx.AsyncClient(timeout=0.5)

    # -- lifecycle --------------------------------------------------------------

    def stop_leftovers(self) -> list[int]:
        """Stop workers a previous pool in this run directory left running."""
        if not self.pids_file.exists():
            return []
        stopped = [
            pid
            for pid in json.loads(self.pids_file.read_text()).get("pids", [])
            if pid_alive(pid) and _is_our_worker(pid, self.manifest)
        ]
        for pid in stopped:
            stop_pid(pid)
        self.pids_file.unlink()
        return stopped

    def _spawn(self, ordinal: int, restarts: int = 0) -> _Process:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        cmd = [
            sys.executable, "-m", "keyshift.runtime",
            "--manifest", str(self.manifest),
            "--ordinal", str(ordinal),
            "--store-url", self.store_url,
            "--http-port", str(port),
        ]  # fmt: skip
        log = (self.log_dir / f"worker-{ordinal}.log").open("ab")
        try:
            popen = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C goes to the controller, which stops workers
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                env=self._environment(),
            )
        finally:
            log.close()
        proc = _Process(ordinal, port, popen, time.time(), restarts=restarts)
        self._procs[ordinal] = proc
        self._save_pids()
        return proc

    def _environment(self) -> dict[str, str]:
        """The job module is imported from the current directory, the manifest's
        folder or its parent (``examples.counter:job`` next to ``examples/x.yaml``):
        ``KEYSHIFT_JOB_PATH``, searched after the standard library and the installed
        packages, so that a folder of the user's cannot hide one of them. Log sinks write
        into the job's run directory (``KEYSHIFT_OUTPUT_DIR``), not the current one. The
        metrics name the namespace ``local`` (``KEYSHIFT_NAMESPACE``), which the local
        autoscaler's queries select by."""
        return {
            **os.environ,
            NAMESPACE_ENV: LOCAL_NAMESPACE,
            JOB_PATH_ENV: os.pathsep.join(job_path(self.manifest)),
            OUTPUT_DIR_ENV: str(self.run_dir.resolve()),
            **self.env,
        }

    def _save_pids(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        pids = [p.popen.pid for p in self._procs.values()]
        self.pids_file.write_text(json.dumps({"pids": pids}))

    async def start(self, ordinals: Collection[int]) -> None:
        for ordinal in ordinals:
            if ordinal not in self._procs:
                self._spawn(ordinal)

    async def stop(self, ordinals: Collection[int]) -> None:
        procs = [self._procs.pop(o) for o in ordinals if o in self._procs]
        for proc in procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.to_thread(proc.popen.wait, STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                await asyncio.to_thread(proc.popen.wait)
        self._save_pids()

    async def close(self) -> None:
        await self.stop(list(self._procs))
        await self._http.aclose()
        with contextlib.suppress(FileNotFoundError):
            self.pids_file.unlink()

    # -- observation ------------------------------------------------------------

    async def workers(self) -> dict[int, WorkerInfo]:
        now = time.time()
        for ordinal, proc in list(self._procs.items()):
            code = proc.popen.poll()
            if code is None:
                continue
            if proc.exited_at is None:
                proc.exited_at = now
                proc.ready = False
                proc.detail = f"exited with code {code}"
            delay = min(self.restart_delay * 2**proc.restarts, MAX_RESTART_DELAY)
            if now - proc.exited_at >= delay:
                restarted = self._spawn(ordinal, restarts=proc.restarts + 1)
                restarted.last_ready_at = proc.last_ready_at
                restarted.detail = f"restarted after {proc.detail}"
        await asyncio.gather(*(self._probe(p) for p in self._procs.values()))
        return {
            o: WorkerInfo(
                ordinal=o,
                name=worker_name(self.job, o),
                running=p.popen.poll() is None,
                ready=p.ready,
                not_ready_since=None if p.ready else (p.last_ready_at or p.started_at),
                metrics_url=f"http://127.0.0.1:{p.port}/metrics",
                pid=p.popen.pid,
                detail="" if p.ready else p.detail,
            )
            for o, p in sorted(self._procs.items())
        }

    async def _probe(self, proc: _Process) -> None:
        if proc.popen.poll() is not None:
            proc.ready = False
            return
        try:
            response = await self._http.get(f"http://127.0.0.1:{proc.port}/readyz")
            proc.ready = response.status_code == 200
            proc.detail = "" if proc.ready else f"readiness: {response.text[:200]}"
        except httpx.HTTPError as exc:
            proc.ready = False
            proc.detail = f"readiness probe: {type(exc).__name__}"
        if proc.ready:
            proc.last_ready_at = time.time()
            if proc.restarts and time.time() - proc.started_at > BACKOFF_RESET_SECONDS:
                proc.restarts = 0  # ready for a while: the back-off starts over


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie (exited, not yet reaped) does not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_pid(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _is_our_worker(pid: int, manifest: Path) -> bool:
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "keyshift.runtime" in cmdline and str(manifest) in cmdline
