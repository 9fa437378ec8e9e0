"""Rescale and failover pauses against state size, on the real local system.

    python -m benchmarks.rescale [--sizes 1e5,1e6,1e7] [--repeats 3] [--rate 2000]

For each state size (keys of about 100 bytes), the benchmark

1. starts a Valkey on loopback and writes the state straight into it with the
   runtime's encoding (``claim`` + large ``commit`` batches, then ``release``),
   positions at 0: the state exists before the job ever runs;
2. runs the job as a user does: ``keyshift run manifest.yaml --store-url ...``
   (a subprocess: the supervisor, its controller and worker processes), fed by
   the generator at a steady rate, with a short ``checkpointInterval``;
3. repeats ``--repeats`` times: ``keyshift scale JOB 4 --wait``, settle,
   SIGKILL of worker 3 (failover after ``failoverAfter``, then the
   rebalance when it is back), settle, ``keyshift scale JOB 2 --wait``, settle.

What it measures, per rescale:

- **moved key groups' pause** (reported): from the job's output, every record
  carries the time it was processed; a key group's pause is the longest gap
  between two consecutive processed records that overlaps the rescale (the old
  owner's last record to the new owner's first one). Also shown: the store's
  ``last_pause`` (release -> claim, the controller's ``max_pause_seconds``) and
  the longest gap between two commits that advanced the key group's position
  (sampled from the store every 50 ms; includes up to one checkpoint interval);
- **unmoved key groups' pause**: the same output gap for key groups that keep
  their owner, compared with the same statistic over equally long quiet
  windows just before each rescale (the normal inter-record gap);
- **rescale wall time**: the controller record's ``duration_seconds``;
- **failover**: SIGKILL of one worker -> every one of its key groups claimed by
  a survivor (store ``claimed_at``) and processing again (first output).

Results: ``benchmarks/results/rescale.json``, ``benchmarks/rescale_pause.png``
and the "Rescale" section of ``benchmarks/RESULTS.md``. Two further runs show
how the workers' state caches change the picture (run them first; the main
run's section includes them)::

    python -m benchmarks.rescale --sizes 1e6 --rate 6000 --warmup 90 --no-failover \
        --output rescale_warm
    python -m benchmarks.rescale --sizes 1e6 --rate 6000 --warmup 4 --no-failover \
        --output rescale_warm_control

``--replot`` rewrites the plot and the section from the saved JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import redis.asyncio as aioredis

from benchmarks.jobs import initial_value
from benchmarks.results_md import replace_section
from keyshift.api.names import API_VERSION
from keyshift.runtime.api import encode_key
from keyshift.store import keys as store_keys
from keyshift.store import open_store
from keyshift.store.server import LocalServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PLOT = HERE / "rescale_pause.png"
JOB = "rescale-bench"
LOAD_BATCH = 10_000
SAMPLE_SECONDS = 0.05
SETTLE_SECONDS = 4.0
TARGET_PAUSE = 0.5
EXTRA_RUNS = ("rescale_warm", "rescale_warm_control")
"""Further runs (``--output NAME``) shown in the RESULTS.md section when present."""

T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


# -- the job -----------------------------------------------------------------------


def write_manifest(path: Path, args: argparse.Namespace, keys: int, sink: str) -> None:
    manifest = {
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": JOB},
        "spec": {
            "job": f"benchmarks.jobs:{'busy_rescale_job' if args.busy else 'rescale_job'}",
            "keyGroups": args.key_groups,
            "parallelism": 2,
            "source": {
                "type": "generator",
                "seed": 7,
                "keys": keys,
                "distribution": "uniform",
                "rate": {"shape": "constant", "recordsPerSecond": args.rate},
            },
            "sink": {"type": "log", "path": sink},
            "checkpointInterval": f"{args.checkpoint_ms}ms",
            "failoverAfter": f"{args.failover_after}s",
            "standbyWorkers": args.standby,
        },
    }
    path.write_text(json.dumps(manifest, indent=2))  # JSON is YAML


async def load_state(url: str, keys: int, key_groups: int) -> float:
    """Write ``keys`` values straight into the store; return the seconds it took."""
    started = time.monotonic()
    store = open_store(url)
    done = 0
    lock = asyncio.Lock()

    async def one(kg: int) -> None:
        nonlocal done
        claim = await store.claim(JOB, kg, "benchmark-loader")
        seq = claim.seq
        indices = range(kg, keys, key_groups)
        for start in range(0, len(indices), LOAD_BATCH):
            puts = {
                encode_key(f"key-{i}"): msgspec.msgpack.encode(initial_value(i))
                for i in indices[start : start + LOAD_BATCH]
            }
            result = await store.commit(
                JOB, kg, epoch=claim.epoch, token=claim.token, seq=seq,
                puts={"blob": puts}, position=0,
            )  # fmt: skip
            seq = result.seq
            async with lock:
                done += len(puts)
        await store.release(JOB, kg, epoch=claim.epoch, token=claim.token, generation=0)

    async def progress() -> None:
        while True:
            await asyncio.sleep(5)
            say(f"  loaded {done:,} / {keys:,} keys")

    reporter = asyncio.create_task(progress())
    try:
        for first in range(0, key_groups, 4):  # a few key groups at a time
            await asyncio.gather(*(one(kg) for kg in range(first, min(first + 4, key_groups))))
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
    await store.close()
    return time.monotonic() - started


# -- observing the store -----------------------------------------------------------


@dataclass
class StoreSamples:
    """Per key group: each distinct commit seen (time, position), each claim seen."""

    commits: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    claims: dict[int, list[tuple[float, str]]] = field(default_factory=dict)


async def sample_store(url: str, key_groups: int, out: StoreSamples, stop: asyncio.Event) -> None:
    client = aioredis.Redis.from_url(url)
    metas = [store_keys.meta(JOB, kg) for kg in range(key_groups)]
    try:
        while not stop.is_set():
            pipe = client.pipeline(transaction=False)
            for meta in metas:
                pipe.hmget(meta, ["position", "committed_at", "owner", "claimed_at"])
            rows = await pipe.execute()
            for kg, (position, committed_at, owner, claimed_at) in enumerate(rows):
                if committed_at is not None:
                    commits = out.commits.setdefault(kg, [])
                    t = float(committed_at)
                    if not commits or commits[-1][0] != t:
                        commits.append((t, int(position or 0)))
                if claimed_at is not None:
                    claims = out.claims.setdefault(kg, [])
                    t = float(claimed_at)
                    if not claims or claims[-1][0] != t:
                        claims.append((t, (owner or b"").decode()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_SECONDS)
    finally:
        await client.aclose()


# -- driving keyshift run ------------------------------------------------------------


class LocalJob:
    """``keyshift run`` as a subprocess, and the files of its run directory."""

    def __init__(self, workdir: Path, manifest: Path, store_url: str, failover_after: float):
        self.workdir = workdir
        self.manifest = manifest
        self.store_url = store_url
        self.failover_after = failover_after
        self.run_dir = workdir / ".keyshift" / JOB
        # the repository (benchmarks.jobs, examples) and whatever the caller put on the
        # path (a wheel's compiled modules, another checkout's sources)
        path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.process: asyncio.subprocess.Process | None = None

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "keyshift.controller.cli", *args]

    async def start(self) -> None:
        log = (self.workdir / "keyshift-run.log").open("ab")
        self.process = await asyncio.create_subprocess_exec(
            *self.cli("run", str(self.manifest), "--store-url", self.store_url,
                      "--failover-after", str(self.failover_after), "--keep-running"),
            cwd=self.workdir, env=self.env, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        log.close()
        await self.wait_for(self._running_two, 60, "keyshift run to run 2 workers")

    def _running_two(self) -> bool:
        doc = self.status()
        return bool(
            doc
            and doc["parallelism"] == 2
            and doc["rescale_in_progress"] is None
            and sum(1 for w in doc["workers"] if w["ready"]) >= 2
        )

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(self.process.wait(), 90)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()

    def alive(self) -> None:
        if self.process is not None and self.process.returncode is not None:
            tail = (self.workdir / "keyshift-run.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"keyshift run exited {self.process.returncode}:\n{tail}")

    def status(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.run_dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}
        return data

    def history(self) -> list[dict[str, Any]]:
        try:
            record = json.loads((self.run_dir / "controller.json").read_text())
        except (OSError, ValueError):
            return []
        history: list[dict[str, Any]] = record.get("history", [])
        return history

    async def wait_for(self, predicate: Any, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.alive()
            if predicate():
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"timed out after {seconds:.0f}s waiting for {what}")

    async def scale(self, parallelism: int) -> dict[str, Any]:
        before = len(self.history())
        proc = await asyncio.create_subprocess_exec(
            *self.cli("scale", JOB, str(parallelism), "--wait", "--timeout", "120"),
            cwd=self.workdir, env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"keyshift scale {parallelism} failed: {output.decode()}")
        await self.wait_for(lambda: len(self.history()) > before, 30, "the rescale record")
        record = self.history()[before]
        if record["outcome"] != "succeeded" or record["to_parallelism"] != parallelism:
            raise RuntimeError(f"rescale to {parallelism} did not succeed: {record}")
        return record

    def worker_pid(self, ordinal: int) -> int:
        for w in self.status()["workers"]:
            if w["ordinal"] == ordinal and w.get("pid"):
                return int(w["pid"])
        raise RuntimeError(f"worker {ordinal} has no pid")


# -- the job's output ----------------------------------------------------------------


class Output(msgspec.Struct):
    key_group: int
    offset: int
    value: float


def read_outputs(path: Path, key_groups: int) -> list[list[float]]:
    """Per key group, the sorted times at which records were processed."""
    times: list[list[float]] = [[] for _ in range(key_groups)]
    decoder = msgspec.json.Decoder(Output)
    with path.open("rb") as f:
        for line in f:
            try:
                out = decoder.decode(line)
            except msgspec.DecodeError:
                continue  # a torn line of concurrent appends
            times[out.key_group].append(out.value)
    for t in times:
        t.sort()
    return times


def longest_gap(times: list[float], start: float, end: float) -> float | None:
    """The longest gap between consecutive ``times`` that overlaps ``[start, end]``."""
    i = max(0, bisect.bisect_right(times, start) - 1)
    j = min(len(times) - 1, bisect.bisect_left(times, end))
    if j <= i:
        return None
    return max(times[k + 1] - times[k] for k in range(i, j))


def commit_gap(commits: list[tuple[float, int]], start: float, end: float) -> float | None:
    """The longest gap between commits that advanced the position, overlapping the window."""
    advancing: list[float] = []
    last = -1
    for t, position in commits:
        if position > last:
            advancing.append(t)
            last = position
    return longest_gap(advancing, start, end)


def moved_key_groups(record: dict[str, Any]) -> set[int]:
    return {
        kg
        for kg, (a, b) in enumerate(zip(record["from_owners"], record["to_owners"], strict=True))
        if a != b
    }


def _max(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


@dataclass
class RescaleRun:
    direction: str
    repeat: int
    started_at: float
    finished_at: float
    duration_seconds: float
    steps: list[dict[str, Any]]
    moved_key_groups: int
    moved_pause_output: float | None
    """Longest output gap of a moved key group (the reported figure)."""
    moved_pause_store: float | None
    """The controller's max_pause_seconds (store release -> claim)."""
    moved_pause_commits: float | None
    unmoved_gap_output: float | None
    unmoved_gap_commits: float | None
    baseline_gap_output: float | None
    """Longest output gap of any key group in an equally long quiet window before."""
    baseline_gap_commits: float | None
    handoff: dict[str, Any] | None = None
    """The record's handoff timeline: per step, the median and longest time it took."""
    busy_before: list[float] | None = None
    """The owning workers' busy ratios just before the rescale (the live view's window)."""


