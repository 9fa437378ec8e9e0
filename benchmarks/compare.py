"""keyshift and Apache Flink 2.3 side by side: rescale, failover, throughput.

    python -m benchmarks.compare            # the whole comparison
    python -m benchmarks.compare --quick    # 1e5 and 1e6 keys, one Flink mode, 2 -> 4 only
                                            # (to results/compare_quick.json, compare_quick.png)
    python -m benchmarks.compare --replot   # plot and RESULTS.md from the saved JSON
    python -m benchmarks.compare --only-throughput   # the throughput rows again, into the
                                                     # saved compare.json

The same workload on both systems, on this machine, in one run: a keyed
counter whose state is one ~100-byte value per key, every key preloaded, fed
at the same steady rate, 32 key groups (Flink: max parallelism 32),
parallelism 2 -> 4 and 4 -> 2.

- keyshift: ``benchmarks/rescale.py``'s machinery (``keyshift run`` +
  ``keyshift scale --wait`` as subprocesses, state preloaded into a Valkey on
  loopback, SIGKILL of a worker for the failover).
- Flink: ``benchmarks/peers/flink/`` (its own venv with ``apache-flink==2.3.0``,
  a standalone session cluster on loopback, ``KeyedCounter.java`` compiled on
  the spot); modes: stop with a canonical or native savepoint and resubmit at
  the new parallelism, or the adaptive scheduler's resource requirements; for
  the failover, SIGKILL of a TaskManager and restart from the latest checkpoint.

Each system's job writes the key group and processing time of every record;
a key group's pause is the longest gap between two of its records that
overlaps the rescale (``benchmarks/peers/pauses.py``). Throughput: one worker
(keyshift, ``benchmarks/throughput.py``, Valkey and in-process state) and one
task slot (Flink, RocksDB and ForSt) on the counter over Zipf keys,
``--throughput-rounds`` runs of each (medians), as records/s and records per CPU
second (keyshift: the worker process; Flink: the TaskManager JVM, over exactly the
measured window); keyshift also reads the
same records from a Kafka topic (the test broker, Tansu).

Writes ``benchmarks/results/compare.json``, ``benchmarks/compare_pause.png``
and the "Side by side with Apache Flink" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import rescale
from benchmarks import throughput as ks_throughput
from benchmarks.peers.flink import measure as flink
from benchmarks.peers.flink.peer import FLINK_VERSION, WORK
from benchmarks.peers.pauses import failover_row, pauses, rescale_row
from benchmarks.results_md import replace_section
from keyshift.runtime.collector import settle_garbage_collector

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "compare.json"
PLOT = HERE / "compare_pause.png"
QUICK_RESULTS = HERE / "results" / "compare_quick.json"
QUICK_PLOT = HERE / "compare_quick.png"
SECTION = "Side by side with Apache Flink"
KEY_GROUPS = 32
KEYSHIFT_MODE = "valkey/handoff"


def say(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- keyshift ------------------------------------------------------------------------------


def keyshift_args(args: argparse.Namespace, keys: int, failover: bool) -> argparse.Namespace:
    """The arguments ``benchmarks.rescale.run_size`` reads."""
    return argparse.Namespace(
        sizes=str(keys),
        repeats=args.repeats,
        rate=args.rate,
        key_groups=KEY_GROUPS,
        checkpoint_ms=200,
        failover_after=2.0,
        no_failover=not failover,
        keep=False,
        warmup=rescale.SETTLE_SECONDS,
        busy=False,
        standby=0,
    )


def keyshift_size(args: argparse.Namespace, keys: int, failover: bool) -> dict[str, Any]:
    """keyshift's rescales and failovers at one size, as compare.json rows."""
    raw: dict[str, Any] = {}
    size = asyncio.run(rescale.run_size(keyshift_args(args, keys, failover), keys, raw))
    outputs: list[list[float]] = raw["outputs"]
    rows = []
    for direction, (before, after) in (("2->4", (2, 4)), ("4->2", (4, 2))):
        moved: list[float | None] = []
        unmoved: list[float | None] = []
        walls = []
        for d, _, _, record in raw["events"]:
            if d != direction:
                continue
            start, end = float(record["started_at"]), float(record["finished_at"])
            movers = rescale.moved_key_groups(record)
            each = pauses(outputs, start, end)
            moved += [p for kg, p in enumerate(each) if kg in movers]
            unmoved += [p for kg, p in enumerate(each) if kg not in movers]
            walls.append(end - start)
        if walls:
            rows.append(
                rescale_row("keyshift", KEYSHIFT_MODE, keys, before, after, moved, unmoved, walls)
            )
    recoveries = [f["progressing_seconds"] for f in size["failovers"]]
    fo = [failover_row("keyshift", KEYSHIFT_MODE, keys, [r for r in recoveries if r is not None])]
    return {"rescale": rows, "failover": fo if recoveries else []}


