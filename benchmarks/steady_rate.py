"""What a running job costs at a steady rate below its capacity, and how long its key
groups stall with no rescale at all, optionally side by side with another checkout.

    python -m benchmarks.steady_rate [--rates 500,2000,8000] [--seconds 15] [--rounds 2]
                                     [--against PATH]

Each round runs ``keyshift run`` of ``benchmarks.jobs:rescale_job`` (2 workers, 32 key
groups, 100,000 uniform keys, the generator at the rate, checkpointInterval 200 ms,
Valkey on loopback), lets it run 5 s, then measures for ``--seconds``:

- **CPU per 1,000 records**: the worker processes' CPU seconds (user + system, from
  ``/proc`` through psutil) over the window, per 1,000 records processed in it (from the
  job's output); the Valkey server's beside it;
- **longest gap**: per key group the longest gap between two records it processed in
  the window, the median and the maximum over the key groups: with no rescale, what a
  stall of a whole worker looks like (the gap between a key group's records at that
  rate is the floor);
- **full collections**: the workers' ``keyshift_gc_pause_seconds`` for generation 2
  (count and longest bucket), scraped at the end of the window (a checkout without the
  metric shows none).

With ``--against PATH`` (another checkout, e.g. a ``git worktree`` of an older commit)
the rounds alternate between the two: the other checkout's packages go first on
``PYTHONPATH`` for its ``keyshift run``.  Results: ``benchmarks/results/steady_rate.json``
(``--output``) and ``benchmarks/steady_rate.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.rescale import JOB, REPO, LocalJob, read_outputs, say, write_manifest
from benchmarks.throughput import cpu_seconds
from hatch_build import COMPONENTS
from keyshift.store import open_store
from keyshift.store.server import LocalServer

HERE = Path(__file__).resolve().parent
WARMUP_SECONDS = 5.0
KEYS = 100_000
KEY_GROUPS = 32


def checkout_name(checkout: Path | None) -> str:
    """``this`` or the other checkout's folder, with the commit each runs (``+``: its
    package's sources changed since; an unpacked wheel says so)."""
    folder = REPO if checkout is None else checkout

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    commit = git("rev-parse", "--short", "HEAD") or "?"
    if checkout is not None and (checkout / "keyshift").is_dir():
        return f"{checkout.name} (an unpacked wheel)"
    dirty = "+" if git("status", "--porcelain", "--untracked-files=no", "--", *COMPONENTS) else ""
    return f"{'this' if checkout is None else checkout.name} ({commit}{dirty})"


def checkout_path(checkout: Path | None) -> str:
    """``PYTHONPATH`` that runs ``checkout``'s keyshift (None: this one, as installed): a
    checkout's components, or an unpacked wheel (a folder holding ``keyshift/``) as is."""
    if checkout is None:
        return os.environ.get("PYTHONPATH", "")
    if (checkout / "keyshift").is_dir():
        return str(checkout.resolve())
    return os.pathsep.join(str(checkout.resolve() / p) for p in COMPONENTS)


def gc_full_collections(urls: list[str]) -> tuple[int, float | None]:
    """Generation-2 collections of the workers so far, and the upper bound of the bucket
    of the longest one (None: no metric, or none)."""
    count, longest = 0, None
    for url in urls:
        try:
            text = httpx.get(url, timeout=2.0).text
        except httpx.HTTPError:
            continue
        for family in text_string_to_metric_families(text):
            if family.name != "keyshift_gc_pause_seconds":
                continue
            buckets = []
            for s in family.samples:
                if s.labels.get("generation") != "2":
                    continue
                if s.name.endswith("_count"):
                    count += int(s.value)
                elif s.name.endswith("_bucket"):
                    buckets.append((float(s.labels["le"]), s.value))
            below = 0.0
            for le, n in sorted(buckets):
                if n > below:
                    longest = le if longest is None else max(longest, le)
                below = n
    return count, longest


