"""State store latency: ``get_many``, ``get_states``, ``commit``; standalone and cluster.

    python -m benchmarks.state_store [--quick]

Starts a standalone Valkey and a 3-master Redis Cluster on loopback (the same
server binary for both, see ``keyshift.store.server``), measures p50/p99 of
``get_many`` (1 and 100 keys), ``get_states`` (100 keys of each of 2 states: a batch's
read of the counter's misses) and ``commit`` (100, 1000, 10000 dirty keys of 100-byte
values), and writes ``benchmarks/results/state_store.json`` and the
"State store" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from benchmarks.results_md import replace_section
from keyshift.store import RedisStateStore, open_store
from keyshift.store.server import LocalCluster, LocalServer

RESULTS = Path(__file__).parent / "results"
VALUE = b"v" * 100
KEYS = [f"key-{i:08d}".encode() for i in range(10_000)]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure_store(
    store: RedisStateStore, job: str, quick: bool, progress: Progress
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    claim = await store.claim(job, 0, "bench")
    seq = claim.seq
    # preload 10k keys of two states to read back
    preload = {"s": dict.fromkeys(KEYS, VALUE), "t": dict.fromkeys(KEYS, VALUE)}
    seq = (await store.commit(job, 0, epoch=claim.epoch, token=claim.token, seq=seq,
                              puts=preload, position=0)).seq  # fmt: skip
    cases: list[tuple[str, int, int]] = [
        ("get_many 1 key", 1, 300 if quick else 3000),
        ("get_many 100 keys", 100, 200 if quick else 2000),
        ("get_states 2 x 100 keys", 100, 200 if quick else 2000),
        ("commit 100 keys", 100, 100 if quick else 1000),
        ("commit 1000 keys", 1000, 50 if quick else 400),
        ("commit 10000 keys", 10_000, 10 if quick else 60),
    ]
    for name, size, iterations in cases:
        task = progress.add_task(f"{store.url.split(':')[0]:>13} {name}", total=iterations)
        samples: list[float] = []
        cpu: list[float] = []
        for i in range(iterations):
            keys = [KEYS[(i * size + j) % len(KEYS)] for j in range(size)]
            start, start_cpu = time.perf_counter(), time.process_time()
            if name.startswith("get_many"):
                await store.get_many(job, 0, "s", keys)
            elif name.startswith("get_states"):
                await store.get_states(job, 0, {"s": keys, "t": keys})
            else:
                seq = (await store.commit(
                    job, 0, epoch=claim.epoch, token=claim.token, seq=seq,
                    puts={"s": dict.fromkeys(keys, VALUE)}, position=i,
                )).seq  # fmt: skip
            samples.append((time.perf_counter() - start) * 1000)
            cpu.append((time.process_time() - start_cpu) * 1000)
            progress.advance(task)
        out[name] = {
            "p50_ms": round(statistics.median(samples), 3),
            "p99_ms": round(percentile(samples, 0.99), 3),
            "client_cpu_p50_ms": round(statistics.median(cpu), 3),
            "iterations": iterations,
        }
    await store.delete_job(job)
    return out


async def run(quick: bool) -> dict[str, object]:
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="ks-bench-") as tmp, Progress() as progress:
        server = LocalServer(Path(tmp) / "standalone").start()
        cluster = LocalCluster(Path(tmp) / "cluster", masters=3).start()
        try:
            for kind, url in (("standalone", server.url), ("cluster", cluster.url)):
                store = open_store(url)
                results[kind] = await measure_store(store, "bench", quick, progress)
                await store.close()
            results["server"] = Path(server.binary).name
        finally:
            server.stop()
            cluster.stop()
    return results


def render(results: dict[str, object]) -> str:
    standalone = results["standalone"]
    cluster = results["cluster"]
    assert isinstance(standalone, dict) and isinstance(cluster, dict)
    lines = [
        "| operation | standalone p50 | standalone p99 | cluster p50 | cluster p99 "
        "| client CPU p50 (standalone) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in standalone.items():
        c = cluster[name]
        lines.append(
            f"| {name} | {s['p50_ms']:.2f} ms | {s['p99_ms']:.2f} ms "
            f"| {c['p50_ms']:.2f} ms | {c['p99_ms']:.2f} ms "
            f"| {s.get('client_cpu_p50_ms', float('nan')):.2f} ms |"
        )
    target = standalone["commit 1000 keys"]["p99_ms"]
    verdict = "met" if target < 5 else "NOT met"
    lines.append("")
    lines.append(
        f"Target (commit of 1000 keys, p99 under 5 ms standalone): {verdict} ({target:.2f} ms)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args()
    results = asyncio.run(run(args.quick))
    results["machine"] = (
        f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}"
    )
    results["quick"] = args.quick
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "state_store.json").write_text(json.dumps(results, indent=2) + "\n")
    body = render(results)
    intro = (
        "`python -m benchmarks.state_store` — one asyncio client, 100-byte values, "
        f"server `{results['server']}` on loopback, {results['machine']}; *client CPU* is "
        "the benchmark process's CPU time per call (what the worker pays), the rest latency."
    )
    replace_section("State store", intro + "\n\n" + body)
    Console().print(body)


if __name__ == "__main__":
    main()
