"""Scale-out on one machine: a job of 128 key groups rescaled 4 -> 32 -> 4 workers.

    python -m benchmarks.scale_out [--key-groups 128] [--steps 4,32,4] [--rate 4000]
                                   [--standby 0]

``keyshift run`` (embedded Valkey, worker processes, controller) runs the counter over
the generator; the benchmark asks ``keyshift scale JOB N --wait`` for each step and
reads, per rescale, the controller's record: wall time and its phases, the moved key
groups, the longest pause of a moved key group (store release -> claim) and the
handoff timeline's medians; and, once the job settles at each size, the resident
memory of every worker process. ``--standby N`` runs the job with ``standbyWorkers: N``:
ready workers that own nothing, which a scale-up takes instead of starting processes.
Results: ``benchmarks/results/scale_out.json``; the
"Scale-out" section of ``benchmarks/RESULTS.md`` is written from it by hand (with the
command and the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from keyshift.api.names import API_VERSION

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "scale_out.json"
JOB = "scale-out"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def manifest(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "StreamJob",
        "metadata": {"name": JOB},
        "spec": {
            "job": "examples.counter:job",
            "keyGroups": args.key_groups,
            "parallelism": args.steps[0],
            "source": {
                "type": "generator",
                "seed": 3,
                "keys": 100_000,
                "rate": {"recordsPerSecond": args.rate},
            },
            "checkpointInterval": "500ms",
            "standbyWorkers": args.standby,
        },
    }


def status(run_dir: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc


def wait(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def settled(run_dir: Path, parallelism: int, standby: int) -> bool:
    """The job runs at ``parallelism``, no rescale under way, its workers and the
    standby ready."""
    doc = status(run_dir)
    return bool(
        doc
        and doc.get("parallelism") == parallelism
        and doc.get("rescale_in_progress") is None
        and sum(1 for w in doc["workers"] if w["ready"]) == parallelism + standby
    )


def worker_rss_mib(run_dir: Path, parallelism: int) -> list[float]:
    """The resident memory of the workers that own key groups (ordinals below
    ``parallelism``; the standby ones are beyond)."""
    rss = []
    for w in status(run_dir).get("workers", []):
        if w.get("ordinal", 0) >= parallelism:
            continue
        try:
            rss.append(psutil.Process(w["pid"]).memory_info().rss / 2**20)
        except (psutil.Error, TypeError):
            continue
    return rss


def summary(record: dict[str, Any], rss: list[float]) -> dict[str, Any]:
    handoff = record.get("handoff") or {}
    return {
        "from": record["from_parallelism"],
        "to": record["to_parallelism"],
        "outcome": record["outcome"],
        "wall_seconds": round(record["finished_at"] - record["started_at"], 3),
        "phases": {s["phase"]: s["seconds"] for s in record["steps"]},
        "moved_key_groups": record["moved_key_groups"],
        "max_pause_seconds": record["max_pause_seconds"],
        "handoff_pause_ms": handoff.get("pause_ms"),
        "handoff_step_medians_ms": {
            step: stats.get("median_ms") for step, stats in (handoff.get("steps") or {}).items()
        },
        "learned_via": handoff.get("via"),
        "workers_rss_mib": {
            "count": len(rss),
            "median": round(statistics.median(rss), 1) if rss else None,
            "total": round(sum(rss), 1),
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="keyshift-scale-out-"))
    path = workdir / "job.yaml"
    path.write_text(json.dumps(manifest(args)))  # JSON is YAML
    run_dir = workdir / ".keyshift" / JOB
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "keyshift.controller.cli"]
    log = (workdir / "keyshift-run.log").open("ab")
    proc = subprocess.Popen(
        [*cli, "run", str(path), "--keep-running",
         "--max-workers", str(max(args.steps) + args.standby)],
        cwd=workdir, env=env, stdout=log, stderr=log, start_new_session=True,
    )  # fmt: skip
    results: list[dict[str, Any]] = []
    try:
        wait("the first workers", lambda: settled(run_dir, args.steps[0], args.standby), 120)
        time.sleep(args.settle)  # a steady state before the first rescale (not a sync)
        for target in args.steps[1:]:
            say(f"scale to {target}")
            done = subprocess.run(
                [*cli, "scale", JOB, str(target), "--wait", "--timeout", "600"],
                cwd=workdir, env=env, capture_output=True, text=True,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(done.stdout + done.stderr)
            wait(
                f"{target} workers settled", lambda t=target: settled(run_dir, t, args.standby), 300
            )
            time.sleep(args.settle)
            history = json.loads((run_dir / "controller.json").read_text())["history"]
            results.append(summary(history[-1], worker_rss_mib(run_dir, target)))
            say(json.dumps(results[-1]))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return {
        "command": "python -m benchmarks.scale_out " + " ".join(sys.argv[1:]),
        "key_groups": args.key_groups,
        "rate": args.rate,
        "standby_workers": args.standby,
        "rescales": results,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--key-groups", type=int, default=128)
    p.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",")], default=[4, 32, 4])
    p.add_argument("--rate", type=float, default=4000.0, help="records per second")
    p.add_argument("--settle", type=float, default=5.0, help="seconds between steps")
    p.add_argument("--standby", type=int, default=0, help="spec.standbyWorkers")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    data = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=2) + "\n")
    say(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
