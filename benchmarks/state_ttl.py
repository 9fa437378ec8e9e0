"""The store's memory while keys churn: a job that remembers every key it sees, with
and without a state ttl.

    python -m benchmarks.state_ttl [--seconds 45] [--rate 2000] [--no-results-md]

One worker (in-process, as ``benchmarks/throughput.py``) runs ``benchmarks.jobs``'
``churn_job`` or ``churn_ttl_job`` (64 bytes per key; the latter with
``ttl=CHURN_TTL_SECONDS``) over the generator at ``--rate`` records/s, uniform over
2**32 keys (almost every record a new key), against a Valkey of its own on loopback.
Every second: the server's ``used_memory`` and the values stored (``HLEN`` of the state
in each key group). Without a ttl both grow with the records; with one they level off
once the first values expire (the worker's sweep removes them). Results:
``benchmarks/results/state_ttl.json``, ``benchmarks/state_ttl.png`` and the "State TTL:
memory under key churn" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as redis

from benchmarks import jobs
from benchmarks.results_md import replace_section
from keyshift.api.spec import StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.config import settings_from
from keyshift.runtime.sinks import NullSinkWriter
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, open_store
from keyshift.store.keys import state as state_key
from keyshift.store.server import LocalServer

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "state_ttl.json"
PLOT = HERE / "state_ttl.png"
SECTION = "State TTL: memory under key churn"
KEY_GROUPS = 8
MODES = {"ttl": jobs.churn_ttl_job, "no ttl": jobs.churn_job}


def manifest(job: str, rate: float) -> StreamJob:
    source = {"seed": 3, "keys": 2**32, "distribution": "uniform",
              "rate": {"recordsPerSecond": rate}}  # fmt: skip
    return StreamJob.model_validate(
        {
            "metadata": {"name": job},
            "spec": {
                "job": "benchmarks.jobs:churn_job",  # the Job object is passed in below
                "keyGroups": KEY_GROUPS,
                "source": source,
                "sink": {"type": "null"},
                "checkpointInterval": "1s",
            },
        }
    )


async def run_mode(mode: str, args: argparse.Namespace) -> list[dict[str, float]]:
    """One job on a Valkey of its own; a sample per second for ``args.seconds``."""
    job = "churn"
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="keyshift-ttl-") as tmp:
        server = LocalServer(Path(tmp)).start()
        store = open_store(server.url)
        client = redis.Redis.from_url(server.url)
        worker: Worker | None = None
        task: asyncio.Task[None] | None = None
        try:
            await store.init_job(job, KEY_GROUPS)
            assignment = Assignment(1, 1, plan_assignment(KEY_GROUPS, 1))
            await store.publish_assignment(job, assignment, expected_generation=0)
            m = manifest(job, args.rate)
            settings = settings_from(m, ordinal=0, store_url="-")
            worker = Worker(settings, MODES[mode], store, sink=NullSinkWriter())
            task = asyncio.create_task(worker.run())
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < args.seconds:
                info = await client.info("memory")
                values = 0
                for kg in range(KEY_GROUPS):
                    values += await client.hlen(state_key(job, kg, "last"))
                processed = sum(r.position for r in worker.runners.values())
                samples.append({"seconds": round(elapsed, 2), "used_memory": info["used_memory"],
                                "values": values, "records": processed})  # fmt: skip
                if len(samples) % 5 == 1:
                    mib = info["used_memory"] / 2**20
                    print(f"  {mode:6s} {elapsed:5.1f}s: {processed:,} records, {values:,} "
                          f"values, used_memory {mib:.1f} MiB", flush=True)  # fmt: skip
                await asyncio.sleep(1.0)  # the sampling interval (a clock, not a synchronisation)
        finally:
            if worker is not None and task is not None:
                worker.stop()
                await task
            await client.aclose()
            await store.close()
            server.stop()
    return samples


def summary(samples: list[dict[str, float]], ttl: float) -> dict[str, float]:
    """Growth over the second half of the run (after the ttl), per minute."""
    half = [s for s in samples if s["seconds"] >= max(2 * ttl, samples[-1]["seconds"] / 2)]
    first, last = half[0], half[-1]
    minutes = (last["seconds"] - first["seconds"]) / 60
    return {
        "used_memory_growth_mib_per_minute": (last["used_memory"] - first["used_memory"])
        / 2**20 / minutes,
        "values_growth_per_minute": (last["values"] - first["values"]) / minutes,
        "final_used_memory_mib": last["used_memory"] / 2**20,
        "final_values": last["values"],
    }  # fmt: skip


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5))
    for mode, samples in data["runs"].items():
        t = [s["seconds"] for s in samples]
        ax.plot(t, [s["used_memory"] / 2**20 for s in samples], label=mode)
        bx.plot(t, [s["values"] for s in samples], label=mode)
    ttl = data["setup"]["ttl_seconds"]
    for axis in (ax, bx):
        axis.axvline(ttl, color="grey", linestyle=":", label=f"ttl ({ttl:.0f} s)")
        axis.set_xlabel("seconds")
        axis.legend()
    ax.set_ylabel("Valkey used_memory (MiB)")
    bx.set_ylabel("values stored")
    fig.suptitle(f"{data['setup']['rate']:,.0f} records/s, almost every one a new key")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown(data: dict[str, Any]) -> str:
    s = data["setup"]
    rows = [
        "| job | used_memory at the end | its growth | values at the end | their growth |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode, r in data["summary"].items():
        rows.append(
            f"| {mode} | {r['final_used_memory_mib']:.1f} MiB | "
            f"{r['used_memory_growth_mib_per_minute']:+.1f} MiB/min | {r['final_values']:,.0f} | "
            f"{r['values_growth_per_minute']:+,.0f}/min |"
        )
    return f"""`{data["command"]}` — one worker (in-process) runs `benchmarks.jobs`'