@dataclass
class FailoverRun:
    repeat: int
    killed_worker: int
    key_groups: int
    claimed_seconds: float | None
    """SIGKILL -> the last of its key groups claimed by a survivor."""
    progressing_seconds: float | None
    """SIGKILL -> the last of its key groups processing records again."""
    failover_rescale_seconds: float | None
    rebalance_seconds: float | None
    survivors_gap_output: float | None
    """Longest output gap of the survivors' own key groups from kill to progressing."""


def owners_busy(status: dict[str, Any], parallelism: int) -> list[float]:
    """The busy ratio of each worker that owns key groups (ordinal below
    ``parallelism``), as the status document shows it; standby workers are left out."""
    return [
        round(float(w["busy_ratio"]), 3)
        for w in status.get("workers", [])
        if w.get("ordinal", parallelism) < parallelism and w.get("busy_ratio") is not None
    ]


def make_timeline(
    events: list[tuple[str, int, float, dict[str, Any]]], outputs: list[list[float]]
) -> dict[str, Any] | None:
    """Processing times around the last 4 -> 2 rescale (the warmest caches), for the plot."""
    chosen = [e for e in events if e[0] == "4->2"][-1:] or events[-1:]
    if not chosen:
        return None
    direction, _, _, record = chosen[0]
    a, b = float(record["started_at"]) - 0.6, float(record["finished_at"]) + 0.4
    return {
        "direction": direction,
        "started_at": record["started_at"],
        "finished_at": record["finished_at"],
        "moved": sorted(moved_key_groups(record)),
        "times": [[t for t in ts if a <= t <= b] for ts in outputs],
    }


