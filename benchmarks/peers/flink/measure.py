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

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """One task slot (parallelism 1) over ``records`` Zipf keys with ``backend``."""
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
    job = c.run(jar_id, args, 1)
    c.wait_job_state(job, {"FINISHED"}, seconds=1800)
    progress: list[tuple[int, float]] = []
    for f in out.glob("counter-*.csv"):
        for line in f.read_text().splitlines():
            count, _, micros = line.partition(",")
            progress.append((int(count), int(micros) / 1e6))
    result = rate_after_warmup(sorted(progress), records, warmup)
    log(f"throughput {backend}: {result['records_per_second']:,.0f} records/s")
    shutil.rmtree(out, ignore_errors=True)
    return {"system": "flink", "mode": backend, **result}


def rate_after_warmup(
    progress: list[tuple[int, float]], records: int, warmup: float
) -> dict[str, Any]:
    """Records/s from (records processed, time) marks, the first ``warmup`` share skipped."""
    start = next(p for p in progress if p[0] >= records * warmup)
    end = progress[-1]
    return {
        "records_per_second": round((end[0] - start[0]) / (end[1] - start[1])),
        "records_measured": end[0] - start[0],
        "seconds": round(end[1] - start[1], 2),
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
