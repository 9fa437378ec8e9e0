"""``keyshift run``: a StreamJob on this machine.

Starts the embedded store (a Valkey persisting under the run directory),
the local WorkerPool and the controller, and shows a live view. Ctrl-C stops
the workers (each commits its state) and the store; running again resumes from
the committed state. ``keyshift scale`` and ``keyshift status`` talk to a
running job through files of its run directory, ``.keyshift/<job>/``:

| file | written by | content |
|---|---|---|
| ``supervisor.json`` | ``keyshift run`` | its PID and the store URL |
| ``desired.json`` | ``keyshift run`` (the manifest), ``keyshift scale`` | desired parallelism |
| ``status.json`` | ``keyshift run``, every second | the status document |
| ``controller.json`` | the controller | rescale in progress and history |
| ``resume.json`` | ``keyshift resume`` | workers to restart for stopped key groups |
| ``store/`` | the embedded Valkey | its AOF |
| ``logs/`` | the workers | one log per worker |
| a log sink's ``path`` | the workers | the job's outputs |

A ``keyshift scale`` survives a restart while the manifest's parallelism is what it was
when the scale was asked for; ``keyshift run --fresh`` starts the job from nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import psutil
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live

from keyshift.api.names import ordinal_of
from keyshift.api.spec import (
    DuplicateKeyError,
    InvalidSpec,
    LogSink,
    StreamJob,
    parse_yaml,
    validate_spec,
    validation_message,
)
from keyshift.controller.autoscaling.decision import Decision
from keyshift.controller.autoscaling.metrics.base import LoadSample, WorkerTarget
from keyshift.controller.autoscaling.metrics.direct import DirectScrapeProvider
from keyshift.controller.autoscaling.runner import event_kind, history_from
from keyshift.controller.core.loop import ControllerSettings
from keyshift.controller.core.reconcile import Desired
from keyshift.controller.core.records import FileRecordStore
from keyshift.controller.core.status import status_document
from keyshift.controller.local.pool import LocalWorkerPool, pid_alive, stop_pid
from keyshift.controller.local.view import log_line, render
from keyshift.controller.supervisor import (
    ManualRequest,
    Supervisor,
    idle_probe,
    metrics_provider,
)
from keyshift.errors import KeyshiftError
from keyshift.store import StateStore, open_store
from keyshift.store.server import LocalServer

log = logging.getLogger("keyshift.run")

LOCAL_MAX_WORKERS: Final = 64
"""Worker processes ``keyshift run`` starts at most (``--max-workers``): each is a Python
process, and a manifest's parallelism for a cluster would swamp a laptop."""


class JobAlreadyRunning(KeyshiftError, RuntimeError):
    pass


