"""Soak: a local job under a varying load, the autoscaler and a fault every 20 s.

    python -m benchmarks.soak --minutes 3     # the CI short form (~4-5 min in all)
    python -m benchmarks.soak --minutes 60    # the long run

The job runs as a user runs it: ``keyshift run MANIFEST --store-url URL`` (a
subprocess: the supervisor with its controller, rescale executor, autoscaler and
worker processes) against a Valkey this benchmark starts. The job is
``examples/busy_counter.py``: the counter of ``examples/counter.py`` (same state,
same exact expected state) with ~250 us of CPU per record, so that a load of a few
thousand records per second moves the autoscaler (``--job examples.counter:job``
runs the plain counter). It starts with four workers; the generator's rate is a
sine (``--rate`` +/- ``--amplitude`` records/s, period ``--period``) with a
``limit``, so the input ends after about ``minutes - 30 s`` and the final state is
known exactly. The autoscaler is on (1..4, short windows).

Every ``--fault-every`` seconds, in turn: ``keyshift scale JOB N --wait`` to a
parallelism other than the current one (1..4), then ``--kills-per-rescale`` (1)
SIGKILLs, each of a random running worker (its PID from ``keyshift status --json``;
the supervisor restarts it). No fault in the input's last 10 s.

Sampled every second: the status document (``status.json`` of the run directory,
which is what ``keyshift status --json`` prints: processed/input rate, lag,
parallelism, worker PIDs), the committed positions (store), each worker's RSS
(``/proc/PID/status``), the supervisor's RSS, the store's ``used_memory``, and the
controller record's history (merged by id: it keeps the last 50 rescales only).

Checks (exit code 1 if one fails), once every key group's position is ``limit``:

- exact state: every key of every key group equals the expected counter state
  (``state_mismatches`` = keys that differ, must be 0); ``lost_records`` =
  ``key_groups * limit`` - the sum of the positions, must be 0;
- ownership: every key group's store owner is the assignment's, every owner acks it;
- no rescale failed; ``keyshift run`` exits 0 on Ctrl-C;
- memory: max worker RSS <= ``cacheBytes`` + ``--overhead-mib``; and no growth:
  the median of the per-second max worker RSS over the last quarter of the run is at
  most 1.2 x its median over the second quarter (the first is warm-up: caches fill);
- at least one kill and one manual rescale happened.

Pauses: each rescale's ``max_pause_seconds`` (controller record: a moved key group's
release to its claim) and, per kill, the time from the SIGKILL until every key group
of the killed worker has committed progress again (store positions, polled every
100 ms): the pause a failover really costs.

Output: ``benchmarks/results/soak_<minutes>m.json``, ``benchmarks/soak_<minutes>m.png``
and the "Soak" section of ``benchmarks/RESULTS.md`` (one row per saved run);
``--minutes M --replot`` redraws the plot and the section from the saved JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks.results_md import replace_section
from keyshift.api.names import API_VERSION
from keyshift.api.spec import GeneratorSource
from keyshift.runtime.expected import counter_state_encoded
from keyshift.runtime.sources.generator import cumulative
from keyshift.store import keys as store_keys
from keyshift.store import open_store
from keyshift.store.server import LocalServer, wait_until
from tests.controller.local.localjob import LocalJob
from tests.support import assert_owned_as_assigned

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
JOB = "soak"
MIB = 1024 * 1024
MAX_PARALLELISM = 4
TAIL_SECONDS = 30.0
"""The input ends this long before ``--minutes``: the rest is drain and checks."""
QUIET_BEFORE_END = 10.0
"""No fault in the input's last seconds."""
RSS_GROWTH_LIMIT = 1.2
MACHINE_PAUSE_SECONDS = 1.0
PLANNED = ("manual", "autoscaler", "rebalance")

T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