def analyse_rescale(
    record: dict[str, Any],
    direction: str,
    repeat: int,
    outputs: list[list[float]],
    samples: StoreSamples,
    quiet_from: float,
) -> RescaleRun:
    start, end = float(record["started_at"]), float(record["finished_at"])
    moved = moved_key_groups(record)
    all_kgs = range(len(outputs))
    # an equally long window just before the rescale, after the previous one settled
    q_end = start - 0.3
    q_start = max(quiet_from, q_end - (end - start))

    def gaps_out(kgs: Any, a: float, b: float) -> float | None:
        return _max([longest_gap(outputs[kg], a, b) for kg in kgs])

    def gaps_commit(kgs: Any, a: float, b: float) -> float | None:
        return _max([commit_gap(samples.commits.get(kg, []), a, b) for kg in kgs])

    unmoved = [kg for kg in all_kgs if kg not in moved]
    return RescaleRun(
        direction=direction,
        repeat=repeat,
        started_at=start,
        finished_at=end,
        duration_seconds=end - start,
        steps=list(record["steps"]),
        moved_key_groups=len(moved),
        moved_pause_output=gaps_out(moved, start, end),
        moved_pause_store=record.get("max_pause_seconds"),
        moved_pause_commits=gaps_commit(moved, start, end),
        unmoved_gap_output=gaps_out(unmoved, start, end),
        unmoved_gap_commits=gaps_commit(unmoved, start, end),
        baseline_gap_output=gaps_out(all_kgs, q_start, q_end) if q_end > q_start else None,
        baseline_gap_commits=gaps_commit(all_kgs, q_start, q_end) if q_end > q_start else None,
        handoff=record.get("handoff"),
    )


