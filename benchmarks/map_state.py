"""MapState per entry: what a get and a put cost with 1, 1,000 and 100,000 entries per key.

    python -m benchmarks.map_state [--sizes 1,1000,100000] [--working-set 1000]
                                   [--seconds 6] [--repeat 3] [--write-results-md]

One worker (in-process asyncio, null sink) runs a job whose every record reads one entry
of its key's map and writes it back (``benchmarks/jobs.py``: ``per_entry_job``), against
a real Valkey on loopback.  Each key's map is prefilled with N entries (map keys 1..N) in
the store.  The records touch the same number of distinct entries whatever N (the
working set, W = 1,000: W/N keys with maps of N <= W entries, or one key whose map holds
N > W entries of which records touch W), so that the only difference is the map's size:
the map key is drawn uniformly from [1, min(N, W)].  Beside it, in the same rounds, the
same maps kept as one value each (``one_value_job``: the layout MapState had before,
each record decodes and encodes the key's whole map).  The figures are taken once 95% of
reads hit the cache (or after ``--warmup`` seconds); the hit ratio over the window is
reported.  Rounds alternate the cases; medians of records per second and records per CPU
second (this process: the worker's CPU) go to ``benchmarks/results/map_state.json`` and,
with ``--write-results-md``, to the "MapState per entry" section of
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.jobs import one_value_job, per_entry_job
from benchmarks.results_md import replace_section
from keyshift.api.spec import StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.api import Job, encode_key
from keyshift.runtime.config import settings_from
from keyshift.runtime.sinks import NullSinkWriter
from keyshift.runtime.sources.generator import Generator
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, RedisStateStore, open_store
from keyshift.store.server import LocalServer

RESULTS = Path(__file__).resolve().parent / "results" / "map_state.json"
LAYOUTS = {"per-entry": per_entry_job, "one-value": one_value_job}
JOB_REFS = {
    "per-entry": "benchmarks.jobs:per_entry_job",
    "one-value": "benchmarks.jobs:one_value_job",
}
_encode = msgspec.msgpack.encode


def manifest(job: str, entries: int, layout: str, working_set: int) -> StreamJob:
    keys = max(1, working_set // entries)
    touched = min(entries, working_set)
    return StreamJob.model_validate(
        {
            "metadata": {"name": job},
            "spec": {
                "job": JOB_REFS[layout],
                "keyGroups": 1,
                "source": {"seed": 5, "keys": keys, "maxValue": touched, "limit": 100_000_000},
                "sink": {"type": "null"},
                "stateStore": {"cacheBytes": 512 * 1024 * 1024},
                "checkpointInterval": 1.0,
                "batchSize": 500,
            },
        }
    )


async def prefill(
    store: RedisStateStore, job: str, m: StreamJob, layout: str, entries: int
) -> None:
    """Each key's map with ``entries`` entries, committed as the job would have."""
    spec = m.spec.generator
    names = {e.key for e in Generator(spec, 1, 0.0).read(0, 0, 50 * spec.keys)}
    assert len(names) == spec.keys, "a key the records never touch"
    claim = await store.claim(job, 0, "prefill")
    seq = claim.seq
    fields: list[tuple[bytes, bytes]] = []
    for name in sorted(names):
        kb = encode_key(name)
        if layout == "one-value":
            fields.append((kb, _encode(dict.fromkeys(range(1, entries + 1), 0))))
        else:
            fields += [(kb + _encode(k), _encode(0)) for k in range(1, entries + 1)]
    state = "whole" if layout == "one-value" else "entries"
    batches = [{state: dict(fields[i : i + 10_000])} for i in range(0, len(fields), 10_000)]
    for puts in batches:
        result = await store.commit(
            job, 0, epoch=claim.epoch, token=claim.token, seq=seq, position=0,
            puts=puts, entry_states={"entries"},
        )  # fmt: skip
        seq = result.seq
    await store.release(job, 0, epoch=claim.epoch, token=claim.token, generation=0)


