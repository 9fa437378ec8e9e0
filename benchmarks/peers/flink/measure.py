"""The comparison workload on Flink: rescale, failover and throughput runs.

One state size at a time (``run_size``): a session cluster with the default
scheduler starts, the job preloads every key once then runs at a steady rate
at parallelism 2; each savepoint mode rescales 2 -> 4 and 4 -> 2 (stop with a
savepoint in that format, resubmit at the new parallelism from it); for the
adaptive scheduler the job is moved (native savepoint) to a second cluster
started with ``jobmanager.scheduler: adaptive`` and rescaled by changing its
resource requirements over REST. After a 2 -> 4 rescale of the last mode, one
TaskManager that runs counter subtasks is SIGKILLed and the job recovers from
its latest checkpoint on the remaining and spare slots (3 TaskManagers x 2
slots: one spare, as a restarted pod would give). Every figure comes from the
job's own output files (``KeyedCounter.java``).
"""

from __future__ import annotations

import bisect
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks.peers.flink.peer import MAX_PARALLELISM, Cluster, Setup, log, setup
from benchmarks.peers.pauses import failover_row, moved, pauses, rescale_row

SAVEPOINT_MODES = {"canonical": "CANONICAL", "native": "NATIVE"}
MODES = ("canonical", "native", "adaptive")
SETTLE_SECONDS = 4.0
POLL_SECONDS = 0.1


# -- the job's output -------------------------------------------------------------------


def parse_lines(text: str, key_groups: int) -> list[list[float]]:
    """``key_group,epoch_micros`` lines -> per key group processing times (seconds)."""
    times: list[list[float]] = [[] for _ in range(key_groups)]
    for line in text.splitlines():
        kg, _, micros = line.partition(",")
        if not micros:
            continue
        try:
            times[int(kg)].append(int(micros) / 1e6)
        except (ValueError, IndexError):
            continue  # a line being written
    return times