@dataclass
class SoakConfig:
    minutes: float = 3.0
    key_groups: int = 16
    keys: int = 200_000
    rate: float = 1200.0
    amplitude: float = 1000.0
    period: float = 60.0
    cache_mib: int = 8
    overhead_mib: float = 100.0
    """Worker RSS allowed on top of the cache bound: a fresh worker (interpreter, imports,
    buffers) measured ~55 MiB on CPython 3.11; about twice that."""
    fault_every: float = 20.0
    kills_per_rescale: int = 1
    """Faults come as this many worker kills, then one manual rescale, and again."""
    checkpoint_ms: int = 200
    seed: int = 11
    job: str = "examples.busy_counter:job"

    @property
    def input_seconds(self) -> float:
        return max(30.0, self.minutes * 60 - TAIL_SECONDS)

    def source(self) -> dict[str, Any]:
        rate = {"shape": "sine", "recordsPerSecond": self.rate,
                "amplitude": self.amplitude, "period": self.period}  # fmt: skip
        spec = GeneratorSource.model_validate({"type": "generator", "rate": rate})
        limit = int(cumulative(spec.rate, self.input_seconds) // self.key_groups)
        return {"seed": self.seed, "keys": self.keys, "distribution": "uniform",
                "limit": limit, "rate": rate}  # fmt: skip

    def manifest(self, store_url: str) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "StreamJob",
            "metadata": {"name": JOB},
            "spec": {
                "job": self.job,
                "keyGroups": self.key_groups,
                "parallelism": MAX_PARALLELISM,
                "source": {"type": "generator", **self.source()},
                "sink": {"type": "null"},
                "stateStore": {"url": store_url, "cacheBytes": self.cache_mib * MIB},
                "checkpointInterval": f"{self.checkpoint_ms}ms",
                "failoverAfter": "2s",
                "autoscaler": {
                    "enabled": True,
                    "minParallelism": 1,
                    "maxParallelism": MAX_PARALLELISM,
                    "metricsWindowSeconds": 10,
                    "intervalSeconds": 5,
                    "cooldownSeconds": 10,
                    "scaleDownStabilizationSeconds": 20,
                    "catchUpSeconds": 30,
                },
            },
        }


@dataclass
class Sample:
    t: float
    """Seconds since the job was created (the generator's clock)."""
    parallelism: int
    rescaling: bool
    processed_rate: float | None
    input_rate: float | None
    lag: float | None
    committed: int
    """Sum of the key groups' committed positions."""
    worker_rss_mib: dict[int, float]
    supervisor_rss_mib: float | None
    store_used_mib: float | None
    store_rss_mib: float | None
    monotonic: float = 0.0
    """``time.monotonic()`` when ``t`` was read: a pause of the machine shows as a jump
    of ``t`` (the wall clock) that the monotonic clock does not have."""


@dataclass
class Fault:
    t: float
    kind: str
    """``rescale`` or ``kill``."""
    detail: dict[str, Any] = field(default_factory=dict)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data


class Sampler(threading.Thread):
    """Once a second: status, positions, memory; merges the controller's history."""

    def __init__(
        self, job: LocalJob, store_url: str, key_groups: int, t0: float, limit: int
    ) -> None:
        super().__init__(daemon=True)
        self.job = job
        self.client = redis.Redis.from_url(store_url, socket_timeout=5)
        self.metas = [store_keys.meta(JOB, kg) for kg in range(key_groups)]
        self.t0 = t0
        self.samples: list[Sample] = []
        self.rescales: dict[str, dict[str, Any]] = {}
        self.limit = limit
        self.finished_at: dict[int, float] = {}
        """Key group -> Unix time it was first seen at ``limit`` (its input done)."""
        self.lifetimes: dict[int, tuple[float, float]] = {}
        """Worker PID -> (first, last) time it was sampled."""
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def positions(self) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for meta in self.metas:
            pipe.hget(meta, "position")
        return [int(p or 0) for p in pipe.execute()]

    def committed(self) -> int:
        positions = self.positions()
        for kg, position in enumerate(positions):
            if position >= self.limit:
                self.finished_at.setdefault(kg, time.time())
        return sum(positions)

    def merge_history(self) -> None:
        record = read_json(self.job.run_dir / "controller.json")
        for r in record.get("history", []):
            self.rescales[r["id"]] = r

    def sample(self) -> None:
        status = read_json(self.job.run_dir / "status.json")
        workers = {
            int(w["ordinal"]): int(w["pid"]) for w in status.get("workers", []) if w.get("pid")
        }
        rss = {o: m for o, pid in workers.items() if (m := rss_mib(pid)) is not None}
        now = time.time() - self.t0
        for o in rss:
            first, _ = self.lifetimes.get(workers[o], (now, now))
            self.lifetimes[workers[o]] = (first, now)
        memory: Any = self.client.info("memory")
        rates = status.get("rates") or {}
        supervisor = self.job.process
        self.samples.append(
            Sample(
                t=round(time.time() - self.t0, 2),
                parallelism=int(status.get("parallelism") or 0),
                rescaling=status.get("rescale_in_progress") is not None,
                processed_rate=rates.get("processed"),
                input_rate=rates.get("input"),
                lag=status.get("lag"),
                committed=self.committed(),
                worker_rss_mib=rss,
                supervisor_rss_mib=None if supervisor is None else rss_mib(supervisor.pid),
                store_used_mib=int(memory["used_memory"]) / MIB,
                store_rss_mib=int(memory["used_memory_rss"]) / MIB,
                monotonic=round(time.monotonic(), 2),
            )
        )
        self.merge_history()

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                started = time.monotonic()
                self.sample()
                self.stop_event.wait(max(0.0, 1.0 - (time.monotonic() - started)))
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)
        self.merge_history()
        self.client.close()
        if self.error is not None:
            raise RuntimeError(f"the sampler failed: {self.error!r}") from self.error


