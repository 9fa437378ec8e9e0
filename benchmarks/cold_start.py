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
import contextlib
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


def manifest(job: str, wake_at: float, check: str) -> dict[str, Any]:
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
    return doc


async def first_processed(store: Any, job: str, arrives: float) -> float:
    """When the first record after the silence is committed: the positions' sum moves."""
    asleep = sum(await positions(store, job, K))
    while sum(await positions(store, job, K)) == asleep:
        if time.time() > arrives + 60:
            raise TimeoutError("nothing processed within 60 s of the input's return")
        await asyncio.sleep(0.02)
    return time.time()


def breakdown(status: dict[str, Any], arrives: float, processed: float) -> dict[str, Any]:
    """The cold start and its parts, from the wake's decision and rescale record in a
    status (``keyshift status --json`` or the StreamJob's ``status``: the same fields)."""
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


def woken(status: dict[str, Any]) -> bool:
    """The wake's rescale has finished (and so its record is complete)."""
    return any(r["from"] == 0 and r["reason"] == "autoscaler" and r["outcome"]
               for r in status.get("rescales") or [])  # fmt: skip


async def one_round(workdir: Path, wake_at: float, check: str) -> dict[str, Any]:
    """``keyshift run``: processes on this machine."""
    doc = manifest("cold", wake_at, check)
    job = LocalJob(workdir, write_manifest(workdir, doc), "cold").start()
    try:
        await asyncio.to_thread(job.wait_status, lambda s: s["phase"] == "Idle", wake_at - 2,
                                "the job to scale to zero before the second burst")  # fmt: skip
        store = job.store()
        info = await store.job_info("cold")
        assert info is not None
        arrives = info.created_at + wake_at
        processed = await first_processed(store, "cold", arrives)
        await store.close()
        status = await asyncio.to_thread(job.wait_status, woken, 30, "the wake's record")
        return breakdown(status, arrives, processed)
    finally:
        job.interrupt()
        job.close()


async def one_operator_round(workdir: Path, wake_at: float, check: str) -> dict[str, Any]:
    """The operator on the Kubernetes emulator: pods of a StatefulSet (run as local
    processes by the tests' pod runner), Prometheus scraping them, a Valkey server."""
    from keyshift.store import open_store
    from keyshift.store.server import LocalServer
    from tests.e2e.harness import OperatorProcess, pods_scraped
    from tests.e2e.kubelet import PodRunner
    from tests.k8s.emulator import KubernetesEmulator
    from tests.prometheus_server import PrometheusServer
    from tests.support import REPO

    for part in ("k8s", "kubelet", "prometheus", "valkey"):
        (workdir / part).mkdir()
    with contextlib.ExitStack() as stack:  # stopped in reverse order, whatever happens
        k8s = KubernetesEmulator(workdir / "k8s").start()
        stack.callback(k8s.stop)
        pods = PodRunner(k8s.url, workdir / "kubelet").start()
        stack.callback(pods.stop)
        prometheus = PrometheusServer(workdir / "prometheus").start()
        stack.callback(prometheus.stop)
        server = LocalServer(workdir / "valkey").start()
        stack.callback(server.stop)
        stack.enter_context(pods_scraped(k8s, pods, prometheus))
        k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
        operator = OperatorProcess(k8s.kubeconfig, workdir / "operator.log").start()
        stack.callback(operator.stop)
        doc = manifest("cold", wake_at, check)
        doc["spec"]["stateStore"]["url"] = server.url
        doc["spec"]["autoscaler"]["prometheus"] = {"url": prometheus.url}
        doc["spec"]["autoscaler"]["metricsWindowSeconds"] = 4
        k8s.kubectl("apply", "--validate=false", "-f", "-", input=json.dumps(doc))

        def status() -> dict[str, Any]:
            obj = k8s.get("streamjobs.keyshift.dev", "cold") or {}
            found: dict[str, Any] = obj.get("status") or {}
            return found

        await asyncio.to_thread(k8s.wait_for, lambda: status().get("phase") == "Idle",
                                wake_at - 2, "the job to scale to zero")  # fmt: skip
        store = open_store(server.url)
        info = await store.job_info("cold")
        assert info is not None
        arrives = info.created_at + wake_at
        processed = await first_processed(store, "cold", arrives)
        await store.close()
        await asyncio.to_thread(k8s.wait_for, lambda: woken(status()), 30, "the wake's record")
        return breakdown(status(), arrives, processed)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--wake-at", type=float, default=25.0, help="job time of the second burst")
    p.add_argument("--wake-check", default="1s", help="autoscaler.wakeCheckSeconds")
    p.add_argument(
        "--operator",
        action="store_true",
        help="the operator on the Kubernetes emulator instead of keyshift run",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="default: results/cold_start.json (cold_start_operator.json)",
    )
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
            measure = one_operator_round if args.operator else one_round
            r = asyncio.run(measure(Path(tmp), wake_at, args.wake_check))
        rounds.append(r)
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{k} {v}" for k, v in r.items()),
              flush=True)  # fmt: skip
    medians = {k: statistics.median(r[k] for r in rounds if r[k] is not None)
               for k in rounds[0]}  # fmt: skip
    doc = {
        "command": "python -m benchmarks.cold_start "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "host": "operator on the Kubernetes emulator" if args.operator else "keyshift run",
        "wake_check": args.wake_check,
        "rounds": rounds,
        "median": medians,
    }
    output = args.output or RESULTS.with_name(
        "cold_start_operator.json" if args.operator else "cold_start.json"
    )
    output.write_text(json.dumps(doc, indent=2) + "\n")
    print("median: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
