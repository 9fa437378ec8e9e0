"""Helpers shared by the runtime and controller tests: manifests, worker processes,
and the exactness checks a user would make (state, positions, ownership).

Worker processes are real ``python -m keyshift.runtime`` subprocesses on
loopback; every one is stopped by its PID at the end of its test.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from keyshift.api.names import API_VERSION, worker_name
from keyshift.api.spec import GeneratorSource, StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.api import decode_key
from keyshift.runtime.config import OUTPUT_DIR_ENV
from keyshift.runtime.expected import counter_state_encoded
from keyshift.store import Assignment, RedisStateStore
from keyshift.store.server import free_port

REPO = Path(__file__).resolve().parents[1]


def counter_manifest(
    job: str,
    *,
    key_groups: int,
    parallelism: int,
    store_url: str,
    source: dict[str, Any],
    checkpoint_interval: str = "200ms",
    sink: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": job},
        "spec": {
            "job": "examples.counter:job",
            "keyGroups": key_groups,
            "parallelism": parallelism,
            "source": {"type": "generator", **source},
            "sink": sink or {"type": "null"},
            "stateStore": {"url": store_url},
            "checkpointInterval": checkpoint_interval,
            **spec,
        },
    }


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = directory / f"{manifest['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    StreamJob.model_validate(manifest)  # fail early on a bad test manifest
    return path


class WorkerProcess:
    """One worker subprocess; signals go to its PID only."""

    def __init__(
        self,
        manifest: Path,
        ordinal: int,
        store_url: str,
        log_dir: Path,
        *,
        env: dict[str, str] | None = None,
        http: bool = True,
    ) -> None:
        self.manifest = manifest
        self.ordinal = ordinal
        self.store_url = store_url
        self.log_path = log_dir / f"worker-{ordinal}.log"
        # log sinks' relative paths start in the test's directory, as in a run directory
        self.env = {**os.environ, OUTPUT_DIR_ENV: str(log_dir), **(env or {})}
        self.http_port = free_port() if http else None
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0
        self.self_kills = 0

    def start(self) -> WorkerProcess:
        cmd = [
            sys.executable, "-m", "keyshift.runtime",
            "--manifest", str(self.manifest),
            "--ordinal", str(self.ordinal),
            "--store-url", self.store_url,
        ]  # fmt: skip
        if self.http_port is not None:
            cmd += ["--http-port", str(self.http_port)]
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            self.process = subprocess.Popen(
                cmd, cwd=REPO, stdout=log, stderr=log, env=self.env, start_new_session=True
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def died_by_itself(self) -> bool:
        """True (once) if the process exited without us killing it."""
        if self.process is None or self.process.poll() is None:
            return False
        code = self.process.returncode
        self.process = None
        if code == -signal.SIGKILL:
            self.self_kills += 1
            return True
        raise AssertionError(f"worker {self.ordinal} exited with {code}; log:\n{self.log()}")

    def kill(self) -> None:
        if self.alive:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.kills += 1
        self.process = None

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with_cont = self.process
            os.kill(with_cont.pid, signal.SIGCONT)
            os.kill(with_cont.pid, signal.SIGTERM)
            try:
                with_cont.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(with_cont.pid, signal.SIGKILL)
                with_cont.wait()
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.http_port}{path}", timeout=2)

    def metric(self, name: str) -> float:
        """The value of an unlabelled-by-key-group metric (0 if absent)."""
        return metric_value(f"http://127.0.0.1:{self.http_port}/metrics", name)


def metric_value(metrics_url: str, name: str, *, required: bool = False) -> float:
    """The value of the unlabelled-by-key-group metric ``name`` a worker's ``/metrics``
    serves at ``metrics_url``: 0 if absent, or an AssertionError if ``required``."""
    for line in httpx.get(metrics_url, timeout=5).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    if required:
        raise AssertionError(f"no {name} at {metrics_url}")
    return 0.0


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]],
    seconds: float,
    what: str,
    interval: float = 0.1,
) -> None:
    """Poll a condition (sync or async) until true, or fail naming what was awaited."""
    deadline = time.monotonic() + seconds
    while True:
        result = condition()
        if await result if inspect.isawaitable(result) else result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def deploy(
    store: RedisStateStore,
    job: str,
    key_groups: int,
    parallelism: int,
    manifest: Path,
    store_url: str,
    spawn: Callable[..., WorkerProcess],
) -> tuple[Assignment, list[WorkerProcess]]:
    """Deploy ``job`` by hand: initialise it in the store with ``key_groups``, publish its
    first assignment (generation 1) over ``parallelism`` workers, and spawn those workers.
    Returns that assignment (for the ownership check) and the workers."""
    await store.init_job(job, key_groups)
    assignment = Assignment(1, parallelism, plan_assignment(key_groups, parallelism))
    await store.publish_assignment(job, assignment, expected_generation=0)
    return assignment, [spawn(manifest, ordinal, store_url) for ordinal in range(parallelism)]


async def positions(store: RedisStateStore, job: str, key_groups: int) -> list[int]:
    return [(await store.key_group_info(job, kg)).position for kg in range(key_groups)]


async def all_done(store: RedisStateStore, job: str, key_groups: int, limit: int) -> bool:
    return all(p == limit for p in await positions(store, job, key_groups))


async def assert_exact_counter_state(
    store: RedisStateStore, job: str, source: dict[str, Any], key_groups: int, limit: int
) -> None:
    """The store holds exactly the expected counter state of offsets [0, limit)."""
    spec = GeneratorSource.model_validate({"type": "generator", **source})
    for kg in range(key_groups):
        info = await store.key_group_info(job, kg)
        assert info.position == limit, f"key group {kg} at position {info.position}"
        expected = counter_state_encoded(spec, key_groups, kg, limit)
        for state, values in expected.items():
            stored = {k: v async for k, v in store.scan_all(job, kg, state)}
            if stored != values:
                wrong = sorted(
                    decode_key(k)
                    for k in set(stored) | set(values)
                    if stored.get(k) != values.get(k)
                )
                raise AssertionError(
                    f"key group {kg} state {state!r}: {len(wrong)} keys differ, e.g. {wrong[:5]}"
                )


async def assert_owned_as_assigned(
    store: RedisStateStore, job: str, assignment: Assignment
) -> None:
    """No key group has two writers, none is orphaned: the store's owner of each key
    group is the worker the assignment names, and every worker runs the generation."""
    for kg, owner in enumerate(assignment.owners):
        info = await store.key_group_info(job, kg)
        assert info.owner == worker_name(job, owner), (kg, info.owner, owner)
    acks = await store.worker_generations(job)
    for ordinal in set(assignment.owners):
        assert acks.get(worker_name(job, ordinal)) == assignment.generation, acks


def ready(worker: WorkerProcess) -> bool:
    try:
        return worker.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False