# -- faults ----------------------------------------------------------------------------


def manual_rescale(job: LocalJob, rng: random.Random) -> dict[str, Any]:
    current = int(read_json(job.run_dir / "status.json")["parallelism"])
    target = rng.choice([n for n in range(1, MAX_PARALLELISM + 1) if n != current])
    started = time.monotonic()
    result = job.cli("scale", JOB, str(target), "--wait", "--timeout", "60", timeout=90)
    waited = time.monotonic() - started
    # exit 1 after the timeout: the autoscaler chose another parallelism meanwhile
    return {"from": current, "to": target, "exit_code": result.returncode,
            "wait_seconds": round(waited, 3)}  # fmt: skip


def kill_worker(job: LocalJob, sampler: Sampler, rng: random.Random, limit: int) -> dict[str, Any]:
    for _ in range(5):  # the status is up to a second old: its PID may have exited since
        status = job.status()  # keyshift status --json
        running = [w for w in status["workers"] if w.get("pid") and w.get("running")]
        owning = [w for w in running if w.get("key_groups")]  # not one a rescale is stopping
        running = owning or running
        if not running:
            return {"skipped": "no running worker"}
        victim = rng.choice(running)
        groups = [int(kg) for kg in victim["key_groups"]]
        before = sampler.positions()
        killed_at = time.monotonic()
        try:
            os.kill(int(victim["pid"]), signal.SIGKILL)
            break
        except ProcessLookupError:
            time.sleep(0.5)  # a new status document, not synchronisation
    else:
        return {"skipped": "every chosen worker had exited already"}
    waiting = {kg for kg in groups if before[kg] < limit}
    if not waiting:
        return {"ordinal": victim["ordinal"], "pid": victim["pid"], "key_groups": groups,
                "pause_seconds": None,
                "note": "input done" if groups else "owned no key group"}  # fmt: skip
    pause: float | None = None
    deadline = killed_at + 90
    while waiting and time.monotonic() < deadline:
        time.sleep(0.1)
        now = sampler.positions()
        waiting = {kg for kg in waiting if now[kg] <= before[kg]}
    if not waiting:
        pause = time.monotonic() - killed_at
    return {"ordinal": victim["ordinal"], "pid": victim["pid"], "key_groups": groups,
            "pause_seconds": None if pause is None else round(pause, 3),
            "unresumed": sorted(waiting)}  # fmt: skip


# -- checks ------------------------------------------------------------------------------


async def count_mismatches(url: str, source: dict[str, Any], key_groups: int, limit: int) -> int:
    spec = GeneratorSource.model_validate({"type": "generator", **source})
    store = open_store(url)
    wrong = 0
    try:
        for kg in range(key_groups):
            for state, values in counter_state_encoded(spec, key_groups, kg, limit).items():
                stored = {k: v async for k, v in store.scan_all(JOB, kg, state)}
                wrong += sum(1 for k in set(stored) | set(values) if stored.get(k) != values.get(k))
    finally:
        await store.close()
    return wrong


async def job_created_at(url: str) -> float:
    store = open_store(url)
    try:
        info = await store.job_info(JOB)
    finally:
        await store.close()
    assert info is not None, "the job is running, its record must exist"
    return info.created_at


async def ownership_problem(url: str) -> str | None:
    store = open_store(url)
    try:
        assignment = await store.get_assignment(JOB)
        if assignment is None:
            return "no assignment"
        await assert_owned_as_assigned(store, JOB, assignment)
    except AssertionError as exc:
        return f"{exc}"
    finally:
        await store.close()
    return None


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def machine_pauses(
    samples: list[tuple[float, float]], threshold: float = MACHINE_PAUSE_SECONDS
) -> list[dict[str, float]]:
    """``(wall, monotonic)`` clock pairs: where the wall clock ran ahead of the monotonic
    one by more than ``threshold`` between two samples.

    A virtual machine paused (snapshotted) stops every process and the monotonic
    clock; on resume the wall clock is set forward.  Everything then looks stalled for
    that long, in wall-clock figures only.
    """
    pauses = []
    for (w0, m0), (w1, m1) in itertools.pairwise(samples):
        jump = (w1 - w0) - (m1 - m0)
        if jump > threshold:
            pauses.append({"t": round(w0, 2), "seconds": round(jump, 2)})
    return pauses