def keyshift_throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    """keyshift's rows: one worker over the generator (Valkey, in-process state) and over
    a Kafka topic (state in Valkey), ``benchmarks/throughput.py``'s medians."""
    ns = argparse.Namespace(
        keys=args.throughput_keys,
        zipf=1.3,
        records=args.throughput_records,
        warmup=0.4,
        key_groups=8,
        cache_mb=256,
        checkpoint_interval=1.0,
        batch_size=2000,
        repeat=args.throughput_rounds,
        no_kafka=args.no_kafka,
    )
    settle_garbage_collector()  # the worker runs in this process: settled as a worker's is
    r = asyncio.run(ks_throughput.main(ns))
    order = {"valkey": 0, "in-process": 1, "kafka+valkey": 2}
    rows: list[dict[str, Any]] = sorted(r["rows"], key=lambda x: order.get(x["mode"], 9))
    return rows


FLINK_BACKENDS = ("rocksdb", "forst")


def flink_throughput(clusters: flink.Clusters, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Flink's rows: one task slot with RocksDB and with ForSt, ``--throughput-rounds``
    runs of each (the backends in turn in every round, as keyshift's rows alternate its
    stores); each row is its median run per CPU second, with every round's figures."""
    runs: dict[str, list[dict[str, Any]]] = {backend: [] for backend in FLINK_BACKENDS}
    for round_ in range(args.throughput_rounds):
        for backend in FLINK_BACKENDS:
            say(f"flink throughput, {backend}, round {round_ + 1}/{args.throughput_rounds}")
            runs[backend].append(
                flink.throughput(
                    clusters,
                    backend,
                    keys=args.throughput_keys,
                    records=args.throughput_records,
                    warmup=0.4,
                )
            )
    rows: list[dict[str, Any]] = []
    for each in runs.values():
        median = sorted(each, key=lambda r: r["records_per_cpu_second"])[len(each) // 2]
        rows.append(
            median
            | {
                "rounds_records_per_second": [r["records_per_second"] for r in each],
                "rounds_records_per_cpu_second": [r["records_per_cpu_second"] for r in each],
            }
        )
    return rows


# -- the run -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    m = rescale.machine()
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                m["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        m["java"] = out.stderr.splitlines()[0]
    m["flink"] = FLINK_VERSION
    return m


def run_throughput_only(args: argparse.Namespace) -> dict[str, Any]:
    """Measure the throughput rows again; keep the rescale and failover rows of the saved
    results (their command is kept and this one added), and the throughput rows of a
    system left out (``--no-keyshift``, ``--no-flink``)."""
    started = time.monotonic()
    data: dict[str, Any] = json.loads(args.output.read_text())
    command = "python -m benchmarks.compare" + "".join(f" {a}" for a in sys.argv[1:])
    data["throughput_command"] = (
        f"{data['throughput_command']}; then {command}"
        if data.get("throughput_command") and (args.no_keyshift or args.no_flink)
        else command
    )
    data["throughput_machine"] = machine()
    data["config"] |= {
        "throughput_keys": args.throughput_keys,
        "throughput_records": args.throughput_records,
        "throughput_rounds": args.throughput_rounds,
    }
    rows: list[dict[str, Any]] = []
    if not args.no_keyshift:
        say("keyshift throughput")
        rows += keyshift_throughput(args)
    if not args.no_flink:
        clusters = flink.Clusters(WORK / "compare")
        try:
            rows += flink_throughput(clusters, args)
        finally:
            clusters.stop()
    measured = {r["system"] for r in rows}
    kept = [r for r in data.get("throughput", []) if r["system"] not in measured]
    data["throughput"] = sorted(kept + rows, key=lambda r: r["system"] != "keyshift")
    seconds = data.get("run_seconds", 0.0)
    data["throughput_run_seconds"] = round(time.monotonic() - started, 1)
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    data["run_seconds"] = seconds
    return data


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    sizes = rescale.parse_sizes(args.sizes)
    modes = tuple(m for m in args.flink_modes.split(",") if m)
    forst_modes = tuple(m for m in args.forst_modes.split(",") if m)
    directions = ((2, 4),) if args.only_up else ((2, 4), (4, 2))
    data: dict[str, Any] = {
        "command": "python -m benchmarks.compare" + "".join(f" {a}" for a in sys.argv[1:]),
        "machine": machine(),
        "config": {
            "sizes": sizes,
            "rate": args.rate,
            "key_groups": KEY_GROUPS,
            "value_bytes": 100,
            "keyshift_repeats": args.repeats,
            "flink_modes": list(modes),
            "flink_backend": "rocksdb",
            "flink_forst_modes": list(forst_modes),
            "directions": [list(d) for d in directions],
            "failover_sizes": sizes[:1] if args.failover_first_only else sizes,
            "throughput_keys": args.throughput_keys,
            "throughput_records": args.throughput_records,
        },
        "rescale": [],
        "failover": [],
        "throughput": [],
        "flink_preload_seconds": {},
    }
    clusters = flink.Clusters(WORK / "compare")
    forst_clusters = flink.Clusters(WORK / "compare-forst", backend="forst")
    try:
        # throughput first: a run cut short during the largest size still has it
        if not args.no_throughput:
            if not args.no_keyshift:
                say("keyshift throughput")
                data["throughput"] += keyshift_throughput(args)
            if not args.no_flink:
                data["throughput"] += flink_throughput(clusters, args)
        for i, keys in enumerate(sizes):
            failover = not args.failover_first_only or i == 0
            if not args.no_keyshift:
                say(f"keyshift, {keys:,} keys")
                ks = keyshift_size(args, keys, failover)
                if args.only_up:
                    ks["rescale"] = [r for r in ks["rescale"] if r["to"] == 4]
                data["rescale"] += ks["rescale"]
                data["failover"] += ks["failover"]
            if not args.no_flink:
                say(f"flink, {keys:,} keys, modes {modes}")
                fl = flink.run_size(
                    keys,
                    clusters,
                    modes=modes,
                    rate=args.rate,
                    failover=failover,
                    directions=directions,
                )
                data["rescale"] += fl["rescale"]
                data["failover"] += fl["failover"]
                data["flink_preload_seconds"][str(keys)] = fl["preload_seconds"]
                if forst_modes:
                    clusters.stop()  # one Flink cluster at a time on 2 cores
                    say(f"flink ForSt, {keys:,} keys, modes {forst_modes}")
                    fo = flink.run_size(
                        keys,
                        forst_clusters,
                        modes=forst_modes,
                        rate=args.rate,
                        failover=False,
                        directions=directions,
                    )
                    forst_clusters.stop()
                    data["rescale"] += fo["rescale"]
                    data["flink_preload_seconds"][f"{keys} forst"] = fo["preload_seconds"]
            write(data, started, args.output)  # partial results survive an interruption
    finally:
        clusters.stop()
        forst_clusters.stop()
    write(data, started, args.output)
    return data


def write(data: dict[str, Any], started: float, path: Path) -> None:
    data["run_seconds"] = round(time.monotonic() - started, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


# -- plot and RESULTS.md -------------------------------------------------------------------


def series(data: dict[str, Any]) -> dict[tuple[str, str, int, int], list[dict[str, Any]]]:
    """Rescale rows by (system, mode, from, to), sorted by keys."""
    out: dict[tuple[str, str, int, int], list[dict[str, Any]]] = {}
    for r in data["rescale"]:
        out.setdefault((r["system"], r["mode"], r["from"], r["to"]), []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: r["keys"])
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = data["throughput"]
    panels = 3 if tp else 2  # no empty panel for a run without the throughput rows
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 5.8))
    ax, bx = axes[0], axes[1]
    colors = {
        "keyshift": "tab:green",
        "canonical": "tab:red",
        "native": "tab:orange",
        "adaptive": "tab:purple",
    }
    for (system, mode, before, after), rows in sorted(series(data).items()):
        color = (
            colors["keyshift"]
            if system == "keyshift"
            else "tab:brown"
            if mode.startswith("forst/")
            else colors.get(mode.split("/")[-1], "tab:gray")
        )
        style = "-" if after > before else "--"
        x = [r["keys"] for r in rows]
        ax.plot(
            x,
            [r["moved_pause_seconds_median"] for r in rows],
            "o" + style,
            color=color,
            label=f"{system} {mode} {before}→{after}",
        )
        if system == "keyshift":
            ax.plot(
                x,
                [r["unmoved_pause_seconds_max"] for r in rows],
                "x:",
                color=color,
                alpha=0.7,
                label=f"keyshift unmoved (max) {before}→{after}",
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="keys of state (~100 B each)",
        ylabel="seconds (median over key groups)",
        title="Rescale: pause of moved key groups (Flink: all)",
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")

    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in data["failover"]:
        by.setdefault((r["system"], r["mode"]), []).append(r)
    for (system, mode), rows in sorted(by.items()):
        rows.sort(key=lambda r: r["keys"])
        color = (
            colors["keyshift"]
            if system == "keyshift"
            else colors.get(mode.split("/")[-1], "tab:gray")
        )
        bx.plot(
            [r["keys"] for r in rows],
            [r["recovery_seconds"] for r in rows],
            "o-",
            color=color,
            label=f"{system} {mode}",
        )
    bx.axhline(3.0, color="red", linestyle=":", label="target 3 s")
    bx.set(
        xscale="log",
        xlabel="keys of state",
        ylabel="seconds",
        title="Failover: SIGKILL → every key group processing",
    )
    bx.set_ylim(bottom=0)
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3)

    if tp:
        cx = axes[2]
        labels = [f"{r['system']}\n{r['mode']}" for r in tp]
        x = list(range(len(tp)))
        colors_tp = ["tab:green" if r["system"] == "keyshift" else "tab:blue" for r in tp]
        cx.bar([i - 0.2 for i in x], [r["records_per_second"] for r in tp], width=0.4,
               color=colors_tp, label="records/s (wall)")  # fmt: skip
        cx.bar([i + 0.2 for i in x], [r.get("records_per_cpu_second") or 0 for r in tp],
               width=0.4, color=colors_tp, alpha=0.5, hatch="//",
               label="records per CPU second")  # fmt: skip
        cx.set_xticks(x, labels, fontsize=8)
        cx.set(ylabel="records", title="Throughput: one worker / one task slot, Zipf keys")
        cx.legend(fontsize=7)
        cx.grid(alpha=0.3, axis="y")
    fig.suptitle(f"keyshift vs Apache Flink {data['machine'].get('flink', '')} on one machine")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def markdown(data: dict[str, Any], plot_name: str = PLOT.name) -> str:
    m, cfg = data["machine"], data["config"]
    lines = [
        f"`{data['command']}` — run time {data['run_seconds'] / 60:.1f} min. Machine: "
        f"{m['nproc']} cores ({m['cpu']}), {m.get('memory_gib', '?')} GiB, CPython "
        f"{m['python']}, {m.get('java', 'java ?')}, Flink {m['flink']} (PyPI "
        f"`apache-flink`, its bundled distribution).",
        "",
        f"Workload on both: a keyed counter, one ~{cfg['value_bytes']}-byte value per key, "
        f"every key preloaded, {cfg['rate']:,.0f} records/s of uniformly spread keys, "
        f"{cfg['key_groups']} key groups (Flink: max parallelism {cfg['key_groups']}). "
        "keyshift: `benchmarks/rescale.py`'s runs (`keyshift run` + `keyshift scale --wait`, "
        "Valkey on loopback, checkpointInterval 200 ms, failoverAfter 2 s, "
        f"{cfg['keyshift_repeats']} repeat(s)). Flink: `benchmarks/peers/flink/` — a "
        "standalone session cluster on loopback (3 TaskManagers x 2 slots, RocksDB "
        "(*forst/...*: the ForSt backend on local disk), "
        "incremental checkpoints every 2 s, heartbeat timeout 4 s), `KeyedCounter.java`; "
        "*canonical* / *native* = stop with a savepoint of that format and resubmit at the "
        "new parallelism; *adaptive* = adaptive scheduler, resource requirements changed "
        "over REST (cooldown 1 s, rescale trigger max delay 2 s). Flink's preload: the "
        "source emits every key once before the steady input.",
        "",
        "Pause = per key group, the longest gap between two of its records processed that "
        "overlaps the rescale, from each job's own output; median and max over the key "
        "groups (keyshift: the moved ones; Flink: all 32, since every subtask restarts). "
        "*Unmoved* = key groups whose owner index stays (Flink: they restart too). Wall = "
        "keyshift's controller record; Flink: from the stop / REST request to every key "
        "group processing again.",
        "",
        "| keys | rescale | system | mode | pause median | pause max | unmoved max | wall |",
        "|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(
        data["rescale"], key=lambda r: (r["keys"], -r["to"], r["system"] != "keyshift", r["mode"])
    ):
        lines.append(
            f"| {r['keys']:,} | {r['from']} → {r['to']} | {r['system']} | {r['mode']} "
            f"| {ms(r['moved_pause_seconds_median'])} | {ms(r['moved_pause_seconds_max'])} "
            f"| {ms(r['unmoved_pause_seconds_max'])} | {ms(r['wall_seconds'])} |"
        )
    lines += [
        "",
        "Failover: keyshift, SIGKILL of worker 3 of 4 → every one of its key groups "
        "processing on a survivor; Flink, SIGKILL of a TaskManager running counter "
        "subtasks (at parallelism 4) → every key group processing again after the restart "
        "from the latest checkpoint (a spare TaskManager's slots available).",
        "",
        "| keys | system | mode | recovery |",
        "|---:|---|---|---:|",
    ]
    for r in sorted(data["failover"], key=lambda r: (r["keys"], r["system"] != "keyshift")):
        lines.append(
            f"| {r['keys']:,} | {r['system']} | {r['mode']} | {ms(r['recovery_seconds'])} |"
        )
    tp = data["throughput"]
    if tp:
        base = next((r["records_per_second"] for r in tp if r["mode"] == "valkey"), None)
        cpu_base = next(
            (r.get("records_per_cpu_second") for r in tp if r["mode"] == "valkey"), None
        )
        measured = (
            f"`{data['throughput_command']}` (the throughput rows measured again; the rows "
            "above are from the command at the top)"
            if "throughput_command" in data
            else "the command at the top"
        )
        lines += [
            "",
            f"Throughput ({measured}), {cfg['throughput_records']:,} records over "
            f"{cfg['throughput_keys']:,} Zipf(1.3) keys, the first 40% not measured: keyshift "
            "one worker process (`benchmarks/throughput.py`, 8 key groups, null sink; "
            "*kafka+valkey*: the same records read from a topic on the test broker, Tansu on "
            "loopback); Flink one task slot (parallelism 1: source and counter threads in one "
            "slot). Records per CPU second = records measured / CPU seconds (user + system) "
            "over exactly the measured window: keyshift, the worker process (`time."
            "process_time`); Flink, the TaskManager JVM that ran the job (`/proc/PID/stat` "
            "through psutil, sampled every 50 ms and interpolated at the progress marks that "
            "bound the window). *Cores* = those CPU seconds per wall second. Neither counts "
            "the state store's or broker's separate processes (keyshift's Valkey: the "
            "*with store* figure in the Worker throughput section) nor Flink's JobManager.",
            "",
            "| system | state | source | records/s | ratio | records per CPU second "
            "| ratio | cores |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in tp:
            ratio = f"{r['records_per_second'] / base:.2f}" if base else "-"
            cpu = r.get("records_per_cpu_second")
            cpu_ratio = f"{cpu / cpu_base:.2f}" if cpu and cpu_base else "-"
            cores = (
                r.get("worker_cores")
                if r["system"] == "keyshift"
                else (r.get("cpu") or {}).get("taskmanager_cores")
            )
            lines.append(
                f"| {r['system']} | {r['mode']} | {r.get('source', 'generator')} "
                f"| {r['records_per_second']:,} | {ratio} "
                f"| {f'{cpu:,}' if cpu else '-'} | {cpu_ratio} "
                f"| {f'{cores:.2f}' if cores else '-'} |"
            )
    lines += ["", *verdicts(data), "", f"![keyshift vs Flink]({plot_name})"]
    for note in data.get("notes") or []:  # a paragraph each
        lines += ["", note]
    return "\n".join(lines)


def verdicts(data: dict[str, Any]) -> list[str]:
    ks = [r for r in data["rescale"] if r["system"] == "keyshift"]
    fl = [r for r in data["rescale"] if r["system"] == "flink"]
    out = ["Targets:"]
    medians = [r["moved_pause_seconds_median"] for r in ks if r["moved_pause_seconds_median"]]
    if medians:
        spread = max(medians) / min(medians)
        out.append(
            f"- keyshift moved-key-group pause median {ms(min(medians))} to {ms(max(medians))} "
            f"over all sizes (factor {spread:.1f}; target ≤ 2 and < 200 ms): "
            f"{'met' if spread <= 2 and max(medians) < 0.2 else 'NOT met'}."
        )
    for keys in sorted({r["keys"] for r in ks} & {r["keys"] for r in fl}):
        best_ks = max(r["moved_pause_seconds_median"] or 0 for r in ks if r["keys"] == keys)
        best_fl = min(
            r["moved_pause_seconds_median"] or float("inf") for r in fl if r["keys"] == keys
        )
        if best_ks:
            out.append(
                f"- {keys:,} keys: Flink's best mode {ms(best_fl)} vs keyshift's worst "
                f"{ms(best_ks)}: {best_fl / best_ks:.0f}x (target ≥ 10x at 5e6 keys)."
            )
    quiet = [r["unmoved_pause_seconds_max"] for r in ks if r["unmoved_pause_seconds_max"]]
    if quiet:
        out.append(
            f"- keyshift's unmoved key groups: longest gap {ms(max(quiet))} during a rescale "
            f"(the normal gap between records at this rate is tens of ms; see the Rescale "
            "section's quiet gap): they do not pause. Flink's do (table)."
        )
    fo = [r["recovery_seconds"] for r in data["failover"] if r["system"] == "keyshift"]
    if fo:
        out.append(
            f"- keyshift failover {ms(min(fo))} to {ms(max(fo))} (target < 3 s): "
            f"{'met' if max(fo) < 3 else 'NOT met'}."
        )
    return out


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--quick",
        action="store_true",
        help="1e5,1e6 keys, Flink native savepoints only, 2 -> 4 only, "
        "short throughput runs (about 5 minutes)",
    )
    p.add_argument(
        "--sizes",
        default="1e5,1e6,5e6",
        help="keys, comma separated (add 1e7 "
        "for the largest size: about 25 more minutes on 2 cores)",
    )
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--repeats", type=int, default=2, help="keyshift rescale repeats per size")
    p.add_argument("--flink-modes", default="canonical,native,adaptive")
    p.add_argument(
        "--forst-modes",
        default="native",
        help="Flink modes also run with the ForSt state backend (empty: none)",
    )
    p.add_argument("--only-up", action="store_true", help="2 -> 4 only")
    p.add_argument(
        "--failover-first-only",
        action="store_true",
        help="failover only at the first size (default: at every size)",
    )
    p.add_argument("--throughput-keys", type=int, default=1_000_000)
    p.add_argument("--throughput-records", type=int, default=3_000_000)
    p.add_argument("--throughput-rounds", type=int, default=3)
    p.add_argument("--no-keyshift", action="store_true")
    p.add_argument("--no-flink", action="store_true")
    p.add_argument("--no-throughput", action="store_true")
    p.add_argument(
        "--only-throughput",
        action="store_true",
        help="measure the throughput rows again into the saved results (rescale and "
        "failover rows kept)",
    )
    p.add_argument("--no-kafka", action="store_true", help="no keyshift Kafka-source row")
    p.add_argument("--no-results-md", action="store_true")
    p.add_argument(
        "--note", action="append", help="a paragraph added under the figures (kept in the JSON)"
    )
    p.add_argument("--replot", action="store_true")
    p.add_argument("--output", type=Path, help=f"results JSON (default {RESULTS.name})")
    p.add_argument("--plot", type=Path, help=f"plot PNG (default {PLOT.name})")
    args = p.parse_args(argv)
    args.output = args.output or (QUICK_RESULTS if args.quick else RESULTS)
    args.plot = args.plot or (QUICK_PLOT if args.quick else PLOT)
    if args.quick:  # the quick run never replaces the full run's section
        args.no_results_md = True
    if args.quick:
        args.sizes, args.repeats, args.flink_modes, args.only_up = "1e5,1e6", 1, "native", True
        args.forst_modes = ""
        args.failover_first_only = True
        args.throughput_records, args.throughput_rounds = 500_000, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        data: dict[str, Any] = json.loads(args.output.read_text())
    elif args.only_throughput:
        data = run_throughput_only(args)
    else:
        data = run(args)
    if args.note:  # added to the saved notes (a --replot or --only-throughput keeps them)
        notes = list(data.get("notes") or [])
        data["notes"] = notes + [n for n in args.note if n not in notes]
        args.output.write_text(json.dumps(data, indent=1) + "\n")
    plot(data, args.plot)
    section = markdown(data, args.plot.name)
    print(f"\n## {SECTION}\n\n{section}")
    if not args.no_results_md:
        replace_section(SECTION, section)
    say(f"wrote {args.output} and {args.plot.name} ({data['run_seconds'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
