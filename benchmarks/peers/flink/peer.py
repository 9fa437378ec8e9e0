"""Apache Flink 2.3 as the comparison peer: set up from nothing, run, tear down.

Everything lives under ``benchmarks/peers/flink/.work/`` (git-ignored):

- ``venv/``: its own virtualenv with PyPI ``apache-flink==2.3.0``, which bundles
  Flink's distribution (``pyflink/lib``, ``bin``, ``opt``, ``plugins``);
- ``flink/``: a distribution made of it (``bin/`` copied with exec bits,
  ``lib``/``opt``/``plugins`` linked) that ``bin/jobmanager.sh`` and
  ``bin/taskmanager.sh`` run from, with one ``conf-*/config.yaml`` per setup;
- ``keyed-counter.jar``: ``KeyedCounter.java`` compiled on the spot with
  ``javac`` against the bundled jars.

The cluster is a standalone session cluster on 127.0.0.1 only (RPC, REST, blob,
data and metrics ports), its processes started in the foreground as children
of this one and stopped (or SIGKILLed, for the failover) by PID. Nothing here
is a dependency of keyshift.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLINK_VERSION = "2.3.0"
HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
SOURCE = HERE / "KeyedCounter.java"
MAIN_CLASS = "keyshift.bench.KeyedCounter"
MAX_PARALLELISM = 32
"""Flink's key groups: as many as keyshift's key groups in the comparison."""


def log(message: str) -> None:
    print(f"[flink {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- setup ----------------------------------------------------------------------------


def ensure_venv(work: Path = WORK) -> Path:
    """Create the peer's venv with apache-flink if missing; return the pyflink package dir."""
    venv = work / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating {venv} and installing apache-flink=={FLINK_VERSION}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    found = sorted(venv.glob("lib/python3*/site-packages/pyflink/lib/flink-dist-*.jar"))
    if not found or FLINK_VERSION not in found[0].name:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"apache-flink=={FLINK_VERSION}"],
            check=True,
        )
        found = sorted(venv.glob("lib/python3*/site-packages/pyflink/lib/flink-dist-*.jar"))
    return found[0].parent.parent


def ensure_distribution(pyflink: Path, work: Path = WORK) -> Path:
    """A FLINK_HOME from the bundled jars: bin copied (exec bits), the rest linked."""
    home = work / "flink"
    if (home / "lib").is_dir() and not (home / "lib").is_symlink():
        return home
    home.mkdir(parents=True, exist_ok=True)
    shutil.copytree(pyflink / "bin", home / "bin", dirs_exist_ok=True)
    for script in (home / "bin").iterdir():
        script.chmod(0o755)
    shutil.copytree(pyflink / "conf", home / "conf", dirs_exist_ok=True)
    (home / "lib").mkdir(exist_ok=True)  # a real folder: bin/config.sh runs find on it
    for jar in (pyflink / "lib").iterdir():
        if not (home / "lib" / jar.name).exists():
            (home / "lib" / jar.name).symlink_to(jar)
    for name in ("opt", "plugins"):
        link = home / name
        if not link.exists():
            link.symlink_to(pyflink / name)
    (home / "log").mkdir(exist_ok=True)
    return home


def ensure_jar(home: Path, work: Path = WORK) -> Path:
    """Compile the job against the bundled jars (again when the source changed)."""
    jar = work / "keyed-counter.jar"
    if jar.exists() and jar.stat().st_mtime > SOURCE.stat().st_mtime:
        return jar
    classes = work / "classes"
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    log("compiling KeyedCounter.java")
    subprocess.run(
        ["javac", "-d", str(classes), "-cp", f"{home / 'lib'}/*", str(SOURCE)], check=True
    )
    subprocess.run(["jar", "cf", str(jar), "-C", str(classes), "."], check=True)
    return jar


def setup(work: Path = WORK) -> tuple[Path, Path]:
    """The peer from nothing: venv, distribution, compiled job. Returns (FLINK_HOME, jar)."""
    home = ensure_distribution(ensure_venv(work), work)
    return home, ensure_jar(home, work)


# -- configuration -------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """One cluster configuration: state backend and scheduler."""

    backend: str = "rocksdb"
    """``rocksdb`` or ``forst`` (both in flink-dist)."""
    scheduler: str = "default"
    """``default`` (rescale = stop with savepoint + restart) or ``adaptive``."""
    taskmanagers: int = 3
    slots_per_taskmanager: int = 2
    checkpoint_interval: str = "2s"
    rest_port: int = 18081
    rpc_port: int = 16123
    blob_port: int = 16124
    taskmanager_memory: str = "1400m"


