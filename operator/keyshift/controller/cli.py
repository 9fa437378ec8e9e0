"""The ``keyshift`` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from keyshift.controller.local.run import InvalidManifest
from keyshift.errors import KeyshiftError
from keyshift.store.admin import add_store_commands

console = Console(width=None if sys.stdout.isatty() else 200)
"""Piped to a file, lines are not wrapped at 80 columns in the middle of a value."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("keyshift")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyshift",
        description="Autoscale stateful stream jobs without moving state.",
    )
    parser.add_argument(
        "--dir", type=Path, default=Path(".keyshift"),
        help="where local runs keep their files (default: .keyshift)",
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"keyshift {version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a StreamJob manifest locally")
    run.add_argument("manifest", type=Path, help="a StreamJob manifest (YAML)")
    run.add_argument("--store-url", help="use this store instead of an embedded Valkey")
    run.add_argument(
        "--keep-running", action="store_true",
        help="keep running after a bounded input is all processed (default: exit 0 then)",
    )  # fmt: skip
    run.add_argument(
        "--fresh", action="store_true",
        help="start from nothing: delete the job's state, its rescale history and its input "
        "clock first (otherwise a run resumes where the last one stopped)",
    )  # fmt: skip
    run.add_argument("--failover-after", type=float, help="seconds (default: the manifest's)")
    run.add_argument("--restart-delay", type=float, default=5.0,
                     help="seconds before a crashed worker is restarted")  # fmt: skip
    run.add_argument("--max-workers", type=int,
                     help="worker processes to start at most (default 64)")  # fmt: skip
    run.set_defaults(handler=_run)

    scale = commands.add_parser("scale", help="rescale a running local job")
    scale.add_argument("job", help="the job's name (metadata.name of its manifest)")
    scale.add_argument("parallelism", type=int, help="the number of workers to run")
    scale.add_argument("--wait", action="store_true", help="wait until the rescale is done")
    scale.add_argument("--timeout", type=float, default=120.0,
                       help="seconds to wait with --wait (default 120)")  # fmt: skip
    scale.set_defaults(handler=_scale)

    resume = commands.add_parser(
        "resume", help="replay a local job's stopped key groups from their last commits"
    )
    resume.add_argument("job", help="the job's name (metadata.name of its manifest)")
    resume.add_argument("key_groups", nargs="*", type=int, metavar="KEY_GROUP",
                        help="the stopped key groups to resume (default: all)")  # fmt: skip
    resume.set_defaults(handler=_resume)

    status = commands.add_parser("status", help="a local job's assignment, load and rescales")
    status.add_argument("job", help="the job's name (metadata.name of its manifest)")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=_status)

    explain = commands.add_parser("explain", help="the autoscaler's last decisions and why")
    explain.add_argument("job", help="the job's name (metadata.name of its manifest)")
    explain.add_argument("--last", type=int, default=5, help="how many decisions (default 5)")
    explain.add_argument("--json", action="store_true", help="print JSON")
    explain.add_argument(
        "-n", "--namespace", help="read the StreamJob's status on Kubernetes instead of a local run"
    )
    explain.set_defaults(handler=_explain)

    op = commands.add_parser("operator", help="run the Kubernetes operator (kopf)")
    op.add_argument("-n", "--namespace", action="append", default=[],
                    help="watch this namespace (repeatable; a glob pattern works too)")  # fmt: skip
    op.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    op.add_argument("--standalone", action="store_true", help="no leader election (one replica)")
    op.add_argument("--peering", help="kopf peering object for leader election (default: default)")
    op.add_argument("--priority", type=_priority, default=0,
                    help="peering priority of this replica; 'random' for a random one "
                    "(replicas of a Deployment: kopf pauses peers of equal priority)")  # fmt: skip
    op.add_argument("--peering-lifetime", type=int, default=60,
                    help="seconds a silent peer counts as alive (takeover delay)")  # fmt: skip
    op.add_argument("--liveness", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    op.add_argument("--metrics-port", type=int, help="serve the operator's /metrics here")
    op.add_argument("--metrics-host", default="0.0.0.0")
    op.set_defaults(handler=_operator)

    crd = commands.add_parser("crd", help="print, write or check the StreamJob CRD")
    crd.add_argument("--output", type=Path, default=Path("crds/streamjob.yaml"),
                     help="the CRD file (default: crds/streamjob.yaml)")  # fmt: skip
    crd_mode = crd.add_mutually_exclusive_group()
    crd_mode.add_argument("--write", action="store_true", help="write it to --output")
    crd_mode.add_argument("--check", action="store_true",
                          help="exit 1 with a diff when --output differs from it")  # fmt: skip
    crd.set_defaults(handler=_crd)

    fill = commands.add_parser(
        "fill-topic",
        help="write a manifest's generator records to a Kafka topic (one partition per key group)",
    )
    fill.add_argument("manifest", type=Path, help="a StreamJob whose source is the generator")
    fill.add_argument("--bootstrap-servers", required=True)
    fill.add_argument("--topic", required=True)
    fill.add_argument("--records", type=int, required=True, help="records per key group")
    fill.add_argument("--start", type=int, default=0, help="first offset (default 0)")
    fill.set_defaults(handler=_fill_topic)

    add_store_commands(commands)
    return parser


def _fill_topic(args: argparse.Namespace) -> int:
    from keyshift.api.spec import GeneratorSource, load_manifest
    from keyshift.runtime.kafka.admin import create_topic, fill_topic
    from keyshift.runtime.sources.generator import Generator

    spec = load_manifest(args.manifest).spec
    if not isinstance(spec.source, GeneratorSource):
        console.print(f"{args.manifest}: its source is not the generator")
        return 2
    # event times as if the records had arrived on the generator's schedule, ending now
    span = Generator(spec.source, spec.key_groups, 0.0).scheduled(0, args.start + args.records - 1)
    generator = Generator(spec.source, spec.key_groups, created_at=time.time() - span)
    create_topic(args.bootstrap_servers, args.topic, spec.key_groups)
    total = args.records * spec.key_groups
    written = fill_topic(
        args.bootstrap_servers, args.topic, generator, start=args.start,
        stop=args.start + args.records,
        progress=lambda n: console.print(f"{n}/{total} records", end="\r"),
    )  # fmt: skip
    console.print(f"wrote {written} records to {args.topic} ({spec.key_groups} partitions)")
    return 0


def _priority(text: str) -> int:
    """A peering priority: an integer, or ``random`` (a random positive one)."""
    return secrets.randbelow(2**31 - 1) + 1 if text == "random" else int(text)


def _run(args: argparse.Namespace) -> int:
    from keyshift.controller.local.run import LOCAL_MAX_WORKERS, run_local

    return run_local(
        args.manifest, base_dir=args.dir, store_url=args.store_url, fresh=args.fresh,
        keep_running=args.keep_running, max_workers=args.max_workers or LOCAL_MAX_WORKERS,
        failover_after=args.failover_after, restart_delay=args.restart_delay,
    )  # fmt: skip


def _explain(args: argparse.Namespace) -> int:
    import msgspec

    from keyshift.controller.autoscaling.decision import Decision, explain

    if args.namespace:
        from keyshift.controller.kubernetes.api import KubeApi, check_reachable, load_credentials

        load_credentials()
        check_reachable()
        body = asyncio.run(KubeApi().read_job(args.namespace, args.job))
        if body is None:
            console.print(f"no StreamJob {args.job!r} in namespace {args.namespace!r}")
            return 1
        auto = (body.get("status") or {}).get("autoscaler")
        where = f"StreamJob {args.namespace}/{args.job}"
    else:
        from keyshift.controller.local.run import RunDir

        run_dir = RunDir.of(args.job, args.dir)
        if not run_dir.status.exists():
            console.print(f"no job {args.job!r} has run in {args.dir} (give -n NAMESPACE "
                          "for a StreamJob on Kubernetes)")  # fmt: skip
            return 1
        path = run_dir.autoscaler
        auto = json.loads(path.read_text()) if path.exists() else None
        where = f"local job {args.job!r}"
    if not auto or not auto.get("decisions"):
        console.print(f"{where}: no autoscaler decisions yet (is spec.autoscaler.enabled true?)")
        return 1
    decisions = [msgspec.convert(d, type=Decision) for d in auto["decisions"][-args.last :]]
    if args.json:
        print(json.dumps([msgspec.to_builtins(d) for d in decisions], indent=2))
        return 0
    console.print(f"{where}: autoscaler mode {auto.get('mode')}, newest last")
    for d in decisions:
        console.print(explain(d), highlight=False, markup=False)
        console.print()
    return 0


def _operator(args: argparse.Namespace) -> int:
    import prometheus_client

    from keyshift.controller.kubernetes.handlers import run_operator

    if not args.namespace and not args.all_namespaces:
        console.print("give --namespace NS (repeatable) or --all-namespaces")
        return 2
    from keyshift.controller.kubernetes.api import check_reachable, load_credentials

    load_credentials()  # a clear message now, not kopf's login retried with tracebacks
    check_reachable()
    if args.metrics_port is not None:
        prometheus_client.start_http_server(args.metrics_port, addr=args.metrics_host)
    run_operator(
        namespaces=args.namespace, clusterwide=args.all_namespaces,
        standalone=args.standalone, peering=args.peering, priority=args.priority,
        liveness=args.liveness, peering_lifetime=args.peering_lifetime,
    )  # fmt: skip
    return 0


def _scale(args: argparse.Namespace) -> int:
    from keyshift.controller.local.run import RunDir

    run_dir = RunDir.of(args.job, args.dir)
    if run_dir.running_pid() is None:
        console.print(f"job {args.job!r} is not running here (start it with `keyshift run`)")
        return 1
    status = json.loads(run_dir.status.read_text()) if run_dir.status.exists() else {}
    key_groups = status.get("key_groups")
    if args.parallelism < 1 or (key_groups and args.parallelism > key_groups):
        console.print(
            f"parallelism must be between 1 and the key group count ({key_groups or '?'})"
        )
        return 2
    max_workers = status.get("max_workers")
    if max_workers and args.parallelism > max_workers:
        console.print(f"this run starts at most {max_workers} workers (keyshift run --max-workers)")
        return 2
    previous = json.loads(run_dir.desired.read_text()) if run_dir.desired.exists() else {}
    run_dir.write_json(run_dir.desired, {
        "parallelism": args.parallelism, "reason": "manual", "requested_at": time.time(),
        # the manifest's value this choice overrides: a restart keeps the choice while the
        # manifest still says that (keep_manual_parallelism)
        "manifest_parallelism": previous.get("manifest_parallelism"),
    })  # fmt: skip
    console.print(f"{args.job}: desired parallelism {args.parallelism}")
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        doc = json.loads(run_dir.status.read_text())
        if doc["parallelism"] == args.parallelism and doc["rescale_in_progress"] is None:
            last = doc["rescales"][-1] if doc["rescales"] else None
            if last:
                took = last["duration_seconds"]
                console.print(
                    f"rescaled {last['from']} -> {last['to']} in "
                    f"{'?' if took is None else f'{took:.2f}'} s, outcome {last['outcome']}"
                )
            return 0
        time.sleep(0.2)
    console.print(f"not rescaled to {args.parallelism} within {args.timeout:.0f}s")
    return 1


def _resume(args: argparse.Namespace) -> int:
    from keyshift.controller.core.status import workers_to_restart
    from keyshift.controller.local.run import RunDir

    run_dir = RunDir.of(args.job, args.dir)
    if run_dir.running_pid() is None:
        console.print(
            f"job {args.job!r} is not running here: `keyshift run` it again, and its stopped "
            "key groups replay from their last commits"
        )
        return 1
    status = json.loads(run_dir.status.read_text()) if run_dir.status.exists() else {}
    restart, not_stopped = workers_to_restart(
        status.get("failed_key_groups") or [], args.key_groups or None
    )
    if not_stopped:
        console.print(f"not stopped: key group(s) {', '.join(map(str, not_stopped))}")
    if not restart:
        console.print(f"{args.job}: no stopped key group to resume")
        return 1 if not_stopped else 0
    run_dir.write_json(run_dir.resume, {"workers": restart, "requested_at": time.time()})
    for worker, key_groups in sorted(restart.items()):
        groups = ", ".join(map(str, key_groups))
        console.print(f"{args.job}: restarting {worker}; key group(s) {groups} replay from "
                      "their last commit with the code as it is now")  # fmt: skip
    return 0


def _status(args: argparse.Namespace) -> int:
    from keyshift.controller.local.run import RunDir
    from keyshift.controller.local.view import render

    run_dir = RunDir.of(args.job, args.dir)
    if not run_dir.status.exists():
        console.print(f"no job {args.job!r} has run in {args.dir}")
        return 1
    doc = json.loads(run_dir.status.read_text())
    doc["running"] = run_dir.running_pid() is not None
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        console.print(render(doc))
        if not doc["running"]:
            console.print("[yellow]not running: figures are from its last second[/yellow]")
    return 0


def _crd(args: argparse.Namespace) -> int:
    import difflib

    from keyshift.controller.kubernetes import crd

    text = crd.render_yaml(crd.streamjob_crd())
    # the default file has a copy in the Helm chart, kept identical
    paths: list[Path] = [args.output]
    if args.output == crd.DEFAULT_PATH and crd.CHART_PATH.parent.is_dir():
        paths.append(crd.CHART_PATH)
    if args.write:
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            console.print(f"wrote {path}")
    elif args.check:
        for path in paths:
            current = path.read_text() if path.exists() else ""
            if current != text:
                sys.stdout.writelines(difflib.unified_diff(
                    current.splitlines(keepends=True), text.splitlines(keepends=True),
                    fromfile=str(path), tofile="generated",
                ))  # fmt: skip
                print(f"{path} is stale: run `{crd.WRITE_COMMAND}`", file=sys.stderr)
                return 1
    else:
        sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except InvalidManifest as exc:  # refused before anything started
        parser.exit(2, f"keyshift: error: {exc}\n")
    except (KeyshiftError, OSError) as exc:
        # a user's mistake or an outage: a message, not a traceback (a bug keeps its own)
        parser.exit(1, f"keyshift: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