def analyse_failover(
    repeat: int,
    killed: int,
    killed_at: float,
    owners: list[int],
    failover: dict[str, Any] | None,
    rebalance: dict[str, Any] | None,
    outputs: list[list[float]],
    samples: StoreSamples,
) -> FailoverRun:
    lost = [kg for kg, o in enumerate(owners) if o == killed]
    claimed: list[float | None] = []
    resumed: list[float | None] = []
    for kg in lost:
        claims = [t for t, _ in samples.claims.get(kg, []) if t > killed_at]
        claimed.append(min(claims) - killed_at if claims else None)
        times = outputs[kg]
        i = bisect.bisect_right(times, killed_at)
        resumed.append(times[i] - killed_at if i < len(times) else None)
    progressing = None if None in resumed else _max(resumed)
    survivors = [kg for kg, o in enumerate(owners) if o != killed]
    until = killed_at + (progressing or 0.0)
    return FailoverRun(
        repeat=repeat,
        killed_worker=killed,
        key_groups=len(lost),
        claimed_seconds=None if None in claimed else _max(claimed),
        progressing_seconds=progressing,
        failover_rescale_seconds=None if failover is None else duration(failover),
        rebalance_seconds=None if rebalance is None else duration(rebalance),
        survivors_gap_output=_max([longest_gap(outputs[kg], killed_at, until) for kg in survivors]),
    )


def duration(record: dict[str, Any]) -> float:
    return float(record["finished_at"]) - float(record["started_at"])


# -- one state size ------------------------------------------------------------------


async def run_size(
    args: argparse.Namespace, keys: int, raw: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One state size; ``raw``, when given, receives the per key group output times
    (``outputs``), the rescale ``events`` and the ``failovers`` (for benchmarks/compare.py)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"keyshift-rescale-{keys}-"))
    server = LocalServer(workdir / "store")
    job: LocalJob | None = None
    samples = StoreSamples()
    stop_sampling = asyncio.Event()
    sampler: asyncio.Task[None] | None = None
    events: list[tuple[str, int, float, dict[str, Any]]] = []
    failovers: list[tuple[int, int, float, list[int], dict[str, Any] | None,
                          dict[str, Any] | None]] = []  # fmt: skip
    quiet_marks: list[float] = []
    busy: dict[tuple[str, int], list[float]] = {}
    try:
        await asyncio.to_thread(server.start)
        say(f"{keys:,} keys: store {server.url} (pid {server.pid}), loading state")
        load_seconds = await load_state(server.url, keys, args.key_groups)
        say(f"{keys:,} keys: loaded in {load_seconds:.1f}s")
        store = open_store(server.url)
        await store.init_job(JOB, args.key_groups, created_at=time.time())
        await store.close()
        manifest = workdir / "rescale-bench.yaml"
        write_manifest(manifest, args, keys, "out.jsonl")
        sampler = asyncio.create_task(
            sample_store(server.url, args.key_groups, samples, stop_sampling)
        )
        job = LocalJob(workdir, manifest, server.url, args.failover_after)
        await job.start()
        say(f"{keys:,} keys: keyshift run is up with 2 workers; warming up {args.warmup:.0f}s")
        await asyncio.sleep(args.warmup)
        for repeat in range(args.repeats):
            quiet_marks.append(time.time())
            busy[("2->4", repeat)] = owners_busy(job.status(), 2)
            record = await job.scale(4)
            events.append(("2->4", repeat, quiet_marks[-1], record))
            say(f"  2 -> 4 #{repeat + 1}: {duration(record):.2f}s, store pause "
                f"{record.get('max_pause_seconds')}s")  # fmt: skip
            await asyncio.sleep(SETTLE_SECONDS)
            if not args.no_failover:
                failovers.append(await kill_one(job, repeat))
                await asyncio.sleep(SETTLE_SECONDS)
            quiet_marks.append(time.time())
            busy[("4->2", repeat)] = owners_busy(job.status(), 4)
            record = await job.scale(2)
            events.append(("4->2", repeat, quiet_marks[-1], record))
            say(f"  4 -> 2 #{repeat + 1}: {duration(record):.2f}s, store pause "
                f"{record.get('max_pause_seconds')}s")  # fmt: skip
            await asyncio.sleep(SETTLE_SECONDS)
    finally:
        if job is not None:
            await job.stop()
        stop_sampling.set()
        if sampler is not None:
            await sampler
        await asyncio.to_thread(server.stop)
    outputs = read_outputs(workdir / ".keyshift" / JOB / "out.jsonl", args.key_groups)
    if raw is not None:
        raw.update(outputs=outputs, events=events, failovers=failovers)
    if args.keep:
        (workdir / "samples.json").write_text(
            json.dumps({"commits": samples.commits, "claims": samples.claims,
                        "events": events, "failovers": failovers})
        )  # fmt: skip
    rescales = [
        analyse_rescale(rec, direction, repeat, outputs, samples, quiet_from)
        for direction, repeat, quiet_from, rec in events
    ]
    for r in rescales:
        r.busy_before = busy.get((r.direction, r.repeat))
    failover_runs = [analyse_failover(*f, outputs, samples) for f in failovers]
    timeline = make_timeline(events, outputs)
    if args.keep:
        say(f"{keys:,} keys: kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "keys": keys,
        "load_seconds": round(load_seconds, 2),
        "rescales": [asdict(r) for r in rescales],
        "failovers": [asdict(f) for f in failover_runs],
        "timeline": timeline,
    }


