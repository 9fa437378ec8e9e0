"""Cold start from zero, locally: the first record arriving -> the first record processed.

``keyshift run`` (real worker processes, embedded Valkey) runs the counter over a
generator whose rate is a burst, a silence and a second burst at job time ``--wake-at``.
The autoscaler (``minParallelism: 0``, ``scaleToZeroAfter: 3s``) scales the job to zero in
the silence; the second burst's first record exists at exactly ``created_at + wake_at``
(the generator's clock), and the benchmark polls the positions in the store every 20 ms
for the first one processed and committed. The breakdown comes from the wake's decision
and its rescale record: detection (first record -> the autoscaler's ``input_waiting``
decision), the rescale's phases (starting the worker processes, publishing, the claim),
and the rest (the first batch processed and committed). Round ``i`` of ``n`` shifts the
input's return by ``i / n`` of ``wakeCheckSeconds`` (the checks run on the job's clock too),
so that the detection delay is sampled over the whole check interval.

    python -m benchmarks.cold_start --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keyshift.api.spec import parse_duration
from tests.controller.local.localjob import LocalJob
from tests.support import counter_manifest, positions, write_manifest

RESULTS = Path(__file__).parent / "results" / "cold_start.json"
K = 4


def manifest(workdir: Path, job: str, wake_at: float, check: str) -> Path:
    points = [[0, 400], [2, 400], [2, 0], [wake_at, 0], [wake_at, 400], [wake_at + 600, 400]]
    doc = counter_manifest(
        job, key_groups=K, parallelism=1, store_url="redis://127.0.0.1:1",
        source={"seed": 1, "keys": 400, "rate": {"shape": "points", "points": points}},
        autoscaler={
            "enabled": True, "minParallelism": 0, "maxParallelism": 2,
            "scaleToZeroAfter": "3s", "wakeCheckSeconds": check, "metricsWindowSeconds": 2,
            "intervalSeconds": 1, "cooldownSeconds": 2,
        },
    )  # fmt: skip
    return write_manifest(workdir, doc)


async def one_round(workdir: Path, wake_at: float, check: str) -> dict[str, Any]:
    job = LocalJob(workdir, manifest(workdir, "cold", wake_at, check), "cold").start()
    try:
        await asyncio.to_thread(job.wait_status, lambda s: s["phase"] == "Idle", wake_at - 2,
                                "the job to scale to zero before the second burst")  # fmt: skip
        store = job.store()
        info = await store.job_info("cold")
        assert info is not None
        arrives = info.created_at + wake_at
        asleep = sum(await positions(store, "cold", K))
        while sum(await positions(store, "cold", K)) == asleep:
            if time.time() > arrives + 60:
                raise TimeoutError("nothing processed within 60 s of the input's return")
            await asyncio.sleep(0.02)
        processed = time.time()
        await store.close()
        status = await asyncio.to_thread(
            job.wait_status,
            lambda s: any(r["from"] == 0 and r["reason"] == "autoscaler" and r["outcome"]
                          for r in s["rescales"]), 30, "the wake's record",
        )  # fmt: skip
        wake = next(r for r in status["rescales"] if r["from"] == 0 and r["reason"] == "autoscaler")
        decided = next(d["at"] for d in status["autoscaler"]["decisions"]
                       if d["reason"] == "input_waiting")  # fmt: skip
        steps = wake["steps"]
        rescale_end = wake["started_at"] + (wake["duration_seconds"] or 0.0)
        return {
            "cold_start_seconds": round(processed - arrives, 3),
            "detection_seconds": round(decided - arrives, 3),
            "decision_to_rescale_seconds": round(wake["started_at"] - decided, 3),
            "starting_workers_seconds": steps.get("starting_workers"),
            "publishing_seconds": steps.get("publishing"),
            "handing_off_seconds": steps.get("handing_off"),
            "after_rescale_seconds": round(processed - rescale_end, 3),
            "woke_to": wake["to"],
        }
    finally:
        job.interrupt()
        job.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--wake-at", type=float, default=25.0, help="job time of the second burst")
    p.add_argument("--wake-check", default="1s", help="autoscaler.wakeCheckSeconds")
    p.add_argument("--output", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = []
    check = parse_duration(args.wake_check)
    for i in range(args.rounds):
        # the wake checks follow the job's clock as the input does: spread the input's
        # return over one check interval, or every round would see the same detection
        wake_at = args.wake_at + check * i / args.rounds
        with tempfile.TemporaryDirectory(prefix="keyshift-cold-") as tmp:
            r = asyncio.run(one_round(Path(tmp), wake_at, args.wake_check))
        rounds.append(r)
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{k} {v}" for k, v in r.items()),
              flush=True)  # fmt: skip
    medians = {k: statistics.median(r[k] for r in rounds if r[k] is not None)
               for k in rounds[0]}  # fmt: skip
    doc = {
        "command": "python -m benchmarks.cold_start "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "wake_check": args.wake_check,
        "rounds": rounds,
        "median": medians,
    }
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    print("median: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