def rss_trend(series: list[tuple[float, float]]) -> dict[str, Any]:
    """``(t, MiB)`` samples: median of the second quarter against the last one."""
    if len(series) < 8:
        return {"ok": False, "reason": "too few samples"}
    end = series[-1][0]
    q2 = [m for t, m in series if end / 4 <= t < end / 2]
    q4 = [m for t, m in series if t >= end * 3 / 4]
    a, b = median(q2), median(q4)
    ok = a is not None and b is not None and b <= a * RSS_GROWTH_LIMIT
    return {"second_quarter_median_mib": a, "last_quarter_median_mib": b,
            "ratio": None if not a or b is None else round(b / a, 3), "ok": ok}  # fmt: skip


# -- the run -----------------------------------------------------------------------------


def run_soak(config: SoakConfig, workdir: Path) -> dict[str, Any]:
    """Run the soak in ``workdir``; the result document (its ``checks`` say pass/fail)."""
    rng = random.Random(config.seed)
    source = config.source()
    limit = int(source["limit"])
    server = LocalServer(workdir / "valkey").start()
    job: LocalJob | None = None
    sampler: Sampler | None = None
    faults: list[Fault] = []
    exit_code: int | None = None
    try:
        manifest = workdir / f"{JOB}.yaml"
        manifest.write_text(json.dumps(config.manifest(server.url), indent=2))  # JSON is YAML
        job = LocalJob(workdir, manifest, JOB, extra_args=("--store-url", server.url))
        say(f"keyshift run {manifest.name} --store-url {server.url}; limit {limit:,}/key group")
        job.start(timeout=60)
        job.wait_status(
            lambda s: s["parallelism"] == MAX_PARALLELISM
            and s["rescale_in_progress"] is None
            and sum(1 for w in s["workers"] if w["ready"]) == MAX_PARALLELISM,
            90, "four ready workers",
        )  # fmt: skip
        t0 = asyncio.run(job_created_at(server.url))  # the generator's clock starts here
        started = time.monotonic() - (time.time() - t0)
        sampler = Sampler(job, server.url, config.key_groups, t0, limit)
        sampler.start()
        say(f"running with {MAX_PARALLELISM} workers; a fault every {config.fault_every:.0f}s")

        last_fault = config.input_seconds - QUIET_BEFORE_END
        n = 1
        while n * config.fault_every <= last_fault:
            at = started + n * config.fault_every
            time.sleep(max(0.0, at - time.monotonic()))  # pacing the schedule, not syncing
            if time.monotonic() - started > last_fault + 1.0:
                break  # a slow fault (a rescale waits up to 60 s) ate the rest
            job._alive()
            kind = "rescale" if n % (config.kills_per_rescale + 1) == 1 else "kill"
            t = time.time() - t0
            if kind == "rescale":
                detail = manual_rescale(job, rng)
            else:
                detail = kill_worker(job, sampler, rng, limit)
            faults.append(Fault(round(t, 2), kind, detail))
            say(f"{kind}: {detail}")
            n += 1

        say("faults done; waiting for every key group to reach its limit")
        drain = max(180.0, config.minutes * 60)
        wait_until(lambda: job is not None and job._alive() and sampler is not None
                   and sampler.positions() == [limit] * config.key_groups,
                   drain, "every key group at its limit", interval=0.5)  # fmt: skip
        input_done = time.time() - t0
        say(f"input processed at t={input_done:.0f}s; settling for the checks")
        problem: list[str | None] = ["not checked"]

        def settled() -> bool:
            assert job is not None
            status = job.status()
            if status["rescale_in_progress"] is not None:
                return False
            problem[0] = asyncio.run(ownership_problem(server.url))
            return problem[0] is None

        with contextlib.suppress(TimeoutError):
            wait_until(settled, 90, "a settled assignment", interval=1.0)
        positions = sampler.positions()
        sampler.stop()
        say("counting state mismatches")
        mismatches = asyncio.run(count_mismatches(server.url, source, config.key_groups, limit))
        exit_code = job.interrupt(timeout=120)
        job = None
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop_event.set()
        if job is not None:
            job.close()
        server.stop()

    return summarize(config, limit, sampler, faults, positions, mismatches, problem[0],
                     exit_code, input_done)  # fmt: skip