def java_opts(home: Path) -> str:
    """The distribution's own ``env.java.opts.all`` (the JDK 17 --add-opens Flink needs)."""
    for line in (home / "conf" / "config.yaml").read_text().splitlines():
        if line.strip().startswith("all: --add-"):
            return line.split(":", 1)[1].strip()
    return ""


def config(s: Setup, data: Path, home: Path) -> dict[str, Any]:
    """The flat Flink 2 ``config.yaml`` of a setup; every address is loopback."""
    return {
        "env.java.opts.all": java_opts(home),
        "jobmanager.rpc.address": "127.0.0.1",
        "jobmanager.rpc.port": s.rpc_port,
        "jobmanager.bind-host": "127.0.0.1",
        "jobmanager.memory.process.size": "1200m",
        "jobmanager.scheduler": s.scheduler,
        "jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling": "1s",
        "jobmanager.adaptive-scheduler.executing.resource-stabilization-timeout": "1s",
        "jobmanager.adaptive-scheduler.rescale-trigger.max-delay": "2s",
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "rest.port": s.rest_port,
        "blob.server.port": str(s.blob_port),
        "taskmanager.host": "127.0.0.1",
        "taskmanager.bind-host": "127.0.0.1",
        "taskmanager.rpc.port": "0",
        "taskmanager.data.port": 0,
        "metrics.internal.query-service.port": "0",
        "taskmanager.numberOfTaskSlots": s.slots_per_taskmanager,
        "taskmanager.memory.process.size": s.taskmanager_memory,
        "parallelism.default": 2,
        "state.backend.type": s.backend,
        "execution.checkpointing.dir": f"file://{data / 'checkpoints'}",
        "execution.checkpointing.savepoint-dir": f"file://{data / 'savepoints'}",
        "execution.checkpointing.interval": s.checkpoint_interval,
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.num-retained": 1,
        # a dead TaskManager is noticed within seconds (keyshift's failoverAfter is 2 s)
        "heartbeat.interval": 1000,
        "heartbeat.timeout": 4000,
        "web.submit.enable": "true",
    }


# -- the cluster ---------------------------------------------------------------------