async def one_round(rate: float, seconds: float, checkout: Path | None) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="keyshift-steady-"))
    server = LocalServer(workdir / "store")
    job: LocalJob | None = None
    args = argparse.Namespace(
        busy=False, key_groups=KEY_GROUPS, rate=rate, checkpoint_ms=200,
        failover_after=2.0, standby=0,
    )  # fmt: skip
    try:
        await asyncio.to_thread(server.start)
        assert server.pid is not None
        store_pid = server.pid
        store = open_store(server.url)
        await store.init_job(JOB, KEY_GROUPS, created_at=time.time())
        await store.close()
        manifest = workdir / "steady.yaml"
        write_manifest(manifest, args, KEYS, "out.jsonl")
        job = LocalJob(workdir, manifest, server.url, 2.0)
        path = checkout_path(checkout)
        job.env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, str(REPO)]))
        await job.start()
        await asyncio.sleep(WARMUP_SECONDS)
        workers = [w for w in job.status()["workers"] if w.get("pid")]
        pids = [int(w["pid"]) for w in workers]
        urls = [str(w["metrics_url"]) for w in workers if w.get("metrics_url")]
        gc_before = await asyncio.to_thread(gc_full_collections, urls)
        start, store0 = time.time(), cpu_seconds(store_pid)
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        await asyncio.sleep(seconds)
        end, store1 = time.time(), cpu_seconds(store_pid)
        cpu1 = sum(cpu_seconds(pid) for pid in pids)
        gc_after = await asyncio.to_thread(gc_full_collections, urls)
    finally:
        if job is not None:
            await job.stop()
        await asyncio.to_thread(server.stop)
    outputs = read_outputs(workdir / ".keyshift" / JOB / "out.jsonl", KEY_GROUPS)
    records = sum(1 for times in outputs for t in times if start <= t < end)
    gaps = []
    for times in outputs:
        inside = [t for t in times if start <= t < end]
        if len(inside) > 1:
            gaps.append(max(b - a for a, b in itertools.pairwise(inside)))
    return {
        "rate": rate,
        "checkout": checkout_name(checkout),
        "records": records,
        "seconds": end - start,
        "worker_cpu_seconds": cpu1 - cpu0,
        "store_cpu_seconds": store1 - store0,
        "cpu_ms_per_1000_records": 1e6 * (cpu1 - cpu0) / max(1, records),
        "store_cpu_ms_per_1000_records": 1e6 * (store1 - store0) / max(1, records),
        "worker_cores": (cpu1 - cpu0) / (end - start),
        "gap_median_ms": 1000 * statistics.median(gaps) if gaps else None,
        "gap_max_ms": 1000 * max(gaps) if gaps else None,
        "full_collections": gc_after[0] - gc_before[0],
        "longest_full_collection_le": gc_after[1],
    }


def median_of(runs: list[dict[str, Any]], name: str) -> float | None:
    values = [r[name] for r in runs if r[name] is not None]
    return statistics.median(values) if values else None


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for checkout in dict.fromkeys(r["checkout"] for r in runs):
        for rate in dict.fromkeys(r["rate"] for r in runs):
            mine = [r for r in runs if r["checkout"] == checkout and r["rate"] == rate]
            rows.append({
                "checkout": checkout, "rate": rate, "rounds": len(mine),
                **{name: median_of(mine, name) for name in (
                    "cpu_ms_per_1000_records", "store_cpu_ms_per_1000_records",
                    "worker_cores", "gap_median_ms", "gap_max_ms")},
                "full_collections": sum(r["full_collections"] for r in mine),
            })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def cell(v: float | None, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"

    lines = [
        "| checkout | records/s | worker CPU ms per 1,000 records | worker cores | Valkey CPU "
        "ms per 1,000 | longest gap, median over key groups | longest gap, max | full "
        "collections |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['checkout']} | {r['rate']:,.0f} | {cell(r['cpu_ms_per_1000_records'])} "
            f"| {cell(r['worker_cores'], 2)} | {cell(r['store_cpu_ms_per_1000_records'])} "
            f"| {cell(r['gap_median_ms'])} ms | {cell(r['gap_max_ms'])} ms "
            f"| {r['full_collections']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cost, gap) = plt.subplots(1, 2, figsize=(11, 4))
    checkouts = list(dict.fromkeys(r["checkout"] for r in rows))
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    width = 0.8 / len(checkouts)
    for i, checkout in enumerate(checkouts):
        mine = {r["rate"]: r for r in rows if r["checkout"] == checkout}
        xs = [j + i * width for j in range(len(rates))]
        cost.bar(xs, [mine[r]["cpu_ms_per_1000_records"] or 0 for r in rates], width,
                 label=checkout)  # fmt: skip
        gap.bar(xs, [mine[r]["gap_max_ms"] or 0 for r in rates], width, label=checkout)
    for ax, title in ((cost, "worker CPU ms per 1,000 records"),
                      (gap, "longest gap of any key group (ms), no rescale")):  # fmt: skip
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rates))])
        ax.set_xticklabels([f"{r:,.0f}/s" for r in rates])
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    checkouts: list[Path | None] = [None] + ([args.against] if args.against else [])
    runs = []
    for round_ in range(args.rounds):
        for rate in args.rates:
            for checkout in checkouts:
                run = await one_round(rate, args.seconds, checkout)
                runs.append(run)
                say(f"round {round_ + 1}, {rate:,.0f}/s, {run['checkout']}: "
                    f"{run['cpu_ms_per_1000_records']:.0f} ms CPU per 1,000 records "
                    f"({run['worker_cores']:.2f} cores), longest gap "
                    f"{run['gap_max_ms']:.0f} ms, full collections "
                    f"{run['full_collections']}")  # fmt: skip
    return {
        "command": "python -m benchmarks.steady_rate " + " ".join(sys.argv[1:]),
        "keys": KEYS,
        "key_groups": KEY_GROUPS,
        "seconds": args.seconds,
        "runs": runs,
        "summary": summarise(runs),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rates", default="500,2000,8000", help="records/s, comma separated")
    p.add_argument("--seconds", type=float, default=15.0, help="measured window per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--against", type=Path, help="another checkout, run alternately")
    p.add_argument("--output", type=Path, default=HERE / "results" / "steady_rate.json")
    p.add_argument("--plot", type=Path, default=HERE / "steady_rate.png")
    args = p.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    data = asyncio.run(main_async(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=2) + "\n")
    plot(data["summary"], args.plot)
    print(table(data["summary"]))
    print(f"wrote {args.output} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
