"""Throughput of one worker: remote state (Valkey) versus an in-process dict store.

    python -m benchmarks.throughput [--keys 1000000] [--records 3000000] [--write-results-md]

The same worker (cache, checkpoints, commits every ``checkpointInterval``)
runs the counter job over the generator with Zipf-distributed keys, once
against a real Valkey on loopback and once against
:class:`keyshift.runtime.store.MemoryStore` (the ceiling: a "commit" is a dict
update).  After a warm-up (the cache fills), it measures records/s until every
record is processed and committed, and the cache hit ratio over the same
window.  Rounds alternate between the two stores and the medians are reported
(the machine is shared and noisy); records per CPU second of the worker are
reported too, as a figure less sensitive to other load.  Results go to
``benchmarks/results/throughput.json``; ``--write-results-md`` also rewrites
the "Worker throughput" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.counter import job as counter_job
from keyshift.controller.assignment import plan_assignment
from keyshift.runtime.config import StreamJob, settings_from
from keyshift.runtime.sinks import NullSinkWriter
from keyshift.runtime.store import MemoryStore, WorkerStore
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, open_store
from keyshift.store.server import LocalServer

RESULTS = Path(__file__).resolve().parent / "results" / "throughput.json"


@dataclass
class Run:
    records_per_second: float
    records_per_cpu_second: float
    """Records per second of this process's CPU time: less sensitive to other load."""
    cache_hit_ratio: float
    records_measured: int
    seconds: float
    commits: int


def manifest(job: str, args: argparse.Namespace) -> StreamJob:
    return StreamJob.model_validate(
        {
            "metadata": {"name": job},
            "spec": {
                "job": "examples.counter:job",
                "keyGroups": args.key_groups,
                "source": {
                    "seed": 1,
                    "keys": args.keys,
                    "distribution": "zipf",
                    "zipfExponent": args.zipf,
                    "limit": args.records // args.key_groups,
                },
                "sink": {"type": "null"},
                "stateStore": {"cacheBytes": args.cache_mb * 1024 * 1024},
                "checkpointInterval": args.checkpoint_interval,
                "batchSize": args.batch_size,
            },
        }
    )


async def measure(store: WorkerStore, args: argparse.Namespace) -> Run:
    job = f"bench-{secrets.token_hex(3)}"
    m = manifest(job, args)
    k = args.key_groups
    limit = args.records // k
    await store.init_job(job, k)
    publish = getattr(store, "publish_assignment")  # noqa: B009 (both stores have it)
    await publish(job, Assignment(1, 1, plan_assignment(k, 1)), expected_generation=0)
    worker = Worker(
        settings_from(m, ordinal=0, store_url="-"), counter_job, store, sink=NullSinkWriter()
    )
    task = asyncio.create_task(worker.run())
    warm = int(args.records * args.warmup)
    start: tuple[float, float, int, int, int] | None = None
    try:
        while True:
            runners = list(worker.runners.values())
            processed = sum(r.position for r in runners)
            if start is None and processed >= warm:
                cache = worker.cache
                start = (
                    time.perf_counter(),
                    time.process_time(),
                    processed,
                    cache.hits,
                    cache.misses,
                )
            if len(runners) == k and all(r.committed_position == limit for r in runners):
                break
            await asyncio.sleep(0.01)
        end, end_cpu = time.perf_counter(), time.process_time()
    finally:
        worker.stop()
        await task
    assert start is not None
    t0, c0, p0, h0, m0 = start
    hits = worker.cache.hits - h0
    misses = worker.cache.misses - m0
    measured = k * limit - p0
    count = _histogram_count(worker)
    return Run(
        records_per_second=measured / (end - t0),
        records_per_cpu_second=measured / (end_cpu - c0),
        cache_hit_ratio=hits / max(1, hits + misses),
        records_measured=measured,
        seconds=end - t0,
        commits=count,
    )