@dataclass
class Output:
    """The counter's output folder: one file per subtask attempt."""

    folder: Path
    key_groups: int = MAX_PARALLELISM

    def files(self) -> set[str]:
        return {p.name for p in self.folder.glob("counter-*.csv")}

    def read(self, names: set[str] | None = None) -> list[list[float]]:
        merged: list[list[float]] = [[] for _ in range(self.key_groups)]
        for name in sorted(self.files() if names is None else names):
            try:
                text = (self.folder / name).read_text()
            except OSError:
                continue
            if not text.endswith("\n"):
                text = text[: text.rfind("\n") + 1]
            for kg, ts in enumerate(parse_lines(text, self.key_groups)):
                merged[kg].extend(ts)
        for ts in merged:
            ts.sort()
        return merged

    def wait_all(self, known: set[str], after: float, seconds: float, cluster: Cluster) -> float:
        """Wait until every key group has a record, in a file not in ``known``, after
        ``after``; return the time of the last key group's first such record."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            cluster.alive()
            new = self.files() - known
            if new:
                firsts = [next((t for t in ts if t > after), None) for ts in self.read(new)]
                if all(f is not None for f in firsts):
                    return max(f for f in firsts if f is not None)
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"not every key group processed again within {seconds:.0f}s")


# -- clusters, kept across state sizes -------------------------------------------------


@dataclass
class Clusters:
    """The session clusters of one comparison, started when first needed, by scheduler."""

    work: Path
    backend: str = "rocksdb"
    running: dict[str, Cluster] = field(default_factory=dict)
    jar_ids: dict[str, str] = field(default_factory=dict)

    def get(self, scheduler: str) -> tuple[Cluster, str]:
        """The cluster (and uploaded jar id) of ``scheduler``; only one runs at a time."""
        if scheduler not in self.running:
            for other in list(self.running):
                self.running.pop(other).stop()
            home, jar = setup()
            c = Cluster(
                home,
                Setup(backend=self.backend, scheduler=scheduler),
                self.work / f"cluster-{scheduler}",
            )
            shutil.rmtree(c.data, ignore_errors=True)
            c.data.mkdir(parents=True)
            log(f"starting a {scheduler}-scheduler cluster ({self.backend})")
            self.running[scheduler] = c  # stopped by stop() even if it fails to start
            c.start()
            self.jar_ids[scheduler] = c.upload(jar)
        return self.running[scheduler], self.jar_ids[scheduler]

    def stop(self) -> None:
        for c in self.running.values():
            c.stop()
        self.running.clear()


# -- one state size ---------------------------------------------------------------------


@dataclass
class Event:
    kind: str
    """``rescale`` or ``failover``."""
    mode: str
    before: int
    after: int
    started_at: float
    resumed_at: float


@dataclass
class Run:
    """One job's life on the cluster(s) of one size."""

    keys: int
    rate: float
    backend: str
    work: Path
    events: list[Event] = field(default_factory=list)
    preload_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.output = Output(self.work / "out")

    def job_args(self) -> list[str]:
        return [
            "--keys",
            str(self.keys),
            "--rate",
            str(self.rate),
            "--out",
            str(self.output.folder),
            "--max-parallelism",
            str(MAX_PARALLELISM),
        ]

    def submit(self, c: Cluster, jar_id: str, parallelism: int, savepoint: str | None) -> str:
        return c.run(jar_id, self.job_args(), parallelism, savepoint)

    def savepoint_rescale(self, c: Cluster, jar_id: str, job: str, mode: str, to: int) -> str:
        before = c.counter_parallelism(job)
        known = self.output.files()
        started = time.time()
        path = c.stop_with_savepoint(job, SAVEPOINT_MODES[mode])
        new_job = self.submit(c, jar_id, to, path)
        resumed = self.output.wait_all(known, started, 600, c)
        self.events.append(Event("rescale", mode, before, to, started, resumed))
        log(
            f"{self.keys:,} keys {mode} {before} -> {to}: all processing after "
            f"{resumed - started:.2f}s"
        )
        return new_job

    def adaptive_rescale(self, c: Cluster, job: str, to: int) -> None:
        before = c.counter_parallelism(job)
        known = self.output.files()
        started = time.time()
        c.set_parallelism(job, to)
        resumed = self.output.wait_all(known, started, 600, c)
        self.events.append(Event("rescale", "adaptive", before, to, started, resumed))
        log(
            f"{self.keys:,} keys adaptive {before} -> {to}: all processing after "
            f"{resumed - started:.2f}s"
        )

    def failover(self, c: Cluster, job: str, mode: str) -> None:
        used = c.taskmanagers_of(job)
        victim = max(used, key=lambda tm: used[tm])
        before = c.counter_parallelism(job)
        known = self.output.files()
        started = time.time()
        c.kill_taskmanager(victim)
        resumed = self.output.wait_all(known, started, 600, c)
        self.events.append(Event("failover", mode, before, before, started, resumed))
        log(
            f"{self.keys:,} keys SIGKILL {victim} ({used[victim]} subtasks, {mode}): all "
            f"processing after {resumed - started:.2f}s"
        )
        c.start_taskmanager()  # capacity back, as a restarted pod would bring it
        c.wait_slots(c.setup.taskmanagers * c.setup.slots_per_taskmanager)
        time.sleep(SETTLE_SECONDS)

    def preload(self, c: Cluster, jar_id: str) -> str:
        started = time.time()
        job = self.submit(c, jar_id, 2, None)
        self.output.wait_all(set(), started, 1800, c)
        self.preload_seconds = time.time() - started
        log(f"{self.keys:,} keys preloaded and steady after {self.preload_seconds:.1f}s")
        time.sleep(SETTLE_SECONDS)
        return job