def summarize(
    config: SoakConfig,
    limit: int,
    sampler: Sampler,
    faults: list[Fault],
    positions: list[int],
    mismatches: int,
    ownership: str | None,
    exit_code: int | None,
    input_done: float,
) -> dict[str, Any]:
    samples = sampler.samples
    rescales = sorted(sampler.rescales.values(), key=lambda r: r["started_at"])
    for r in rescales:
        r["t"] = round(r["started_at"] - sampler.t0, 2)
        before = r.get("from_owners") or []  # empty for the initial assignment
        moved = [kg for kg, b in enumerate(r["to_owners"])
                 if kg >= len(before) or before[kg] != b]  # fmt: skip
        # a forced claim's "pause" runs from the last commit: after a key group's input
        # ended that is no pause at all
        r["input_done"] = bool(moved) and all(
            sampler.finished_at.get(kg, math.inf) < r["started_at"] for kg in moved
        )
    observed = rescales
    reasons = Counter(r["reason"] for r in observed)
    outcomes = Counter(r["outcome"] for r in observed)
    kills = [f for f in faults if f.kind == "kill" and "skipped" not in f.detail]
    manual = [f for f in faults if f.kind == "rescale"]
    rescale_pauses = [
        r["max_pause_seconds"]
        for r in observed
        if r.get("max_pause_seconds") and not r["input_done"]
    ]
    kill_pauses = [f.detail["pause_seconds"] for f in kills if f.detail.get("pause_seconds")]
    worker_rss = [m for s in samples for m in s.worker_rss_mib.values()]
    store_used = [s.store_used_mib for s in samples if s.store_used_mib is not None]
    supervisor = [s.supervisor_rss_mib for s in samples if s.supervisor_rss_mib is not None]
    expected = config.key_groups * limit
    processed = sum(positions)
    bound = config.cache_mib + config.overhead_mib
    max_rss = max(worker_rss, default=0.0)
    trend = rss_trend([(s.t, max(s.worker_rss_mib.values())) for s in samples if s.worker_rss_mib])
    supervisor_trend = rss_trend(
        [(s.t, s.supervisor_rss_mib) for s in samples if s.supervisor_rss_mib is not None]
    )
    lifetimes = [last - first for first, last in sampler.lifetimes.values()]
    early = [m for s in samples[:10] for m in s.worker_rss_mib.values()]
    paused = machine_pauses([(s.t, s.monotonic) for s in samples if s.monotonic])
    checks = {
        "state_mismatches_zero": mismatches == 0,
        "lost_records_zero": expected - processed == 0,
        "owned_as_assigned": ownership is None,
        "no_failed_rescale": outcomes.get("failed", 0) == 0,
        "clean_exit": exit_code == 0,
        "worker_rss_bounded": 0 < max_rss <= bound,
        "worker_rss_not_growing": bool(trend["ok"]),
        "supervisor_rss_not_growing": bool(supervisor_trend["ok"]),
        "faults_happened": len(kills) >= 1 and len(manual) >= 1,
        "unresumed_after_kill_none": all(not f.detail.get("unresumed") for f in kills),
    }
    return {
        "config": asdict(config) | {"input_seconds": config.input_seconds, "limit": limit},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "duration_seconds": round(samples[-1].t if samples else 0.0, 1),
        "input_done_seconds": round(input_done, 1),
        "faults": len(kills) + len(manual),
        "kills": len(kills),
        "manual_rescales": len(manual),
        "manual_rescales_reached": sum(1 for f in manual if f.detail["exit_code"] == 0),
        "rescales_by_reason": dict(reasons),
        "rescale_outcomes": dict(outcomes),
        "records_expected": expected,
        "records_processed": processed,
        "lost_records": expected - processed,
        "state_mismatches": mismatches,
        "ownership_problem": ownership,
        "exit_code": exit_code,
        "longest_rescale_pause_seconds": max(rescale_pauses, default=None),
        "longest_kill_pause_seconds": max(kill_pauses, default=None),
        "median_kill_pause_seconds": median(kill_pauses),
        "longest_pause_seconds": max(rescale_pauses + kill_pauses, default=None),
        "worker_rss_start_mib": round(max(early, default=0.0), 1),
        "max_worker_rss_mib": round(max_rss, 1),
        "worker_rss_bound_mib": bound,
        "worker_rss_trend": trend,
        "max_supervisor_rss_mib": round(max(supervisor, default=0.0), 1),
        "supervisor_rss_trend": supervisor_trend,
        "worker_processes": len(lifetimes),
        "longest_worker_lifetime_seconds": round(max(lifetimes, default=0.0), 1),
        "machine_pauses": paused,
        "store_used_memory_mib": {
            "max": round(max(store_used, default=0.0), 1),
            "final": round(store_used[-1], 1) if store_used else None,
        },
        "checks": checks,
        "ok": all(checks.values()),
        "fault_log": [asdict(f) for f in faults],
        "rescales": [
            {
                k: r.get(k)
                for k in (
                    "t",
                    "reason",
                    "from_parallelism",
                    "to_parallelism",
                    "outcome",
                    "moved_key_groups",
                    "max_pause_seconds",
                    "input_done",
                )
            }
            | {
                "duration_seconds": None
                if r.get("finished_at") is None
                else round(r["finished_at"] - r["started_at"], 3)
            }
            for r in observed
        ],
        "samples": [asdict(s) for s in samples],
    }