def _histogram_count(worker: Worker) -> int:
    for metric in worker.metrics.registry.collect():
        if metric.name == "keyshift_commit_duration_seconds":
            for sample in metric.samples:
                if sample.name.endswith("_count"):
                    return int(sample.value)
    return 0


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.records_per_second)[len(runs) // 2]


def median_cpu(runs: list[Run]) -> float:
    return sorted(r.records_per_cpu_second for r in runs)[len(runs) // 2]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    print(f"{args.records:,} records, {args.keys:,} Zipf({args.zipf}) keys, {args.repeat} rounds")
    locals_: list[Run] = []
    remotes: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="keyshift-bench-") as tmp:
        server = LocalServer(Path(tmp)).start()
        try:
            store = open_store(server.url)
            try:
                for round_ in range(args.repeat):  # alternate, so that noise hits both
                    locals_.append(await measure(MemoryStore(), args))
                    remotes.append(await measure(store, args))
                    print(
                        f"  round {round_ + 1}: in-process "
                        f"{locals_[-1].records_per_second:,.0f}/s, Valkey "
                        f"{remotes[-1].records_per_second:,.0f}/s (per CPU second: "
                        f"{locals_[-1].records_per_cpu_second:,.0f} vs "
                        f"{remotes[-1].records_per_cpu_second:,.0f}), hits "
                        f"{remotes[-1].cache_hit_ratio:.4f}"
                    )
            finally:
                await store.close()
        finally:
            server.stop()
    local, remote = median_run(locals_), median_run(remotes)
    ratio = remote.records_per_second / local.records_per_second
    print(f"median: remote / in-process = {ratio:.3f}, hit ratio {remote.cache_hit_ratio:.4f}")
    return {
        "in_process_records_per_second": round(local.records_per_second),
        "remote_records_per_second": round(remote.records_per_second),
        "ratio": round(ratio, 4),
        "cache_hit_ratio": round(remote.cache_hit_ratio, 4),
        "in_process_cache_hit_ratio": round(local.cache_hit_ratio, 4),
        "in_process_records_per_cpu_second": round(median_cpu(locals_)),
        "remote_records_per_cpu_second": round(median_cpu(remotes)),
        "cpu_ratio": round(median_cpu(remotes) / median_cpu(locals_), 4),
        "records_measured": remote.records_measured,
        "rounds": {
            "in_process_records_per_second": [round(r.records_per_second) for r in locals_],
            "remote_records_per_second": [round(r.records_per_second) for r in remotes],
        },
        "remote_commits": remote.commits,
        "in_process_commits": local.commits,
        "setup": {
            "job": "examples/counter.py (2 ValueStates per key)",
            "keys": args.keys,
            "distribution": f"zipf, exponent {args.zipf}",
            "key_groups": args.key_groups,
            "records": args.records,
            "warmup_fraction": args.warmup,
            "cache_bytes": args.cache_mb * 1024 * 1024,
            "checkpoint_interval_seconds": args.checkpoint_interval,
            "batch_size": args.batch_size,
            "store": "Valkey standalone on 127.0.0.1, AOF everysec",
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {platform.processor() or 'unknown cpu'}",
        },
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--zipf", type=float, default=1.3)
    p.add_argument("--records", type=int, default=3_000_000)
    p.add_argument("--warmup", type=float, default=0.4, help="fraction of records not measured")
    p.add_argument("--key-groups", type=int, default=8)
    p.add_argument("--cache-mb", type=int, default=256)
    p.add_argument("--checkpoint-interval", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--write-results-md", action="store_true")
    return p.parse_args()


def results_section(r: dict[str, Any]) -> str:
    s = r["setup"]
    met = r["ratio"] >= 0.8 and r["cache_hit_ratio"] >= 0.95
    rounds = len(r["rounds"]["remote_records_per_second"])
    rows = "\n".join(
        f"| {name} | {wall:,} | {cpu:,} | {hits:.2%} |"
        for name, wall, cpu, hits in (
            ("in-process dict", r["in_process_records_per_second"],
             r["in_process_records_per_cpu_second"], r["in_process_cache_hit_ratio"]),
            ("Valkey", r["remote_records_per_second"],
             r["remote_records_per_cpu_second"], r["cache_hit_ratio"]),
        )
    )  # fmt: skip
    return f"""
`python -m benchmarks.throughput` — one worker (in-process asyncio, null sink) runs
`examples/counter.py` (two ValueStates per key) over the generator: {s["keys"]:,} keys,
{s["distribution"]}, {s["key_groups"]} key groups, {s["records"]:,} records, the first
{s["warmup_fraction"]:.0%} not measured (cache warm-up); cache {s["cache_bytes"] // 2**20} MiB,
checkpointInterval {s["checkpoint_interval_seconds"]} s, batch {s["batch_size"]}. Remote: Valkey
standalone on loopback (AOF everysec); in-process: `keyshift.runtime.store.MemoryStore` (same
worker, same cache; a commit is a dict update). Medians of {rounds}
alternating rounds; CPython {s["python"]}, {s["machine"]}.

| store | records/s (wall) | records per CPU second | cache hit ratio |
|---|---:|---:|---:|
{rows}
| ratio | {r["ratio"]:.2f} | {r["cpu_ratio"]:.2f} | |

Per round (records/s, in-process / Valkey): {r["rounds"]["in_process_records_per_second"]} /
{r["rounds"]["remote_records_per_second"]}.

Target (remote >= 80% of in-process with >= 95% cache hits): {"met" if met else "NOT met"}.
"""


if __name__ == "__main__":
    arguments = parse_args()
    result = asyncio.run(main(arguments))
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {arguments.output}")
    section = results_section(result)
    print("\n## Worker throughput\n" + section)
    if arguments.write_results_md:
        from benchmarks.results_md import replace_section

        replace_section("Worker throughput", section)