async def measure(
    store: RedisStateStore, entries: int, layout: str, args: argparse.Namespace
) -> dict[str, float]:
    job = f"map-{secrets.token_hex(3)}"
    m = manifest(job, entries, layout, args.working_set)
    await store.init_job(job, 1)
    await prefill(store, job, m, layout, entries)
    await store.publish_assignment(
        job, Assignment(1, 1, plan_assignment(1, 1)), expected_generation=0
    )
    worker_job: Job[Any] = LAYOUTS[layout]
    worker = Worker(
        settings_from(m, ordinal=0, store_url="-"), worker_job, store, sink=NullSinkWriter()
    )
    task = asyncio.create_task(worker.run())
    cache = worker.cache

    def snapshot() -> tuple[float, float, int, int, int]:
        runner = worker.runners.get(0)
        return (time.perf_counter(), time.process_time(), runner.position if runner else 0,
                cache.hits, cache.misses)  # fmt: skip

    try:
        started = time.monotonic()
        last = snapshot()
        while time.monotonic() - started < args.warmup:
            await asyncio.sleep(0.5)
            now = snapshot()
            hits, misses = now[3] - last[3], now[4] - last[4]
            last = now
            if now[2] > 0 and hits + misses and hits / (hits + misses) >= 0.95:
                break
        begin = snapshot()
        await asyncio.sleep(args.seconds)
        end = snapshot()
    finally:
        worker.stop()
        await task
        await store.delete_job(job)
    records = end[2] - begin[2]
    hits, misses = end[3] - begin[3], end[4] - begin[4]
    return {
        "records_per_second": records / (end[0] - begin[0]),
        "records_per_cpu_second": records / max(1e-9, end[1] - begin[1]),
        "cache_hit_ratio": hits / max(1, hits + misses),
        "records": records,
    }


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: dict[str, list[dict[str, float]]] = {
        f"{layout}/{n}": [] for n in sizes for layout in LAYOUTS
    }
    with tempfile.TemporaryDirectory(prefix="keyshift-bench-") as tmp:
        server = LocalServer(Path(tmp)).start()
        store = open_store(server.url)
        try:
            for round_ in range(args.repeat):
                for n in sizes:
                    for layout in LAYOUTS:
                        run = await measure(store, n, layout, args)
                        runs[f"{layout}/{n}"].append(run)
                        print(
                            f"  round {round_ + 1}: {layout:9} {n:>7,} entries: "
                            f"{run['records_per_second']:>9,.0f}/s, "
                            f"{run['records_per_cpu_second']:>9,.0f} per CPU s, "
                            f"hits {run['cache_hit_ratio']:.3f}",
                            flush=True,
                        )
        finally:
            await store.close()
            server.stop()
    rows = []
    for n in sizes:
        for layout in LAYOUTS:
            r = runs[f"{layout}/{n}"]
            rows.append({
                "layout": layout,
                "entries": n,
                "records_per_second": round(median([x["records_per_second"] for x in r])),
                "records_per_cpu_second": round(median([x["records_per_cpu_second"] for x in r])),
                "cache_hit_ratio": round(median([x["cache_hit_ratio"] for x in r]), 4),
                "rounds_records_per_cpu_second": [round(x["records_per_cpu_second"]) for x in r],
            })  # fmt: skip
    return {
        "command": "python -m benchmarks.map_state" + "".join(f" {a}" for a in args.argv),
        "rows": rows,
        "setup": {
            "seconds": args.seconds,
            "working_set": args.working_set,
            "warmup_seconds_at_most": args.warmup,
            "rounds": args.repeat,
            "store": "Valkey standalone on 127.0.0.1",
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {platform.processor() or 'unknown cpu'}",
        },
    }


def results_section(r: dict[str, Any]) -> str:
    by = {(x["layout"], x["entries"]): x for x in r["rows"]}
    sizes = sorted({x["entries"] for x in r["rows"]})
    smallest = sizes[0]
    lines = []
    for n in sizes:
        e, o = by[("per-entry", n)], by[("one-value", n)]
        flat = e["records_per_cpu_second"] / by[("per-entry", smallest)]["records_per_cpu_second"]
        lines.append(
            f"| {n:,} | {e['records_per_second']:,} | {e['records_per_cpu_second']:,} | "
            f"{flat:.2f} | {e['cache_hit_ratio']:.1%} | {o['records_per_second']:,} | "
            f"{o['records_per_cpu_second']:,} | "
            f"{e['records_per_cpu_second'] / o['records_per_cpu_second']:.1f}x |"
        )
    s = r["setup"]
    return f"""
`{r["command"]}`: one worker; each key's map holds N entries in a real Valkey; each
record reads one entry and writes it back. The records touch {s["working_set"]:,} distinct
entries whatever N ({s["working_set"]:,}/N keys of N entries, or one key of N entries of
which they touch {s["working_set"]:,}), so that only the maps' size differs. Medians of
{s["rounds"]} alternating rounds of {s["seconds"]} s each, measured once the cache holds the
map (or after {s["warmup_seconds_at_most"]} s); CPython {s["python"]}, {s["machine"]}.
*vs N={smallest:,}*: records per CPU second relative to the smallest map (flat = 1.00).
*one value*: the same map stored as one value, as MapState was before (each record decodes
and encodes the key's whole map).

| entries per key | per entry: records/s | per CPU second | vs N={smallest:,} | hits \
| one value: records/s | per CPU second | per entry / one value |
|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(lines)}
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="1,1000,100000")
    p.add_argument("--working-set", type=int, default=1000, help="distinct entries touched")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--warmup", type=float, default=30.0, help="at most this many seconds")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--write-results-md", action="store_true")
    args = p.parse_args()
    args.argv = sys.argv[1:]
    return args


if __name__ == "__main__":
    arguments = parse_args()
    result = asyncio.run(main(arguments))
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps(result, indent=2) + "\n")
    print(results_section(result))
    if arguments.write_results_md:
        replace_section("MapState per entry", results_section(result))