class InvalidManifest(KeyshiftError, ValueError):
    """A manifest ``keyshift run`` refuses before it starts anything (exit code 2)."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{path} is not a valid StreamJob: {message}")
        self.message = message


def check_manifest(
    path: Path, base_dir: Path = Path(".keyshift"), max_workers: int = LOCAL_MAX_WORKERS
) -> StreamJob:
    """The manifest, checked before a local run starts anything; else :class:`InvalidManifest`.

    The spec is checked as the operator checks a StreamJob (its message is the one of the
    ``InvalidSpec`` condition), then what a local run alone can check up front: the entry
    point's module exists (from where the workers import it; nothing of it runs), the
    parallelism fits ``max_workers``, and ``keyGroups`` is the one of the job's last run
    here (the CRD's immutability rule, with its message).
    """
    try:
        raw = parse_yaml(path.read_text())
    except DuplicateKeyError as exc:
        raise InvalidManifest(path, str(exc)) from None
    except yaml.YAMLError as exc:
        raise InvalidManifest(path, f"not YAML: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("spec") or {}, dict):
        raise InvalidManifest(path, "a StreamJob is a mapping: apiVersion, kind, metadata, spec")
    try:
        spec = validate_spec(raw.get("spec") or {})
    except InvalidSpec as invalid:
        raise InvalidManifest(path, str(invalid)) from None
    try:
        manifest = StreamJob.model_validate({**raw, "spec": spec})
    except ValidationError as exc:
        raise InvalidManifest(path, validation_message(exc, prefix="")) from None
    _check_entry_point(path, spec.job)
    scaler = spec.autoscaler
    standby = spec.standby_workers
    for name, wanted in [
        ("parallelism", spec.parallelism),
        ("autoscaler.minParallelism", scaler.min_parallelism if scaler.enabled else 0),
    ]:
        if wanted + standby > max_workers:
            more = f" and {standby} standby workers" if standby else ""
            raise InvalidManifest(path, (
                f"spec.{name} is {wanted}{more}: keyshift run starts at most {max_workers} "
                "worker processes on this machine (--max-workers raises the limit)"
            ))  # fmt: skip
    try:
        last = json.loads(RunDir.of(manifest.name, base_dir).status.read_text())["key_groups"]
    except (OSError, ValueError, KeyError):
        last = None
    if last is not None and last != spec.key_groups:
        raise InvalidManifest(path, key_groups_changed(last, spec.key_groups))
    return manifest


def _check_entry_point(manifest: Path, entry: str) -> None:
    """Find the job's module where the workers will import it from: the current directory,
    the manifest's folder or its parent (see ``LocalWorkerPool``). Nothing of it runs here:
    a missing attribute or an error of the module's own is the workers' to report."""
    from keyshift.controller.local.pool import job_path
    from keyshift.runtime.api import JobLoadError, find_job_module

    try:
        find_job_module(entry, job_path(manifest))
    except JobLoadError as exc:
        raise InvalidManifest(manifest, str(exc)) from None


def key_groups_changed(was: int, now: int) -> str:
    """The CRD's message for a changed ``keyGroups`` (``self == oldSelf``), with the counts."""
    from keyshift.controller.kubernetes.crd import streamjob_crd

    schema = streamjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rule = schema["properties"]["spec"]["properties"]["keyGroups"]["x-kubernetes-validations"][0]
    return f"spec.keyGroups: {rule['message']} (it was {was}, the manifest says {now})"


@dataclass(frozen=True, slots=True)
class RunDir:
    """The files of one locally running job."""

    root: Path

    @classmethod
    def of(cls, job: str, base: Path = Path(".keyshift")) -> RunDir:
        return cls(base / job)

    @property
    def supervisor(self) -> Path:
        return self.root / "supervisor.json"

    @property
    def desired(self) -> Path:
        return self.root / "desired.json"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def controller(self) -> Path:
        return self.root / "controller.json"

    @property
    def autoscaler(self) -> Path:
        return self.root / "autoscaler.json"

    @property
    def prometheus_targets(self) -> Path:
        """The workers' metrics endpoints as a Prometheus ``file_sd_configs`` file."""
        return self.root / "prometheus-targets.json"

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def resume(self) -> Path:
        """``keyshift resume``: the workers to restart, so their stopped key groups
        replay from their last commits with the code as it is now."""
        return self.root / "resume.json"

    @property
    def store_port(self) -> Path:
        return self.root / "store.port"

    def running_pid(self) -> int | None:
        """PID of the ``keyshift run`` of this job, if one is running."""
        try:
            pid = int(json.loads(self.supervisor.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return pid

    def read_desired(self, default: int) -> Desired:
        try:
            data = json.loads(self.desired.read_text())
            return Desired(int(data["parallelism"]), data.get("reason", "manual"))
        except (OSError, ValueError, KeyError):
            return Desired(default, "manual")

    def write_json(self, path: Path, data: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, path)


class LocalRun:
    def __init__(
        self,
        manifest_path: Path,
        *,
        base_dir: Path = Path(".keyshift"),
        store_url: str | None = None,
        fresh: bool = False,
        keep_running: bool = False,
        live: bool | None = None,
        failover_after: float | None = None,
        restart_delay: float = 5.0,
        max_workers: int = LOCAL_MAX_WORKERS,
        console: Console | None = None,
    ) -> None:
        self.manifest_path = manifest_path.resolve()
        self.manifest: StreamJob = check_manifest(manifest_path, base_dir, max_workers)
        self.max_workers = max_workers
        self.job = self.manifest.name
        self.spec = self.manifest.spec
        self.dir = RunDir.of(self.job, base_dir)
        self.outputs = [
            str(self.dir.root / s.path)
            for s in (self.spec.sink, *self.spec.side_outputs.values())
            if isinstance(s, LogSink) and s.path
        ]
        """The log sinks' files (in the run directory), shown in the view."""
        self.external_store_url = store_url
        self.fresh = fresh
        self.keep_running = keep_running
        self._said_finished = False
        self.console = console or Console()
        self.live = self.console.is_terminal if live is None else live
        self.settings = ControllerSettings().for_spec(self.spec, failover_after=failover_after)
        self.restart_delay = restart_delay
        self.events: deque[str] = deque(maxlen=50)
        self.stop_event = asyncio.Event()
        self._targets_written: list[dict[str, Any]] | None = None
        self._last_load: LoadSample | None = None

    def event(self, kind: str, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        self.events.append(line)
        if not self.live:
            print(f"event {kind}: {message}", flush=True)
        log.log(logging.WARNING if kind == "Warning" else logging.INFO, message)

    async def run(self) -> int:
        other = self.dir.running_pid()
        if other is not None and other != os.getpid():
            raise JobAlreadyRunning(
                f"job {self.job!r} is already running here (keyshift run, pid {other}); "
                f"use `keyshift status {self.job}` or `keyshift scale {self.job} N`"
            )
        self.dir.root.mkdir(parents=True, exist_ok=True)
        pool = LocalWorkerPool(
            self.job, self.manifest_path, "", self.dir.root, restart_delay=self.restart_delay
        )
        # an earlier run that was killed may have left workers and its store behind
        stopped = await asyncio.to_thread(pool.stop_leftovers)
        if stopped:
            self.event("Normal", f"stopped {len(stopped)} workers left by an earlier run")
        await asyncio.to_thread(self._stop_leftover_store)
        server = None
        if self.external_store_url:
            url = self.external_store_url
        else:
            server = LocalServer(self.dir.store, port=self._store_port())
            await asyncio.to_thread(server.start)
            self.dir.store_port.write_text(str(server.port))
            url = server.url
        pool.store_url = url
        self.dir.write_json(self.dir.supervisor, {
            "pid": os.getpid(), "store_url": url, "manifest": str(self.manifest_path),
            "store_pid": None if server is None else server.pid, "started_at": time.time(),
        })  # fmt: skip
        if self.spec.state_store.url and not self.external_store_url:
            self.event("Normal", f"the manifest's stateStore.url ({self.spec.state_store.url}) "
                       f"is not used locally: an embedded Valkey in {self.dir.store} keeps the "
                       "state (pass --store-url to use another store)")  # fmt: skip
        if self.outputs:
            self.event("Normal", "outputs go to " + ", ".join(self.outputs))
        store = open_store(url)
        provider = DirectScrapeProvider(window_seconds=10.0)
        try:
            if self.fresh:
                removed = await store.delete_job(self.job)
                for path in (self.dir.controller, self.dir.autoscaler, self.dir.desired):
                    path.unlink(missing_ok=True)
                self.event("Normal", f"--fresh: deleted the job's state ({removed} keys), its "
                           "rescale history and its input clock")  # fmt: skip
            self._start_desired()
            info = await store.init_job(self.job, self.spec.key_groups)
            if info.key_groups != self.spec.key_groups:
                raise InvalidManifest(
                    self.manifest_path, key_groups_changed(info.key_groups, self.spec.key_groups)
                )
            records = FileRecordStore(self.dir.controller, self.job)
            supervisor = self._supervisor(store, pool, records)
            self._install_signals()
            self.event("Normal", f"running {self.job} on store {url}")
            loop_task = asyncio.create_task(supervisor.run(self.stop_event))
            try:
                await self._show(supervisor, pool, provider)
            finally:
                self.stop_event.set()
                await loop_task
                await supervisor.close()
        finally:
            self.event("Normal", "stopping workers (they commit their state)")
            await pool.close()
            await provider.close()
            await store.close()
            if server is not None:
                await asyncio.to_thread(server.stop)
            self._write_stopped_status()
            with contextlib.suppress(FileNotFoundError):
                self.dir.supervisor.unlink()
        return 0

    def _start_desired(self) -> None:
        """The manifest's parallelism, unless ``keyshift scale`` chose another since the
        manifest last said what it says now (then that choice survives the restart)."""
        previous = read_json(self.dir.desired)
        decision = keep_manual_parallelism(previous, self.spec.parallelism)
        if decision is not None:
            self.event("Normal", f"keeping parallelism {decision} set by `keyshift scale` "
                       f"(the manifest says {self.spec.parallelism}; `keyshift scale` or a "
                       "change of the manifest's parallelism replaces it)")  # fmt: skip
            assert previous is not None
            self.dir.write_json(self.dir.desired, previous)
            return
        self.dir.write_json(self.dir.desired, {
            "parallelism": self.spec.parallelism, "reason": "manual",
            "manifest_parallelism": self.spec.parallelism,
        })  # fmt: skip

    def _store_port(self) -> int:
        """The embedded store's port of the last run, if still free: a stable URL."""
        with contextlib.suppress(OSError, ValueError):
            port = int(self.dir.store_port.read_text())
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Valkey binds
                sock.bind(("127.0.0.1", port))
            return port
        return 0

    def _stop_leftover_store(self) -> None:
        """Stop the embedded store of an earlier run of this job that was killed."""
        try:
            pid = int(json.loads(self.dir.supervisor.read_text())["store_pid"])
            # Valkey rewrites its command line; its working directory is its data directory
            cwd = psutil.Process(pid).cwd()
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            return
        if not pid_alive(pid) or Path(cwd) != self.dir.store.resolve():
            return  # gone, or not our server (the PID was reused)
        stop_pid(pid)
        self.event("Normal", f"stopped the store of an earlier run (pid {pid})")

    def _supervisor(
        self, store: StateStore, pool: LocalWorkerPool, records: FileRecordStore
    ) -> Supervisor:
        """The job's supervisor; ranges follow the live view's load (10 s) while no
        autoscaler window is known."""
        scaler = self.spec.autoscaler
        room = self.max_workers - self.spec.standby_workers
        ceiling = max(1, min(scaler.max_parallelism or self.spec.key_groups, room))
        scaler = scaler.model_copy(update={"max_parallelism": ceiling})  # --max-workers
        history = None
        with contextlib.suppress(OSError, ValueError):
            history = history_from(json.loads(self.dir.autoscaler.read_text()))

        def on_decision(decision: Decision, notable: bool) -> None:
            if notable:
                self.event(event_kind(decision), f"autoscaler ({scaler.mode}): {decision.message}")
            if supervisor.autoscaler is not None:
                self.dir.write_json(self.dir.autoscaler, supervisor.autoscaler.status())

        supervisor = Supervisor(
            self.job, self.spec.key_groups, store, pool, records,
            manual=self._manual, autoscaler=scaler,
            provider=metrics_provider(scaler) if scaler.enabled else None,
            history=history, on_decision=on_decision,
            settings=self.settings,
            on_event=self.event, fallback_load=lambda: self._last_load,
            idle_probe=idle_probe(store, self.job, self.spec),
        )  # fmt: skip
        return supervisor

    def _manual(self) -> ManualRequest:
        """The manifest's parallelism or ``keyshift scale``'s: each request is stamped."""
        asked = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            asked = json.loads(self.dir.desired.read_text()).get("requested_at")
        return ManualRequest(self.dir.read_desired(self.spec.parallelism), asked)

    def _write_targets(self, targets: list[WorkerTarget]) -> None:
        """Keep the file-SD file current, so a local Prometheus scrapes every worker."""
        doc = file_sd_targets(targets)
        if doc != self._targets_written:
            self.dir.write_json(self.dir.prometheus_targets, doc)
            self._targets_written = doc

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_event.set)

    async def _status(
        self, supervisor: Supervisor, pool: LocalWorkerPool, provider: DirectScrapeProvider
    ) -> dict[str, Any]:
        workers = await pool.workers()
        targets = [
            WorkerTarget(w.ordinal, w.name, w.metrics_url)
            for w in workers.values()
            if w.metrics_url
        ]
        load = await provider.collect(self.job, targets) if targets else None
        self._last_load = load
        self._write_targets(targets)
        controller = supervisor.controller
        record = controller.executor.record
        doc = status_document(
            self.job, self.spec.key_groups, controller.assignment,
            supervisor.desired().parallelism, workers, load,
            record.current, record.history, running=True, at=time.time(),
        )  # fmt: skip
        if supervisor.autoscaler is not None:
            doc["autoscaler"] = supervisor.autoscaler.status()
        doc["max_workers"] = self.max_workers  # for keyshift scale
        doc["outputs"] = self.outputs
        self.dir.write_json(self.dir.status, doc)
        await self._resume_if_asked(pool)
        return doc

    async def _resume_if_asked(self, pool: LocalWorkerPool) -> None:
        """Restart the workers ``keyshift resume`` names: each claims its key groups
        again, and the stopped ones replay from their last commits."""
        try:
            asked = json.loads(self.dir.resume.read_text())
        except (OSError, ValueError):
            return
        self.dir.resume.unlink(missing_ok=True)
        for name, key_groups in sorted((asked.get("workers") or {}).items()):
            ordinal = ordinal_of(self.job, name)
            if ordinal is None:
                continue
            await pool.stop([ordinal])
            await pool.start([ordinal])
            groups = ", ".join(str(kg) for kg in key_groups)
            self.event("Normal", f"resume: restarted {name}; key group(s) {groups} replay "
                       "from their last commit")  # fmt: skip

    async def _show(
        self, supervisor: Supervisor, pool: LocalWorkerPool, provider: DirectScrapeProvider
    ) -> None:
        if self.live:
            with Live(console=self.console, refresh_per_second=4, screen=False) as live:
                while not self.stop_event.is_set():
                    doc = await self._status(supervisor, pool, provider)
                    self._stop_if_finished(doc)
                    live.update(render(doc, list(self.events)))
                    await self._wait(self.settings.status_seconds)
        else:
            while not self.stop_event.is_set():
                doc = await self._status(supervisor, pool, provider)
                self._stop_if_finished(doc)
                print(log_line(doc), flush=True)
                await self._wait(self.settings.status_seconds)

    def _stop_if_finished(self, doc: dict[str, Any]) -> None:
        """A bounded job whose every key group is done ends the run, unless kept running."""
        if not doc["finished"] or doc["rescale_in_progress"] or self.stop_event.is_set():
            return
        if self.keep_running:
            if not self._said_finished:
                self.event("Normal", "finished: every key group processed its whole input "
                           "and committed; --keep-running keeps the workers up")  # fmt: skip
                self._said_finished = True
            return
        self.event("Normal", "finished: every key group processed its whole input and "
                   "committed; stopping (--keep-running keeps the workers up)")  # fmt: skip
        self.stop_event.set()

    async def _wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), seconds)

    def _write_stopped_status(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(self.dir.status.read_text())
            doc["running"] = False
            for w in doc["workers"]:
                w.update(ready=False, running=False, pid=None)
            self.dir.write_json(self.dir.status, doc)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def keep_manual_parallelism(previous: dict[str, Any] | None, manifest: int) -> int | None:
    """The parallelism a ``keyshift scale`` chose in an earlier run, if it still stands: the
    manifest's parallelism is what it was when that choice was made (a changed manifest
    wins)."""
    if not previous or previous.get("requested_at") is None:
        return None  # no manual scale since the manifest's value was written
    if previous.get("manifest_parallelism") != manifest:
        return None
    try:
        return int(previous["parallelism"])
    except (KeyError, TypeError, ValueError):
        return None


def file_sd_targets(targets: list[WorkerTarget]) -> list[dict[str, Any]]:
    """Prometheus file service discovery entries for the workers' ``/metrics``."""
    hosts = sorted(urlsplit(t.metrics_url).netloc for t in targets)
    return [{"targets": hosts, "labels": {"keyshift_local": "true"}}] if hosts else []


def run_local(manifest: Path, **kwargs: Any) -> int:
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    return asyncio.run(LocalRun(manifest, **kwargs).run())