def run_size(
    keys: int,
    clusters: Clusters,
    *,
    modes: tuple[str, ...] = MODES,
    rate: float = 2000.0,
    failover: bool = True,
    directions: tuple[tuple[int, int], ...] = ((2, 4), (4, 2)),
) -> dict[str, Any]:
    """Every mode's rescales and one failover at one state size; rows for compare.json."""
    folder = clusters.work / f"run-{keys}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run = Run(keys, rate, clusters.backend, folder)
    savepoint_modes = [m for m in modes if m in SAVEPOINT_MODES]
    failover_mode = modes[-1] if failover else None
    job: str | None = None
    c: Cluster | None = None
    try:
        path: str | None = None
        if savepoint_modes:
            c, jar_id = clusters.get("default")
            job = run.preload(c, jar_id)
            for mode in savepoint_modes:
                for before, after in directions:
                    if c.counter_parallelism(job) != before:
                        continue
                    job = run.savepoint_rescale(c, jar_id, job, mode, after)
                    time.sleep(SETTLE_SECONDS)
                    if mode == failover_mode and after == 4:
                        run.failover(c, job, f"{run.backend}/{mode}")
            if "adaptive" in modes:
                path = c.stop_with_savepoint(job, "NATIVE")
                job = None
        if "adaptive" in modes:
            c, jar_id = clusters.get("adaptive")
            if path is not None:
                started, known = time.time(), run.output.files()
                job = run.submit(c, jar_id, 2, path)
                run.output.wait_all(known, started, 600, c)
                time.sleep(SETTLE_SECONDS)
            else:
                job = run.preload(c, jar_id)
            for _, after in directions:
                run.adaptive_rescale(c, job, after)
                time.sleep(SETTLE_SECONDS)
                if failover_mode == "adaptive" and after == 4:
                    run.failover(c, job, f"{run.backend}/adaptive")
    finally:
        if c is not None and job is not None:
            c.cancel(job)
    rows = analyse(run, modes)
    shutil.rmtree(folder, ignore_errors=True)
    return rows


def throughput(
    clusters: Clusters, backend: str, *, keys: int, records: int, warmup: float
) -> dict[str, Any]:
    """One task slot (parallelism 1) over ``records`` Zipf keys with ``backend``.

    The TaskManager JVMs' CPU time (utime + stime, ``/proc/PID/stat`` through psutil) is
    sampled every ``CPU_SAMPLE_SECONDS`` while the job runs and interpolated at the two
    progress marks that bound the measured window, so that records per CPU second cover
    exactly the records measured. The CPU is that of the TaskManager that ran the job's
    subtasks (source and counter share its slot); the idle TaskManagers' and the
    JobManager's are reported beside it."""
    c, jar_id = clusters.get("default")
    out = clusters.work / f"throughput-{backend}"
    shutil.rmtree(out, ignore_errors=True)
    args = [
        "--keys",
        str(keys),
        "--out",
        str(out),
        "--throughput-records",
        str(records),
        "--backend",
        backend,
    ]
    pids = {name: proc.pid for name, proc in c.taskmanagers.items()}
    if c.jobmanager is not None:
        pids["jobmanager"] = c.jobmanager.pid
    with CpuSampler(pids) as sampler:
        job = c.run(jar_id, args, 1)
        c.wait_job_state(job, {"FINISHED"}, seconds=1800)
    progress: list[tuple[int, float]] = []
    for f in out.glob("counter-*.csv"):
        for line in f.read_text().splitlines():
            count, _, micros = line.partition(",")
            progress.append((int(count), int(micros) / 1e6))
    progress.sort()
    result = rate_after_warmup(progress, records, warmup)
    t0, t1 = result.pop("window")
    cpu = {name: sampler.cpu_between(name, t0, t1) for name in pids}
    ran = job_taskmanagers(c, job) or [max(c.taskmanagers, key=lambda n: cpu[n])]
    tm_cpu = sum(cpu[n] for n in ran)
    result["records_per_cpu_second"] = round(result["records_measured"] / tm_cpu)
    result["cpu"] = {
        "taskmanager_cpu_seconds": round(tm_cpu, 3),
        "taskmanager_cores": round(tm_cpu / (t1 - t0), 3),
        "taskmanagers_measured": ran,
        "other_taskmanagers_cpu_seconds": round(
            sum(v for n, v in cpu.items() if n not in ran and n != "jobmanager"), 3
        ),
        "jobmanager_cpu_seconds": round(cpu.get("jobmanager", 0.0), 3),
        "sample_seconds": CPU_SAMPLE_SECONDS,
    }
    log(
        f"throughput {backend}: {result['records_per_second']:,.0f} records/s, "
        f"{result['records_per_cpu_second']:,.0f} per CPU second of the TaskManager "
        f"({tm_cpu / (t1 - t0):.2f} cores)"
    )
    shutil.rmtree(out, ignore_errors=True)
    return {"system": "flink", "mode": backend, **result}