@dataclass
class Cluster:
    """A standalone session cluster: one JobManager and N TaskManagers, by PID."""

    home: Path
    setup: Setup
    data: Path
    jobmanager: subprocess.Popen[bytes] | None = None
    taskmanagers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _started: int = 0

    @property
    def conf_dir(self) -> Path:
        return self.data / "conf"

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.setup.rest_port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "FLINK_HOME": str(self.home),
            "FLINK_CONF_DIR": str(self.conf_dir),
            "FLINK_LOG_DIR": str(self.data / "log"),
        }

    def start(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.data / "log").mkdir(exist_ok=True)
        for item in (self.home / "conf").iterdir():
            if item.name != "config.yaml" and item.is_file():
                shutil.copy(item, self.conf_dir)
        lines = [
            f"{k}: {json.dumps(v) if isinstance(v, str) else v}"
            for k, v in config(self.setup, self.data, self.home).items()
        ]
        (self.conf_dir / "config.yaml").write_text("\n".join(lines) + "\n")
        self.jobmanager = self._spawn("jobmanager.sh", "jm")
        for _ in range(self.setup.taskmanagers):
            self.start_taskmanager()
        self.wait_slots(self.setup.taskmanagers * self.setup.slots_per_taskmanager)

    def _spawn(self, script: str, name: str, *extra: str) -> subprocess.Popen[bytes]:
        out = (self.data / "log" / f"{name}-{time.time_ns()}.out").open("wb")
        proc = subprocess.Popen(
            ["bash", str(self.home / "bin" / script), "start-foreground", *extra],
            env=self.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        return proc

    def start_taskmanager(self) -> str:
        """Start a TaskManager; returns its resource id (``tm<n>``, also its REST id)."""
        self._started += 1
        name = f"tm{self._started}"
        proc = self._spawn("taskmanager.sh", name, f"-Dtaskmanager.resource-id={name}")
        self.taskmanagers[name] = proc
        return name

    def kill_taskmanager(self, name: str) -> None:
        """SIGKILL, as a crash: no shutdown hooks, no goodbye to the JobManager."""
        proc = self.taskmanagers.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        procs = [*self.taskmanagers.values(), *([self.jobmanager] if self.jobmanager else [])]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.taskmanagers.clear()
        self.jobmanager = None

    # -- REST ------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, timeout: float = 60) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.rest + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:3000]
            raise RuntimeError(f"{method} {path}: HTTP {error.code}: {detail}") from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def wait_slots(self, slots: int, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.alive()
            try:
                if int(self.get("/overview")["slots-total"]) >= slots:
                    return
            except (urllib.error.URLError, OSError, ValueError, KeyError, RuntimeError):
                pass  # not up yet, or 503 during the JobManager's leader election
            time.sleep(0.3)
        raise TimeoutError(f"the Flink cluster did not offer {slots} slots in {seconds:.0f}s")

    def alive(self) -> None:
        if self.jobmanager is not None and self.jobmanager.poll() is not None:
            raise RuntimeError(
                f"the JobManager exited {self.jobmanager.returncode}: see {self.data / 'log'}"
            )

    def upload(self, jar: Path) -> str:
        """``/jars/upload`` (multipart by hand); returns the jar id."""
        boundary = f"----keyshift{time.time_ns()}"
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="jarfile"; '
                f'filename="{jar.name}"\r\nContent-Type: application/x-java-archive\r\n\r\n'
            ).encode()
            + jar.read_bytes()
            + f"\r\n--{boundary}--\r\n".encode()
        )
        request = urllib.request.Request(
            self.rest + "/jars/upload",
            data=body,
            method="POST",
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            filename = str(json.loads(response.read())["filename"])
        return filename.rsplit("/", 1)[-1]

    def run(
        self, jar_id: str, args: list[str], parallelism: int, savepoint: str | None = None
    ) -> str:
        body: dict[str, Any] = {
            "entryClass": MAIN_CLASS,
            "programArgsList": args,
            "parallelism": parallelism,
        }
        if savepoint:
            body["savepointPath"] = savepoint
            body["allowNonRestoredState"] = False
        return str(self.call("POST", f"/jars/{jar_id}/run", body, timeout=120)["jobid"])

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/jobs/{job_id}")
        return result

    def wait_job_state(self, job_id: str, states: set[str], seconds: float = 300) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.alive()
            state = str(self.job(job_id)["state"])
            if state in states:
                return state
            if state in {"FAILED", "CANCELED"} - states:
                raise RuntimeError(f"job {job_id} is {state}")
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} not in {states} after {seconds:.0f}s")

    def stop_with_savepoint(self, job_id: str, format_type: str) -> str:
        """``/jobs/:id/stop`` (no drain) with a CANONICAL or NATIVE savepoint; its path."""
        trigger = self.call(
            "POST",
            f"/jobs/{job_id}/stop",
            {
                "drain": False,
                "formatType": format_type,
                "targetDirectory": f"file://{self.data / 'savepoints'}",
            },
        )["request-id"]
        while True:
            status = self.get(f"/jobs/{job_id}/savepoints/{trigger}")
            if status["status"]["id"] == "COMPLETED":
                operation = status["operation"]
                if "failure-cause" in operation:
                    raise RuntimeError(f"savepoint failed: {operation['failure-cause']}")
                return str(operation["location"])
            time.sleep(0.1)

    def cancel(self, job_id: str) -> None:
        self.call("PATCH", f"/jobs/{job_id}?mode=cancel")
        self.wait_job_state(job_id, {"CANCELED", "FAILED", "FINISHED"})

    def vertices(self, job_id: str) -> dict[str, str]:
        """Vertex name -> id."""
        return {v["name"]: v["id"] for v in self.job(job_id)["vertices"]}

    def set_parallelism(self, job_id: str, parallelism: int) -> None:
        """Adaptive scheduler: the counter's upper bound becomes ``parallelism``."""
        counter = self._counter(job_id)
        current = self.get(f"/jobs/{job_id}/resource-requirements")
        body = {
            vid: {
                "parallelism": {
                    "lowerBound": 1,
                    "upperBound": parallelism
                    if vid == counter
                    else req["parallelism"]["upperBound"],
                }
            }
            for vid, req in current.items()
        }
        self.call("PUT", f"/jobs/{job_id}/resource-requirements", body)

    def _counter(self, job_id: str) -> str:
        for name, vid in self.vertices(job_id).items():
            if "counter" in name:
                return vid
        raise KeyError("no counter vertex")

    def counter_parallelism(self, job_id: str) -> int:
        for v in self.job(job_id)["vertices"]:
            if "counter" in v["name"]:
                return int(v["parallelism"])
        raise KeyError("no counter vertex")

    def taskmanagers_of(self, job_id: str) -> dict[str, int]:
        """TaskManager id -> how many counter subtasks it runs."""
        vid = self._counter(job_id)
        data = self.get(f"/jobs/{job_id}/vertices/{vid}/taskmanagers")
        return {
            str(tm["taskmanager-id"]): sum(int(n) for n in tm["status-counts"].values())
            for tm in data["taskmanagers"]
        }