`churn_ttl_job` (`ValueState("last", bytes, ttl={s["ttl_seconds"]:.0f})`, 64 bytes per
key) or `churn_job` (the same without a ttl) for {s["seconds"]:.0f} s each, over the
generator at {s["rate"]:,.0f} records/s, uniform over 2**32 keys (almost every record a new
key), {s["key_groups"]} key groups, each against a Valkey of its own on loopback; sampled
every second: the server's `used_memory` and the values stored (`HLEN` of the state in
every key group). CPython {s["python"]}, {s["machine"]}. Growth is measured from
{2 * s["ttl_seconds"]:.0f} s (twice the ttl) or the run's middle, whichever is later, to its end.

{chr(10).join(rows)}

![store memory under key churn](state_ttl.png)

With the ttl, the values stored level off at about the rate times the ttl (the worker's
sweep, 1,000 values per key group and second, passes over these few thousand per key
group within a few seconds and removes the expired ones in its fenced commits);
without it they grow with every new key, and so does the store's memory.
"""


async def main(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = {
        "command": "python -m benchmarks.state_ttl" + "".join(f" {a}" for a in args.argv),
        "setup": {
            "seconds": args.seconds,
            "rate": args.rate,
            "key_groups": KEY_GROUPS,
            "ttl_seconds": jobs.CHURN_TTL_SECONDS,
            "value_bytes": len(jobs.CHURN_VALUE),
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {platform.processor() or 'unknown cpu'}",
        },
        "runs": {},
    }
    for mode in MODES:
        print(f"{mode}: {args.seconds:.0f} s at {args.rate:,.0f} records/s", flush=True)
        data["runs"][mode] = await run_mode(mode, args)
    data["summary"] = {m: summary(s, jobs.CHURN_TTL_SECONDS) for m, s in data["runs"].items()}
    return data


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--no-results-md", action="store_true")
    args = p.parse_args(argv)
    args.argv = argv
    return args


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    result = asyncio.run(main(arguments))
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, PLOT)
    if not arguments.no_results_md:
        replace_section(SECTION, markdown(result))
    print(json.dumps(result["summary"], indent=1))