def job_taskmanagers(c: Cluster, job: str) -> list[str]:
    """The TaskManagers that ran the job's counter subtasks (REST; [] if unknown)."""
    try:
        return sorted(c.taskmanagers_of(job))
    except (RuntimeError, KeyError, OSError, ValueError):
        return []


CPU_SAMPLE_SECONDS = 0.05


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants (the JVM is exec'd by bin/*.sh)."""
    total = 0.0
    try:
        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                continue
    except psutil.NoSuchProcess:
        pass
    return total


def interpolate(samples: list[tuple[float, float]], t: float) -> float:
    """The value at time ``t`` from time-sorted ``(time, value)`` samples (linear; clamped
    to the first and last sample)."""
    if not samples:
        raise ValueError("no samples")
    times = [s[0] for s in samples]
    i = bisect.bisect_left(times, t)
    if i == 0:
        return samples[0][1]
    if i == len(samples):
        return samples[-1][1]
    (ta, va), (tb, vb) = samples[i - 1], samples[i]
    return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else vb


class CpuSampler:
    """Samples the CPU seconds of named processes on a thread, with wall-clock times."""

    def __init__(self, pids: dict[str, int], every: float = CPU_SAMPLE_SECONDS) -> None:
        self.pids, self.every = pids, every
        self.samples: dict[str, list[tuple[float, float]]] = {n: [] for n in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        for name, pid in self.pids.items():
            self.samples[name].append((time.time(), process_cpu_seconds(pid)))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> CpuSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def cpu_between(self, name: str, t0: float, t1: float) -> float:
        """CPU seconds ``name`` used between wall-clock times ``t0`` and ``t1``."""
        s = self.samples[name]
        if not s or t0 < s[0][0] or t1 > s[-1][0]:
            raise ValueError(f"{name}: the window is outside the CPU samples")
        return interpolate(s, t1) - interpolate(s, t0)


def rate_after_warmup(
    progress: list[tuple[int, float]], records: int, warmup: float
) -> dict[str, Any]:
    """Records/s from (records processed, time) marks, the first ``warmup`` share skipped;
    ``window`` is the (start, end) wall-clock times of the measured records."""
    start = next(p for p in progress if p[0] >= records * warmup)
    end = progress[-1]
    return {
        "records_per_second": round((end[0] - start[0]) / (end[1] - start[1])),
        "records_measured": end[0] - start[0],
        "seconds": round(end[1] - start[1], 2),
        "window": (start[1], end[1]),
    }


def analyse(run: Run, modes: tuple[str, ...]) -> dict[str, Any]:
    times = run.output.read()
    k = run.output.key_groups
    rescale_rows = []
    for mode in modes:
        for before, after in {(e.before, e.after) for e in run.events if e.mode == mode}:
            chosen = [
                e
                for e in run.events
                if (e.kind, e.mode, e.before, e.after) == ("rescale", mode, before, after)
            ]
            if not chosen:
                continue
            flags = moved(k, before, after)
            all_pauses: list[float | None] = []
            staying: list[float | None] = []
            for e in chosen:
                each = pauses(times, e.started_at, e.resumed_at)
                all_pauses += each  # Flink restarts every subtask: every key group pauses
                staying += [p for p, f in zip(each, flags, strict=True) if not f]
            rescale_rows.append(
                rescale_row(
                    "flink",
                    f"{run.backend}/{mode}",
                    run.keys,
                    before,
                    after,
                    all_pauses,
                    staying,
                    [e.resumed_at - e.started_at for e in chosen],
                )
            )
    failovers = [e for e in run.events if e.kind == "failover"]
    failover_rows = (
        [
            failover_row(
                "flink",
                failovers[0].mode,
                run.keys,
                [e.resumed_at - e.started_at for e in failovers],
            )
        ]
        if failovers
        else []
    )
    return {
        "rescale": sorted(rescale_rows, key=lambda r: (r["mode"], -r["to"])),
        "failover": failover_rows,
        "preload_seconds": round(run.preload_seconds, 1),
        "events": [e.__dict__ for e in run.events],
    }