# -- reporting ---------------------------------------------------------------------------


def summary_lines(result: dict[str, Any]) -> list[str]:
    r = result
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["rescales_by_reason"].items()))
    trend = r["worker_rss_trend"]
    failed = [k for k, v in r["checks"].items() if not v]
    paused = r.get("machine_pauses") or []

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} s"

    return [
        f"soak {r['config']['minutes']:g} min ({r['duration_seconds']:.0f} s sampled): "
        + ("all checks passed" if r["ok"] else f"FAILED: {', '.join(failed)}"),
        f"faults survived: {r['faults']} ({r['kills']} kills, {r['manual_rescales']} manual "
        f"rescales, {r['manual_rescales_reached']} reached before the autoscaler moved)",
        f"rescales by reason: {reasons}; outcomes: {r['rescale_outcomes']}",
        f"records processed: {r['records_processed']:,} of {r['records_expected']:,}; "
        f"lost records: {r['lost_records']}; state mismatches: {r['state_mismatches']}",
        f"longest pause: {s(r['longest_pause_seconds'])} (rescale release->claim "
        f"{s(r['longest_rescale_pause_seconds'])}; kill->resumed longest "
        f"{s(r['longest_kill_pause_seconds'])}, median {s(r['median_kill_pause_seconds'])})",
        f"worker RSS: max {r['max_worker_rss_mib']:.0f} MiB (bound {r['worker_rss_bound_mib']:.0f}"
        f" = cache {r['config']['cache_mib']} + overhead {r['config']['overhead_mib']:.0f}; "
        f"at start {r['worker_rss_start_mib']:.0f}); trend Q2 "
        f"{trend.get('second_quarter_median_mib') or 0:.0f} -> Q4 "
        f"{trend.get('last_quarter_median_mib') or 0:.0f} MiB (ratio {trend.get('ratio')})",
        f"store used_memory: max {r['store_used_memory_mib']['max']:.0f} MiB, final "
        f"{r['store_used_memory_mib']['final']:.0f} MiB; supervisor RSS max "
        f"{r['max_supervisor_rss_mib']:.0f} MiB (trend ratio "
        f"{(r.get('supervisor_rss_trend') or {}).get('ratio')})",
        f"worker processes: {r.get('worker_processes', '?')}, the longest-lived sampled for "
        f"{r.get('longest_worker_lifetime_seconds', '?')} s",
        "machine paused (wall clock ahead of the monotonic clock): "
        + (", ".join(f"{p['seconds']:.1f} s at t={p['t']:.0f}" for p in paused) or "never"),
    ]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    t = [s["t"] for s in samples]
    fig, (ax1, ax2, ax3) = plt.subplots(
        3, 1, figsize=(11, 9), sharex=True, gridspec_kw={"height_ratios": [3, 1.3, 2.2]}
    )
    committed = [s["committed"] for s in samples]
    rate = [0.0] + [
        (committed[i] - committed[i - 1]) / max(t[i] - t[i - 1], 1e-3) for i in range(1, len(t))
    ]
    smooth = [statistics.fmean(rate[max(0, i - 4) : i + 1]) for i in range(len(rate))]
    ax1.plot(t, smooth, lw=0.9, color="tab:blue", label="committed records/s (5 s mean)")
    ax1.plot(t, [s["input_rate"] or math.nan for s in samples], lw=0.8, color="tab:gray",
             label="input records/s")  # fmt: skip
    ax1.set_ylabel("records/s")
    par = ax1.twinx()
    par.step(t, [s["parallelism"] for s in samples], where="post", color="tab:green",
             lw=1.5, label="parallelism")  # fmt: skip
    par.set_ylim(0, MAX_PARALLELISM + 0.5)
    par.set_ylabel("parallelism")
    for f in result["fault_log"]:
        color = "tab:red" if f["kind"] == "kill" else "tab:purple"
        ax1.axvline(f["t"], color=color, ls=":", lw=0.9)
    for p in result.get("machine_pauses") or []:
        ax1.axvspan(p["t"], p["t"] + p["seconds"], color="0.85", zorder=0)
    if result.get("machine_pauses"):
        ax1.fill_between([], [], color="0.85", label="machine paused (VM snapshot)")
    ax1.plot([], [], color="tab:red", ls=":", label="SIGKILL")
    ax1.plot([], [], color="tab:purple", ls=":", label="manual rescale")
    lines = ax1.get_legend_handles_labels()
    more = par.get_legend_handles_labels()
    ax1.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right", fontsize=8)
    ax1.set_title(
        f"Soak, {result['config']['minutes']:g} min: {result['kills']} kills, "
        f"{sum(result['rescales_by_reason'].values())} rescales, "
        f"{result['state_mismatches']} state mismatches, {result['lost_records']} lost"
    )
    colors = {"manual": "tab:purple", "autoscaler": "tab:green", "failover": "tab:red",
              "rebalance": "tab:orange", "initial": "tab:gray"}  # fmt: skip
    for reason, color in colors.items():
        pts = [
            (r["t"], r["max_pause_seconds"])
            for r in result["rescales"]
            if r["reason"] == reason and r["max_pause_seconds"] and not r.get("input_done")
        ]
        if pts:
            ax2.scatter(
                *zip(*pts, strict=True), s=14, color=color, label=f"{reason} (release->claim)"
            )
    kills = [(f["t"], f["detail"]["pause_seconds"]) for f in result["fault_log"]
             if f["kind"] == "kill" and f["detail"].get("pause_seconds")]  # fmt: skip
    if kills:
        ax2.scatter(
            *zip(*kills, strict=True), s=22, marker="x", color="black", label="kill -> resumed"
        )
    ax2.set_ylabel("pause (s)")
    ax2.set_ylim(0, 1.7 * max([result["longest_pause_seconds"] or 0.0, 0.5]))
    ax2.legend(loc="upper right", fontsize=7, ncol=3)
    ordinals = sorted({int(o) for s in samples for o in s["worker_rss_mib"]})
    for o in ordinals:
        ax3.plot(t, [s["worker_rss_mib"].get(str(o), s["worker_rss_mib"].get(o, math.nan))
                     for s in samples], lw=0.8, label=f"worker {o} RSS")  # fmt: skip
    ax3.plot(t, [s["store_used_mib"] or math.nan for s in samples], lw=1.2, color="black",
             label="store used_memory")  # fmt: skip
    ax3.axhline(result["worker_rss_bound_mib"], color="tab:red", ls="--", lw=0.8,
                label="worker bound (cache + overhead)")  # fmt: skip
    ax3.set_ylabel("MiB")
    ax3.set_xlabel("seconds")
    ax3.set_ylim(bottom=0)
    ax3.legend(loc="lower right", fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def results_section(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in sorted(results, key=lambda r: r["config"]["minutes"]):
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["rescales_by_reason"].items()))
        planned = [
            x["max_pause_seconds"]
            for x in r["rescales"]
            if x["reason"] in PLANNED and x["max_pause_seconds"] and not x.get("input_done")
        ]
        rows.append(
            f"| {r['config']['minutes']:g} min | {r['kills']} | {r['manual_rescales']} | "
            f"{reasons} | {r['records_processed']:,} | {r['state_mismatches']} | "
            f"{r['lost_records']} | {median(planned) or 0:.2f} / {max(planned, default=0):.2f} s | "
            f"{r['median_kill_pause_seconds'] or 0:.2f} / "
            f"{r['longest_kill_pause_seconds'] or 0:.2f} s | {r['max_worker_rss_mib']:.0f} / "
            f"{r['worker_rss_bound_mib']:.0f} MiB | {r['worker_rss_trend']['ratio']} | "
            f"{r['store_used_memory_mib']['max']:.0f} MiB | {'pass' if r['ok'] else 'FAIL'} |"
        )
    longest = max(results, key=lambda r: r["config"]["minutes"])
    c = longest["config"]
    intro = " ".join([
        "`python -m benchmarks.soak --minutes M` (`--minutes 3` is the CI form, also run by",
        "`tests/faults/test_soak.py`). A local `keyshift run` of `examples/busy_counter.py`",
        "(the counter's state, ~250 us of CPU per record),",
        f"{c['key_groups']} key groups, {c['keys']:,} keys, starting with 4 workers; sine input",
        f"{c['rate']:g} +/- {c['amplitude']:g} records/s (period {c['period']:g} s) ending",
        f"{TAIL_SECONDS:.0f} s before the end; the autoscaler on (1..4); every",
        f"{c['fault_every']:g} s alternately `keyshift scale` to another parallelism or a",
        f"SIGKILL of a random worker; `cacheBytes` {c['cache_mib']} MiB, `failoverAfter: 2s`.",
        "Pauses: planned rescale (manual, autoscaler, rebalance) = the controller's",
        "`max_pause_seconds` (release -> claim); kill =",
        "SIGKILL until each of the worker's key groups commits progress again. RSS trend =",
        "median of the per-second max worker RSS, last quarter / second quarter (must be",
        f"<= {RSS_GROWTH_LIMIT}); the RSS bound is `cacheBytes` + {c['overhead_mib']:.0f} MiB.",
    ])  # fmt: skip
    return "\n".join([
        intro,
        "",
        "| run | kills | manual rescales | rescales by reason | records | state mismatches "
        "| lost | planned rescale pause median / longest | kill pause median / longest "
        "| max worker RSS / bound "
        "| RSS trend | store used_memory | checks |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"![soak](soak_{c['minutes']:g}m.png)",
        "",
        f"Machine: {longest['machine']['cpus']} CPUs, shared with other benchmarks.",
    ])  # fmt: skip