async def kill_one(
    job: LocalJob, repeat: int
) -> tuple[int, int, float, list[int], dict[str, Any] | None, dict[str, Any] | None]:
    killed = 3
    before = len(job.history())
    owners = list(job.history()[-1]["to_owners"])
    pid = job.worker_pid(killed)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    def finished(reason: str) -> dict[str, Any] | None:
        for r in job.history()[before:]:
            if r["reason"] == reason:
                return r
        return None

    await job.wait_for(lambda: finished("failover") is not None, 60, "the failover")
    await job.wait_for(lambda: finished("rebalance") is not None, 90, "the rebalance")
    failover, rebalance = finished("failover"), finished("rebalance")
    assert failover is not None and rebalance is not None
    say(f"  SIGKILL worker {killed} (pid {pid}) #{repeat + 1}: failover rescale "
        f"{duration(failover):.2f}s, rebalance {duration(rebalance):.2f}s")  # fmt: skip
    return repeat, killed, killed_at, owners, failover, rebalance


# -- summary, plot, RESULTS.md -------------------------------------------------------


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(size: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"keys": size["keys"], "load_seconds": size["load_seconds"]}
    for direction in ("2->4", "4->2"):
        runs = [r for r in size["rescales"] if r["direction"] == direction]
        out[direction] = {
            name: median([r[name] for r in runs])
            for name in (
                "moved_pause_output", "moved_pause_store", "moved_pause_commits",
                "unmoved_gap_output", "unmoved_gap_commits", "baseline_gap_output",
                "baseline_gap_commits", "duration_seconds",
            )
        }  # fmt: skip
        out[direction]["moved_pause_output_max"] = _max([r["moved_pause_output"] for r in runs])
        out[direction]["unmoved_gap_output_max"] = _max([r["unmoved_gap_output"] for r in runs])
        out[direction]["repeats"] = len(runs)
    fo = size["failovers"]
    out["failover"] = {
        name: median([f[name] for f in fo])
        for name in ("claimed_seconds", "progressing_seconds", "failover_rescale_seconds",
                     "rebalance_seconds", "survivors_gap_output")
    }  # fmt: skip
    out["failover"]["repeats"] = len(fo)
    return out


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def sec(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def plot(summary: list[dict[str, Any]], sizes: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 2, figsize=(15, 10))
    axes = [grid[0][0], grid[0][1], grid[1][1], grid[1][0]]
    x = [s["keys"] for s in summary]
    colors = {"2->4": "tab:blue", "4->2": "tab:orange"}
    ax = axes[0]
    for d in ("2->4", "4->2"):
        ax.plot(x, [s[d]["moved_pause_output"] for s in summary], "o-", color=colors[d],
                label=f"{d} moved, output gap (reported)")  # fmt: skip
        ax.plot(x, [s[d]["moved_pause_store"] for s in summary], "s--", color=colors[d],
                alpha=0.6, label=f"{d} moved, store release→claim")  # fmt: skip
    ax.axhline(TARGET_PAUSE, color="red", linestyle=":", label="target 0.5 s")
    ax.set(xscale="log", xlabel="keys of state (~100 B each)", ylabel="seconds (median)",
           title="Moved key groups: longest pause")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

    ax = axes[1]
    for d in ("2->4", "4->2"):
        ax.plot(x, [s[d]["unmoved_gap_output"] for s in summary], "o-", color=colors[d],
                label=f"{d} unmoved, during rescale")  # fmt: skip
        ax.plot(x, [s[d]["baseline_gap_output"] for s in summary], "^:", color=colors[d],
                alpha=0.6, label=f"{d} all, quiet window before")  # fmt: skip
    ax.set(xscale="log", xlabel="keys of state (~100 B each)", ylabel="seconds (median)",
           title="Unmoved key groups: longest gap between records")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

    ax = axes[2]
    tl_size = next((s for s in reversed(sizes) if s["timeline"]), None)
    if tl_size is not None:
        tl = tl_size["timeline"]
        t0 = float(tl["started_at"])
        moved = set(tl["moved"])
        series = [[t - t0 for t in ts] for ts in tl["times"]]
        ax.eventplot(series, colors=["tab:red" if kg in moved else "tab:gray"
                                     for kg in range(len(series))],
                     linelengths=0.8, linewidths=0.6)  # fmt: skip
        ax.axvspan(0, float(tl["finished_at"]) - t0, color="gold", alpha=0.15,
                   label="rescale (controller record)")  # fmt: skip
        ax.set(xlabel="seconds since the rescale started", ylabel="key group",
               title=f"Records processed, {tl['direction']} at {tl_size['keys']:,} keys "
                     "(red: moved key groups)")  # fmt: skip
        ax.legend(fontsize=8, loc="upper right")
    ax = axes[3]
    markers = ["o", "s", "^", "D", "v"]
    for i, size in enumerate(sizes):
        for d, style in (("2->4", "-"), ("4->2", "--")):
            runs = [r for r in size["rescales"] if r["direction"] == d]
            ax.plot([r["repeat"] + 1 for r in runs], [r["unmoved_gap_output"] for r in runs],
                    style, marker=markers[i % len(markers)], color=colors[d],
                    label=f"{size['keys']:,} keys {d}")  # fmt: skip
    quiet = [r["baseline_gap_output"] for s in sizes for r in s["rescales"]]
    ax.axhline(median(quiet) or 0.0, color="gray", linestyle=":", label="quiet gap (median)")
    ax.set(xlabel="repeat (later = longer run, fuller state caches)", ylabel="seconds",
           title="Unmoved key groups' longest gap, per repeat")  # fmt: skip
    ax.set_xticks(range(1, max(len(s["rescales"]) for s in sizes) // 2 + 1))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.suptitle("keyshift rescale: pause vs state size (generator at a steady rate)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def series(size: dict[str, Any], direction: str, name: str) -> str:
    """One figure of every repeat, in order: ``45/88/150``."""
    values = [r[name] for r in size["rescales"] if r["direction"] == direction]
    return "/".join("-" if v is None else f"{v * 1000:.0f}" for v in values)


def rescale_table(data: dict[str, Any]) -> list[str]:
    lines = [
        "| keys | rescale | moved pause (output) | store | commits | unmoved gap | quiet gap "
        "| unmoved commit gap | quiet commit gap | rescale wall time "
        "| per repeat: moved / unmoved (ms) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size, s in zip(data["sizes"], data["summary"], strict=True):
        for d in ("2->4", "4->2"):
            r = s[d]
            lines.append(
                f"| {s['keys']:,} | {d.replace('->', ' → ')} | {ms(r['moved_pause_output'])} "
                f"| {ms(r['moved_pause_store'])} | {ms(r['moved_pause_commits'])} "
                f"| {ms(r['unmoved_gap_output'])} | {ms(r['baseline_gap_output'])} "
                f"| {ms(r['unmoved_gap_commits'])} | {ms(r['baseline_gap_commits'])} "
                f"| {sec(r['duration_seconds'])} "
                f"| {series(size, d, 'moved_pause_output')} / "
                f"{series(size, d, 'unmoved_gap_output')} |"
            )
    return lines


def results_markdown(data: dict[str, Any], extras: list[dict[str, Any]] | None = None) -> str:
    cfg = data["config"]
    m = data["machine"]
    lines = [
        f"`{data['command']}` — {cfg['rate']:,.0f} records/s from the generator over "
        f"{cfg['key_groups']} key groups, checkpointInterval {cfg['checkpoint_ms']} ms, "
        f"failoverAfter {cfg['failover_after']} s, {cfg['repeats']} repeats (medians), "
        "`keyshift run` + `keyshift scale --wait` as subprocesses, store Valkey on loopback, "
        "state preloaded into the store. "
        f"Machine: {m['nproc']} cores, {m['cpu']}, CPython {m['python']}. "
        f"Run time {data['run_seconds'] / 60:.1f} min.",
        "",
        "Moved key groups' pause (reported) = longest gap between two records processed, "
        "from the job's output (the old owner's last record to the new owner's first); "
        "*store* = the controller's `max_pause_seconds` (store release → claim); *commits* = "
        "longest gap between position-advancing commits sampled from the store (includes up "
        "to one checkpoint interval). Unmoved = the same output gap for key groups that keep "
        "their owner during the rescale; *quiet* = the same statistic over all key groups in "
        "an equally long window just before the rescale (the normal gap between records).",
        "",
        *rescale_table(data),
        "",
        f"Failover: SIGKILL of worker 3 of 4 (8 key groups), failoverAfter "
        f"{cfg['failover_after']} s.",
        "",
        "| keys | kill → all claimed | kill → all processing | failover rescale "
        "| rebalance (worker back) | survivors' own longest gap |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for s in data["summary"]:
        f = s["failover"]
        lines.append(
            f"| {s['keys']:,} | {sec(f['claimed_seconds'])} | {sec(f['progressing_seconds'])} "
            f"| {sec(f['failover_rescale_seconds'])} | {sec(f['rebalance_seconds'])} "
            f"| {ms(f['survivors_gap_output'])} |"
        )
    verdict = []
    for s in data["summary"]:
        worst = _max([s[d]["moved_pause_output"] for d in ("2->4", "4->2")])
        verdict.append(f"{s['keys']:,}: {ms(worst)}")
    lines += [
        "",
        f"Target (moved key groups' pause under {TARGET_PAUSE * 1000:.0f} ms median at every "
        f"size, flat): worst median per size — {'; '.join(verdict)}.",
        "",
        "![rescale pause](rescale_pause.png)",
    ]
    if extras:
        lines += [
            "",
            "State caches over time: the same 1e6-key job at a higher rate, once after a "
            "long warm-up (the workers' 64 MiB caches full, as in a long-running job) and once "
            "from a cold start (the control):",
        ]
    for extra in extras or []:
        xc = extra["config"]
        extra["summary"] = [summarise(s) for s in extra["sizes"]]
        lines += [
            "",
            f"`{extra['command']}` ({xc['rate']:,.0f} records/s, first rescale after "
            f"{xc['warmup_seconds']:.0f} s):",
            "",
            *rescale_table(extra),
        ]
    if data.get("notes"):
        lines += ["", *data["notes"]]
    return "\n".join(lines)


def busy_cell(busy: list[float] | None) -> str:
    return ", ".join(f"{b:.0%}" for b in busy) if busy else "-"


def handoff_markdown(data: dict[str, Any]) -> str:
    """Where a moved key group's pause goes, step by step, per rescale of the run."""
    from keyshift.controller.core.handoffs import STAGES

    cfg = data["config"]
    lines = [
        f"`{data['command']}` — `benchmarks.jobs:busy_rescale_job` (the rescale job with "
        f"`examples/busy_counter.py`'s ~250 us of CPU per record), {cfg['rate']:,.0f} "
        f"records/s over {cfg['key_groups']} key groups, {data['machine']['nproc']} cores. "
        "From each rescale's record (`keyshift status --json`, `rescales[].handoff`): per "
        "step, the time since the step before it over the moved key groups, median / longest "
        "in ms; the first step counts from the assignment's publication. *pause* = the old "
        "owner's batch end to the new owner's first batch loaded; *via* = how the new owners "
        "learned of the release; *busy before* = the old owners' busy ratios just before the "
        "rescale (`keyshift status`, the live view's window). *committed* is when the old "
        "owner sent its last commit, which carries the release (one request): its round trip "
        "shows in *learned*; *claimed* is when the new owner sent its claim (which also "
        "looks: one request): its round trip shows in *loaded*. A key group *handed* over "
        "was claimed for its waiting new owner by the release itself: it is learned and "
        "claimed at the release's instant (the store's clock), and the announcement's "
        "delivery shows in *loaded*.",
        "",
        "| keys | rescale | busy before | moved | "
        + " | ".join(s.replace("_", " ") for s in STAGES)
        + " | pause | via | moved pause (output) |",
        "|---:|---|---|---:|" + "---:|" * len(STAGES) + "---:|---|---:|",
    ]
    for size in data["sizes"]:
        for r in size["rescales"]:
            h = r.get("handoff") or {}
            steps = h.get("steps") or {}

            def cell(stats: dict[str, Any] | None) -> str:
                if not stats:
                    return "-"
                return f"{stats['median_ms']:.0f} / {stats['max_ms']:.0f}"

            via = ", ".join(f"{k} {v}" for k, v in (h.get("via") or {}).items())
            lines.append(
                f"| {size['keys']:,} | {r['direction'].replace('->', ' → ')} "
                f"| {busy_cell(r.get('busy_before'))} | {r['moved_key_groups']} | "
                + " | ".join(cell(steps.get(s)) for s in STAGES)
                + f" | {cell(h.get('pause_ms'))} | {via or '-'} "
                f"| {ms(r['moved_pause_output'])} |"
            )
    if data.get("notes"):
        lines += ["", *data["notes"]]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------


def parse_sizes(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part.strip()]


def results_path(name: str) -> Path:
    return HERE / "results" / f"{name}.json"


def write_outputs(data: dict[str, Any], name: str, *, results_md: bool) -> None:
    """The results JSON; for the main run also the plot and the RESULTS.md section."""
    data["summary"] = [summarise(s) for s in data["sizes"]]
    path = results_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    if name == "rescale_loaded" and results_md:
        replace_section("Handoff breakdown", handoff_markdown(data))
    if name != "rescale":
        return
    plot(data["summary"], data["sizes"], PLOT)
    if results_md:
        extras = []
        for extra in EXTRA_RUNS:
            with contextlib.suppress(OSError, ValueError):
                extras.append(json.loads(results_path(extra).read_text()))
        replace_section("Rescale", results_markdown(data, extras))


async def main_async(args: argparse.Namespace) -> int:
    if args.replot:
        saved: dict[str, Any] = json.loads(results_path(args.output).read_text())
        if args.note:
            saved["notes"] = args.note
        write_outputs(saved, args.output, results_md=not args.no_results_md)
        say(f"rewrote the outputs of {results_path(args.output)}")
        return 0
    started = time.monotonic()
    sizes: list[dict[str, Any]] = []
    for keys in parse_sizes(args.sizes):
        sizes.append(await run_size(args, keys))
        summary = summarise(sizes[-1])
        for d in ("2->4", "4->2"):
            r = summary[d]
            say(f"{keys:,} keys {d}: moved pause {ms(r['moved_pause_output'])} "
                f"(store {ms(r['moved_pause_store'])}), unmoved gap "
                f"{ms(r['unmoved_gap_output'])} (quiet {ms(r['baseline_gap_output'])}), "
                f"wall {sec(r['duration_seconds'])}")  # fmt: skip
        f = summary["failover"]
        say(f"{keys:,} keys failover: claimed {sec(f['claimed_seconds'])}, processing "
            f"{sec(f['progressing_seconds'])}")  # fmt: skip
    data: dict[str, Any] = {
        "command": "python -m benchmarks.rescale" + "".join(f" {a}" for a in sys.argv[1:]),
        "machine": machine(),
        "config": {
            "sizes": parse_sizes(args.sizes),
            "repeats": args.repeats,
            "rate": args.rate,
            "key_groups": args.key_groups,
            "checkpoint_ms": args.checkpoint_ms,
            "failover_after": args.failover_after,
            "warmup_seconds": args.warmup,
            "busy": args.busy,
            "value_bytes": 100,
        },
        "run_seconds": round(time.monotonic() - started, 1),
        "sizes": sizes,
        "notes": args.note or [],
    }
    write_outputs(data, args.output, results_md=not args.no_results_md)
    say(f"wrote {results_path(args.output).relative_to(REPO)} in "
        f"{data['run_seconds'] / 60:.1f} min")  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e5,1e6,1e7",
                        help="keys of state, comma separated (default 1e5,1e6,1e7)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000.0, help="records per second")
    parser.add_argument("--key-groups", type=int, default=32)
    parser.add_argument("--checkpoint-ms", type=int, default=200)
    parser.add_argument("--failover-after", type=float, default=2.0)
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--standby", type=int, default=0,
                        help="spec.standbyWorkers: ready workers beyond parallelism")  # fmt: skip
    parser.add_argument("--busy", action="store_true",
                        help="loaded: ~250 us CPU per record (busy_rescale_job)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--note", action="append", help="a line added under the figures")
    parser.add_argument("--warmup", type=float, default=SETTLE_SECONDS,
                        help="seconds of steady load before the first rescale")  # fmt: skip
    parser.add_argument("--output", default="rescale",
                        help="results/<output>.json; only 'rescale' writes the plot and "
                             "RESULTS.md (which also shows the EXTRA_RUNS)")  # fmt: skip
    parser.add_argument("--replot", action="store_true",
                        help="rewrite the plot and RESULTS.md from the results JSON")  # fmt: skip
    args = parser.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