def to_json(result: dict[str, Any]) -> str:
    """Indented, except one line per sample (an hour is 3,600 of them)."""
    head = json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1)
    samples = ",\n".join(json.dumps(s, separators=(",", ":")) for s in result["samples"])
    return head[:-2] + ',\n "samples": [\n' + samples + "\n ]\n}\n"


def write_section() -> None:
    saved = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("soak_*m.json"))]
    replace_section("Soak", results_section(saved))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=SoakConfig.rate)
    parser.add_argument("--amplitude", type=float, default=SoakConfig.amplitude)
    parser.add_argument("--period", type=float, default=SoakConfig.period)
    parser.add_argument("--keys", type=int, default=SoakConfig.keys)
    parser.add_argument("--cache-mib", type=int, default=SoakConfig.cache_mib)
    parser.add_argument("--overhead-mib", type=float, default=SoakConfig.overhead_mib)
    parser.add_argument("--fault-every", type=float, default=SoakConfig.fault_every)
    parser.add_argument("--kills-per-rescale", type=int, default=SoakConfig.kills_per_rescale,
                        help="kills between two manual rescales (the one-hour run: 2)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    parser.add_argument("--job", default=SoakConfig.job)
    parser.add_argument("--workdir", type=Path, help="default: a temporary directory")
    parser.add_argument("--no-results-md", action="store_true", help="leave RESULTS.md alone")
    parser.add_argument("--replot", action="store_true",
                        help="redraw the plot and the section from the saved JSON")  # fmt: skip
    args = parser.parse_args(argv)
    name = f"soak_{args.minutes:g}m"
    if args.replot:
        result = json.loads((RESULTS / f"{name}.json").read_text())
        plot(result, HERE / f"{name}.png")
        print("\n".join(summary_lines(result)))
        if not args.no_results_md:
            write_section()
        return 0 if result["ok"] else 1
    config = SoakConfig(
        minutes=args.minutes, rate=args.rate, amplitude=args.amplitude, period=args.period,
        keys=args.keys, cache_mib=args.cache_mib, overhead_mib=args.overhead_mib,
        fault_every=args.fault_every, kills_per_rescale=args.kills_per_rescale,
        seed=args.seed, job=args.job,
    )  # fmt: skip
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="keyshift-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = run_soak(config, workdir)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(to_json(result))
    plot(result, HERE / f"{name}.png")
    for line in summary_lines(result):
        print(line)
    print(f"wrote benchmarks/results/{name}.json and benchmarks/{name}.png")
    if not args.no_results_md:
        write_section()
    if result["ok"] and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"run directory kept: {workdir}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
