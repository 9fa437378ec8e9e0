"""What a load costs in CPU-hours: the autoscaler simulation's traces priced with each
system's measured records per CPU second.

    python -m benchmarks.cost [--load-scale 100] [--no-results-md] [--no-plot]

**Capacity per worker** (:func:`capacities`): one worker is given one CPU, and
processes what one CPU second of it processes when busy: the *records per CPU
second* measured on this machine for the counter over Zipf keys, read from
``benchmarks/results/compare.json``'s throughput rows (keyshift's worker process
and Flink's TaskManager JVM over the same measured window, in one run of
``python -m benchmarks.compare``); where compare.json has no such keyshift row,
``benchmarks/results/throughput.json``. Each figure's file and row is kept in
``cost.json``. keyshift is priced twice: its worker's CPU alone, and its
worker's plus the Valkey server's over the same window (``with store``), since a
user pays for that Valkey too; Flink's state (RocksDB) is inside its
TaskManager's CPU. Flink is priced with its best measured state backend per CPU
second.

**The runs** reuse :mod:`benchmarks.autoscaler_sim` (no second simulator): its
``simulate`` with ``JobModel.worker_capacity`` set to that capacity, the step,
drop and daily sine traces scaled by ``--load-scale`` (so that a peak needs many
workers at the measured capacities), plus :func:`business_hours_trace` (a trickle at
night) and :func:`business_idle_trace` (a week: input on weekdays 9-18 h, none at all
at night and on the weekend). Policies: keyshift's ``decide`` (``KeyshiftPolicy``,
rescale = moved key groups pause 1 s; on the traces in :data:`SCALE_TO_ZERO` with
``minParallelism: 0``, so that it scales to zero and, at zero, wakes by ``decide_wake``
every ``wakeCheckSeconds``: see :mod:`benchmarks.autoscaler_sim`), Flink's autoscaler default rules
(:class:`benchmarks.flink_autoscaler.FlinkAutoscaler`, rescale = 5 min restart)
and Flink provisioned statically for the trace's peak (:class:`Static`: the
smallest parallelism whose capacity at the autoscalers' 0.7 target utilisation
covers the peak's nominal load; never rescales). Each system starts at the
parallelism keyshift's rule would settle on for the initial load with its own
capacity.

**Waking from zero** (:func:`wake_targets`, :func:`wake_study`): for each wake, the
cold start (the input's first record while at zero -> workers processing) and the time
until the lag is under 10 s of input for good (until the next scale to zero), against the
issue's target (within 60 s); and, since the target depends on how fast the input comes
back, the same first wake on a short trace for several ramps from 0 to the peak
(``--wake-ramps``), keyshift alone.

**The price** (:func:`price`): CPU-hours = the simulation's worker-hours (every
worker running, new workers during their start-up included) x one CPU per
worker; at parallelism 0 nothing. Not priced: the control plane (keyshift's operator,
with its idle probe while a job is at zero; Flink's JobManager), which is one mostly
idle process for either.

Results: ``benchmarks/results/cost.json``, ``benchmarks/cost.png`` and the "Cost in
CPU-hours" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.autoscaler_sim import (
    FLINK_MODEL,
    KEYSHIFT_MODEL,
    LAG_OK_SECONDS,
    JobModel,
    JobView,
    KeyshiftPolicy,
    Policy,
    Run,
    Trace,
    Verdict,
    drop_trace,
    simulate,
    sine_trace,
    steady_parallelism,
    step_trace,
)
from benchmarks.flink_autoscaler import FlinkAutoscaler
from keyshift.api.spec import AutoscalerSpec
from keyshift.controller.autoscaling.decision import ScalingHistory

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "cost.json"
THROUGHPUT = HERE / "results" / "throughput.json"
COMPARE = HERE / "results" / "compare.json"
PLOT = HERE / "cost.png"
SECTION = "Cost in CPU-hours (simulation, measured capacity)"
CORES_PER_WORKER = 1.0
STATIC_UTILIZATION = 0.7
"""Static provisioning: the peak at the autoscalers' target utilisation (both 0.7)."""
DAILY = "sine"
"""The issue's "daily trace"."""
IDLE = "business_idle"
"""Issue 23's trace: idle nights and weekend, where keyshift scales to zero."""
SCALE_TO_ZERO = frozenset({IDLE})
"""Traces keyshift runs with ``minParallelism: 0`` (elsewhere: the spec's default, 1)."""
HOUR = 3600.0
DAY = 24 * HOUR
WAKE_LAG_OK_SECONDS = 60.0
"""The issue's target: the lag back under 10 s of input within this long after a wake."""
WAKE_RAMPS = (0.0, 60.0, 300.0, 1800.0)
"""Ramps (seconds from 0 to the peak) of :func:`wake_study`."""


# -- capacities ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    """Records per CPU second one system processes, and where the figure comes from."""

    name: str
    records_per_cpu_second: float
    source: str


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(HERE.parent))
    except ValueError:
        return str(path)


def capacities(
    throughput: dict[str, Any],
    compare: dict[str, Any],
    throughput_path: Path = THROUGHPUT,
    compare_path: Path = COMPARE,
) -> dict[str, Capacity]:
    """The figures each system is priced with (data in, data out): ``keyshift`` (the
    worker, Valkey state, generator source), ``keyshift+valkey`` (the worker and the Valkey
    server) and ``flink`` (the best Flink mode's TaskManager), each from compare.json's
    throughput rows, keyshift's from throughput.json where compare.json has none."""
    rows = [r for r in compare.get("throughput", []) if r.get("records_per_cpu_second")]
    out: dict[str, Capacity] = {}
    ks = next((r for r in rows if (r["system"], r["mode"]) == ("keyshift", "valkey")), None)
    ks_where = f"{_rel(compare_path)}: throughput[system=keyshift, mode=valkey]"
    if ks is None:
        ks = next(
            (r for r in throughput.get("rows", []) if r["mode"] == "valkey"),
            None,
        )
        ks_where = f"{_rel(throughput_path)}: rows[mode=valkey]"
    if ks is None:
        raise ValueError("no keyshift row with records_per_cpu_second")
    out["keyshift"] = Capacity(
        "keyshift", float(ks["records_per_cpu_second"]), f"{ks_where}.records_per_cpu_second"
    )
    if ks.get("records_per_cpu_second_with_store"):
        out["keyshift+valkey"] = Capacity(
            "keyshift+valkey",
            float(ks["records_per_cpu_second_with_store"]),
            f"{ks_where}.records_per_cpu_second_with_store",
        )
    flink = [r for r in rows if r["system"] == "flink"]
    if not flink:
        raise ValueError(f"{_rel(compare_path)}: no Flink row with records_per_cpu_second")
    best = max(flink, key=lambda r: float(r["records_per_cpu_second"]))
    out["flink"] = Capacity(
        f"flink/{best['mode']}",
        float(best["records_per_cpu_second"]),
        f"{_rel(compare_path)}: throughput[system=flink, mode={best['mode']}]"
        ".records_per_cpu_second (the best Flink mode: "
        + ", ".join(f"{r['mode']} {r['records_per_cpu_second']:,}" for r in flink)
        + ")",
    )
    return out


# -- traces --------------------------------------------------------------------------------


def business_hours_trace(
    peak: float = 8000.0,
    night: float = 0.01,
    duration: float = 86400.0,
    noise: float = 0.05,
    opens: float = 7 * HOUR,
    full: float = 9 * HOUR,
    closes: float = 17 * HOUR,
    idle: float = 19 * HOUR,
) -> Trace:
    """A working day: idle (``night`` x ``peak`` records/s, a trickle) until ``opens``, a
    ramp to ``peak`` by ``full``, ``peak`` until ``closes``, a ramp back down by ``idle``.
    The trickle rather than 0 keeps "lag in seconds of input" defined at night."""
    night = night * peak

    def shape(t: float) -> float:
        t = max(t, 0.0) % 86400.0
        if t < opens or t >= idle:
            return night
        if t < full:
            return night + (peak - night) * (t - opens) / (full - opens)
        if t < closes:
            return peak
        return peak - (peak - night) * (t - closes) / (idle - closes)

    return Trace(
        name="business",
        title=f"business hours {peak:,.0f} rec/s 9-17 h, idle ({night:,.0f}) 19-7 h, "
        f"+-{noise:.0%} noise",
        duration=duration,
        shape=shape,
        initial_parallelism=1,
        noise=noise,
        seed=13,
    )


def business_idle_trace(
    peak: float = 8000.0,
    ramp: float = 1800.0,
    noise: float = 0.05,
    opens: float = 9 * HOUR,
    closes: float = 18 * HOUR,
    weekdays: int = 5,
    duration: float = 7 * DAY,
) -> Trace:
    """A week from Monday 0 h: on the first ``weekdays`` days input from ``opens`` to
    ``closes`` (up from 0 to ``peak`` over ``ramp`` seconds after opening, back to 0 over
    the ``ramp`` before closing; 0: a step), and none at all otherwise: nights and the
    weekend are truly idle (noise multiplies the load, so 0 stays 0)."""

    def shape(t: float) -> float:
        day, s = divmod(max(t, 0.0), DAY)
        if int(day) % 7 >= weekdays or s < opens or s >= closes:
            return 0.0
        if ramp <= 0:
            return peak
        return peak * min(1.0, (s - opens) / ramp, (closes - s) / ramp)

    how = f"ramps {ramp / 60:g} min" if ramp > 0 else "steps"
    return Trace(
        name=IDLE,
        title=f"business hours, idle nights and weekend: {peak:,.0f} rec/s weekdays "
        f"{opens / HOUR:g}-{closes / HOUR:g} h ({how}), 0 otherwise, +-{noise:.0%} noise",
        duration=duration,
        shape=shape,
        initial_parallelism=1,
        noise=noise,
        seed=17,
    )


def traces(scale: float) -> list[Trace]:
    """The simulation's step, drop and daily sine traces and the two business-hours ones,
    their loads times ``scale``."""
    return [
        step_trace(base=2000.0 * scale),
        drop_trace(base=2000.0 * scale),
        sine_trace(low=2000.0 * scale, high=8000.0 * scale),
        business_hours_trace(peak=8000.0 * scale),
        business_idle_trace(peak=8000.0 * scale),
    ]


def peak_load(trace: Trace, step: float = 60.0) -> float:
    """The trace's highest nominal load (noise excluded), sampled every ``step`` s."""
    n = int(trace.duration // step) + 1
    return max(trace.shape(i * step) for i in range(n))


# -- policies ------------------------------------------------------------------------------


class Static:
    """Never rescales: the parallelism it starts at is the one it keeps."""

    name = "flink-static"
    interval_seconds = 60.0
    metrics_window_seconds = 60.0

    def evaluate(self, view: JobView) -> Verdict:
        return Verdict(None, "static", "provisioned for the peak")


def static_parallelism(peak: float, model: JobModel, utilization: float) -> int:
    """The smallest parallelism whose capacity at ``utilization`` covers ``peak``."""
    for p in range(1, model.key_groups + 1):
        if model.capacity(p) * utilization >= peak:
            return p
    return model.key_groups


@dataclass(frozen=True)
class System:
    """One priced row: a policy on a model whose worker capacity is the measured one."""

    name: str
    label: str
    capacity: Capacity
    base: JobModel
    static: bool = False

    def model(self) -> JobModel:
        return dataclasses.replace(
            self.base, worker_capacity=self.capacity.records_per_cpu_second * CORES_PER_WORKER
        )

    def policy(self, min_parallelism: int = 1) -> Policy:
        """A fresh policy; keyshift's with ``minParallelism`` (Flink's autoscaler cannot go
        below 1)."""
        if self.static:
            return Static()
        if self.base.pause_all:
            return FlinkAutoscaler()
        return KeyshiftPolicy(AutoscalerSpec(enabled=True, min_parallelism=min_parallelism))

    def start(self, trace: Trace) -> int:
        m = self.model()
        if self.static:
            return static_parallelism(peak_load(trace), m, STATIC_UTILIZATION)
        return steady_parallelism(trace.shape(0.0), m)


def systems(caps: dict[str, Capacity]) -> list[System]:
    out = [System("keyshift", "keyshift, autoscaler", caps["keyshift"], KEYSHIFT_MODEL)]
    if "keyshift+valkey" in caps:
        out.append(
            System(
                "keyshift+valkey",
                "keyshift + Valkey CPU, autoscaler",
                caps["keyshift+valkey"],
                KEYSHIFT_MODEL,
            )
        )
    out += [
        System("flink", "Flink, autoscaler defaults", caps["flink"], FLINK_MODEL),
        System("flink-static", "Flink, static for the peak", caps["flink"], FLINK_MODEL, True),
    ]
    return out


# -- pricing -------------------------------------------------------------------------------


def price(summary: dict[str, Any], cores_per_worker: float = CORES_PER_WORKER) -> float:
    """CPU-hours of one simulated run (its ``Run.summary()``): worker-hours x cores."""
    return float(summary["worker_hours"]) * cores_per_worker


def targets(cpu_hours: dict[str, dict[str, float]], keyshift: str = "keyshift") -> dict[str, Any]:
    """The issue's targets on every trace (data in, data out): keyshift's CPU-hours below
    Flink's autoscaler's, and at most half of Flink's static peak provisioning."""
    out: dict[str, Any] = {}
    for trace, by in cpu_hours.items():
        ks = by[keyshift]
        out[trace] = {
            "vs_flink_autoscaler": round(ks / by["flink"], 3),
            "below_flink_autoscaler": ks < by["flink"],
            "vs_flink_static": round(ks / by["flink-static"], 3),
            "at_most_half_of_flink_static": ks <= 0.5 * by["flink-static"],
        }
    return out


def wake_targets(wakes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's wake target over a run's wakes (``Wake.summary()``s; data in, data out):
    the lag back under 10 s of input within ``WAKE_LAG_OK_SECONDS`` of the input's return,
    after every wake."""
    ok_after = [float(w["lag_ok_after_seconds"]) for w in wakes]
    cold = [float(w["cold_start_seconds"]) for w in wakes if w["cold_start_seconds"] is not None]
    return {
        "wakes": len(wakes),
        "max_cold_start_seconds": max(cold, default=None),
        "max_lag_ok_after_seconds": max(ok_after, default=None),
        "max_lag_seconds": max((float(w["max_lag_seconds"]) for w in wakes), default=None),
        "lag_ok_within_target": bool(wakes) and max(ok_after) <= WAKE_LAG_OK_SECONDS,
    }


def wake_study(
    system: System, peak: float, ramps: Sequence[float] = WAKE_RAMPS
) -> list[dict[str, Any]]:
    """keyshift (``minParallelism: 0``) asleep for 30 min, then the input back with each
    ramp up to ``peak``, held for an hour: the first wake's figures per ramp."""
    out = []
    for ramp in ramps:
        trace = business_idle_trace(
            peak=peak, ramp=ramp, opens=1800.0, closes=1800.0 + 3 * HOUR,
            duration=1800.0 + max(ramp, 0.0) + HOUR,
        )  # fmt: skip
        policy = system.policy(0)
        if isinstance(policy, KeyshiftPolicy):  # as after an earlier day awake: the history
            # holds the per-worker capacity it measured (a wake is sized with it)
            policy.history = ScalingHistory(capacity=system.model().worker_capacity)
        run = simulate(trace, policy, system.model())
        wake = run.wakes[0].summary() if run.wakes else None
        out.append({"ramp_seconds": ramp, "wake": wake,
                    "max_lag_seconds": round(run.max_lag_seconds, 1)})  # fmt: skip
        if wake is not None:
            print(
                f"wake, ramp {ramp:6,.0f} s: to {wake['to']} ({wake['backlog_records']:,} "
                f"waiting), cold start {wake['cold_start_seconds']} s, lag < "
                f"{LAG_OK_SECONDS:g} s of input after {wake['lag_ok_after_seconds']:,.0f} s, "
                f"max {wake['max_lag_seconds']:,.0f} s",
                flush=True,
            )
    return out


def run_all(
    trace_list: Sequence[Trace], system_list: Sequence[System]
) -> dict[str, dict[str, Run]]:
    out: dict[str, dict[str, Run]] = {}
    for trace in trace_list:
        out[trace.name] = {}
        for s in system_list:
            t = dataclasses.replace(trace, initial_parallelism=s.start(trace))
            policy = s.policy(0 if trace.name in SCALE_TO_ZERO else 1)
            run = simulate(t, policy, s.model())
            out[trace.name][s.name] = run
            wakes = f", {len(run.wakes)} wakes" if run.wakes else ""
            print(
                f"{trace.name:>13} {s.name:>15}: {price(run.summary()):8.1f} CPU-h, "
                f"{len(run.actions)} rescales{wakes}, max lag {run.max_lag_seconds:,.0f} s of "
                f"input, start {t.initial_parallelism}, final {run.final_parallelism}",
                flush=True,
            )
    return out


# -- plot and RESULTS.md -------------------------------------------------------------------


COLORS = {
    "keyshift": "tab:green",
    "keyshift+valkey": "tab:olive",
    "flink": "tab:red",
    "flink-static": "tab:gray",
}


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 2, figsize=(19, 11))
    axes = grid.flatten()
    labels = {s["name"]: s["label"] for s in data["systems"]}
    shown = [n for n in (DAILY, "business", IDLE) if n in data["series"]]
    for ax, name in zip(axes, shown, strict=False):
        trace = next(t for t in data["traces"] if t["name"] == name)
        unit, axis = (DAY, "days from Monday 0 h") if trace["duration_seconds"] > 2 * DAY else (
            HOUR, "hours")  # fmt: skip
        series = data["series"][name]
        for system, sr in series.items():
            cpu_h = data["cpu_hours"][name][system]
            ax.step([t / unit for t in sr["t"]], [p * CORES_PER_WORKER for p in sr["parallelism"]],
                    where="post", color=COLORS.get(system, "tab:blue"), lw=1.4,
                    label=f"{labels[system]}: {cpu_h:,.0f} CPU-h")  # fmt: skip
        ax.set_title(trace["title"], fontsize=9)
        ax.set(xlabel=axis, ylabel="CPUs (workers x 1 CPU)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        load = next(iter(series.values()))
        bx = ax.twinx()
        bx.plot([t / unit for t in load["t"]], [x / 1e3 for x in load["load"]], color="tab:blue",
                lw=0.8, alpha=0.5, label="load")  # fmt: skip
        bx.set_ylabel("load, thousand records/s")
        bx.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper left")
    cx = axes[3]
    names = [t["name"] for t in data["traces"]]
    systems_ = [s["name"] for s in data["systems"]]
    width = 0.8 / len(systems_)
    for i, system in enumerate(systems_):
        cx.bar([j + (i - (len(systems_) - 1) / 2) * width for j in range(len(names))],
               [data["cpu_hours"][n][system] for n in names], width=width,
               color=COLORS.get(system, "tab:blue"), label=labels[system])  # fmt: skip
    cx.set_xticks(range(len(names)), [_trace_label(t) for t in data["traces"]], fontsize=8)
    cx.set(ylabel="CPU-hours", title="CPU-hours per trace", yscale="log")
    cx.legend(fontsize=7)
    cx.grid(alpha=0.3, axis="y", which="both")
    fig.suptitle(
        "Cost: the autoscaler simulation priced with measured records per CPU second "
        f"(keyshift {data['capacities']['keyshift']['records_per_cpu_second']:,.0f}, "
        f"{data['capacities']['flink']['name']} "
        f"{data['capacities']['flink']['records_per_cpu_second']:,.0f} per CPU second; "
        "1 CPU per worker)"
    )
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.97))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _trace_label(t: dict[str, Any]) -> str:
    return f"{t['name']}\n{t['duration_seconds'] / HOUR:g} h"


DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _when(t: float) -> str:
    """Simulation time on the week trace: day and time of day (t = 0: Monday 0 h)."""
    day, s = divmod(round(t), round(DAY))
    return f"{DAYS[day % 7]} {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} s"


def idle_markdown(data: dict[str, Any]) -> str:
    """The scale-to-zero part: the week trace's rows, its wakes and the wake study."""
    trace = next(t for t in data["traces"] if t["name"] == IDLE)
    labels = {s["name"]: s["label"] for s in data["systems"]}
    hours = data["cpu_hours"][IDLE]
    static, flink = hours["flink-static"], hours["flink"]
    records = data["records"][IDLE]
    rows = []
    for s in data["systems"]:
        n = s["name"]
        wt = data["wake_targets"].get(n)
        par = data["parallelism"][IDLE][n]
        wake_cells = "- | - | - | -"
        if wt is not None:
            met = hours[n] <= 0.5 * static and wt["lag_ok_within_target"]
            wake_cells = (
                f"{wt['wakes']} | {_s(wt['max_cold_start_seconds'])} | "
                f"{_s(wt['max_lag_ok_after_seconds'])} | {'met' if met else 'NOT met'}"
            )
        rows.append(
            f"| {labels[n]} | {hours[n]:,.1f} | {round(hours[n] / static, 3):.2f} "
            f"| {round(hours[n] / flink, 3):.2f} "
            f"| {data['hours_at_zero'][IDLE][n]:,.1f} | {par['min']}-{par['max']} | {wake_cells} |"
        )
    lost = max(abs(r["arrived"] - r["processed"] - r["final_lag"]) for r in records.values())
    ks_records = records["keyshift"]
    wakes = "\n".join(
        f"| {i} | {_when(w['input_at'])} | {w['to']} ({w['backlog_records']:,}) | "
        f"{_s(w['cold_start_seconds'])} | {_s(w['lag_ok_after_seconds'])} | "
        f"{w['max_lag_seconds']:,.1f} s | "
        f"{'-' if w['asleep_at'] is None else _when(w['asleep_at'])} |"
        for i, w in enumerate(data["wakes"][IDLE].get("keyshift", []), 1)
    )
    study = data["wake_study"]
    study_rows = []
    missed = []
    for r in study["rows"]:
        w = r["wake"]
        if w is None:
            study_rows.append(f"| {_s(r['ramp_seconds'])} | no wake | | | | |")
            continue
        ok = w["lag_ok_after_seconds"] <= WAKE_LAG_OK_SECONDS
        if not ok:
            missed.append(r)
        study_rows.append(
            f"| {_s(r['ramp_seconds'])} | {w['to']} ({w['backlog_records']:,}) | "
            f"{_s(w['cold_start_seconds'])} | {_s(w['lag_ok_after_seconds'])} | "
            f"{w['max_lag_seconds']:,.1f} s | {'met' if ok else 'NOT met'} |"
        )
    why = ""
    if missed:
        first = missed[0]["wake"]
        why = (
            f"Where it is missed (ramps of {', '.join(_s(r['ramp_seconds']) for r in missed)}): "
            "`decide_wake` sizes the wake for the arrival rate between the last two checks "
            "(one check interval of a ramp that has only begun) plus the backlog "
            f"({first['backlog_records']:,} records) worked off within `catchUpSeconds`, which "
            f"gives {first['to']} worker(s); the input keeps rising after the wake, and the woken "
            "workers leave the metrics window incomplete for `metricsWindowSeconds` (60 s), so "
            "the next scale-up comes a minute later, with that minute's input waiting.\n\n"
        )
    return (
        f"### Scale to zero: {trace['title']}, {trace['duration_seconds'] / DAY:g} days\n\n"
        "keyshift runs this trace with `minParallelism: 0` (`scaleToZeroAfter` 300 s, "
        "`wakeCheckSeconds` 1 s, the rest the defaults): once 300 s of complete windows showed "
        "no input and no lag it scales to 0 (`idle`); at 0 no worker runs and none is charged, "
        "and every second the policy asks `decide_wake` with the backlog (input arrived, not "
        "processed) and the arrival rate since the previous check (the backlog's growth). "
        "A wake is a scale-up from 0 in the simulation's model: the workers start "
        "5 s before the handoff, then every key group pauses 1 s, so the cold start is the "
        "detection (<= 1 s check interval) + 6 s, more than the local cold start measured "
        'under "Cold start from zero" (0.6-1.4 s). Flink\'s autoscaler cannot go below 1 '
        "worker; Flink static keeps its peak parallelism. Records processed = records arrived "
        f"by the end of the week (keyshift: {ks_records['processed']:,.0f} of "
        f"{ks_records['arrived']:,.0f}; largest |arrived - processed - lag| of any row: "
        f"{lost:,.0f}).\n\n"
        "Target (issue 23 §4): keyshift at most half of Flink static's CPU-hours, and after "
        "each wake the lag back under 10 s of input within 60 s. *Lag ok after* = from the "
        "input's first record while at zero until the lag stays under 10 s of input for the "
        "rest of the time awake (0: it never reached 10 s); *cold start* = that record -> the "
        "woken workers process.\n\n"
        "| priced as | CPU-hours | / Flink static | / Flink autoscaler | hours at 0 workers "
        "| workers | wakes | cold start, max | lag ok after, max | target |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n" + "\n".join(rows) + "\n\n"
        "keyshift's wakes (worker CPU; days from Monday 0 h; *woke to* workers, with the "
        "records waiting at the decision):\n\n"
        "| wake | input back | woke to | cold start | lag ok after | max lag while awake "
        "(s of input) | back to 0 at |\n|---:|---|---:|---:|---:|---:|---|\n" + wakes + "\n\n"
        "How fast the input comes back decides the lag after a wake: the same first wake "
        "(keyshift, worker CPU, its history holding the per-worker capacity measured on an "
        f"earlier day, 30 min at zero, then the input from 0 to {study['peak']:,.0f} "
        "rec/s over the ramp, held for an hour; `python -m benchmarks.cost` runs it, "
        "`--wake-ramps`):\n\n"
        "| ramp 0 -> peak | woke to | cold start | lag ok after | max lag (s of input) "
        "| within 60 s |\n|---:|---:|---:|---:|---:|---|\n" + "\n".join(study_rows) + "\n\n" + why
    )


def capacity_ratio(data: dict[str, Any]) -> str:
    """keyshift's measured capacity against Flink's, in words for the section."""
    caps = data["capacities"]
    ratio = caps["keyshift"]["records_per_cpu_second"] / caps["flink"]["records_per_cpu_second"]
    more = "more" if ratio >= 1 else "less"
    return (
        f"keyshift's worker does {ratio:.2f}x the records per CPU second of Flink's best "
        f"mode here, {more} work per CPU"
    )


def results_markdown(data: dict[str, Any]) -> str:
    caps, m = data["capacities"], data["machine"]
    sys_names = [s["name"] for s in data["systems"]]
    labels = {s["name"]: s["label"] for s in data["systems"]}
    cap_rows = "\n".join(
        f"| {labels[s['name']]} | {caps[s['capacity']]['records_per_cpu_second']:,.0f} "
        f"| `{caps[s['capacity']]['source']}` |"
        for s in data["systems"]
    )
    head = " | ".join(labels[n] for n in sys_names)
    rows = []
    for t in data["traces"]:
        by = data["cpu_hours"][t["name"]]
        lags = data["max_lag_seconds"][t["name"]]
        tv = data["targets"]["keyshift"][t["name"]]
        cells = " | ".join(
            f"{by[n]:,.1f} ({data['rescales'][t['name']][n]}; {lags[n]:,.0f} s)" for n in sys_names
        )
        rows.append(
            f"| {t['title']}, {t['duration_seconds'] / HOUR:g} h | {cells} "
            f"| {tv['vs_flink_autoscaler']:.2f} | {tv['vs_flink_static']:.2f} |"
        )
    verdicts = []
    for key, label in (("keyshift", "worker CPU"), ("keyshift+valkey", "worker + Valkey CPU")):
        v = data["targets"].get(key)
        if not v:
            continue
        for name in (DAILY, "business", IDLE):
            if name not in v:
                continue
            tv = v[name]
            verdicts.append(
                f"- {name} trace{' (the daily trace)' if name == DAILY else ''}, keyshift "
                f"priced with its {label}: {tv['vs_flink_autoscaler']:.2f}x Flink's autoscaler "
                f"(target < 1: {'met' if tv['below_flink_autoscaler'] else 'NOT met'}), "
                f"{tv['vs_flink_static']:.2f}x Flink static for the peak (target <= 0.5: "
                f"{'met' if tv['at_most_half_of_flink_static'] else 'NOT met'})."
            )
    daily = data["targets"]["keyshift"][DAILY]
    ks_cap = caps["keyshift"]["records_per_cpu_second"]
    need = (
        f"Roughly what keyshift's worker would need for the daily-trace targets, if its "
        f"CPU-hours scaled with 1 / capacity (they do only roughly: parallelism is whole "
        f"workers, aligned): {ks_cap * daily['vs_flink_autoscaler']:,.0f} records per CPU "
        f"second to match Flink's autoscaler and {ks_cap * daily['vs_flink_static'] / 0.5:,.0f} "
        f"for half of Flink's static provisioning (measured: {ks_cap:,.0f}).\n\n"
    )
    return (
        f"`{data['command']}` — no processes: `benchmarks/autoscaler_sim.py`'s `simulate` and "
        "policies, each system's `JobModel.worker_capacity` set to its measured records per "
        "CPU second (one CPU per worker), priced as CPU-hours = worker-hours x 1 CPU. "
        f"Capacities measured on: {m.get('nproc', '?')} cores ({m.get('cpu', '?')}), CPython "
        f"{m.get('python', '?')}, {m.get('java', 'java ?')}, Flink {m.get('flink', '?')}; "
        'the counter over 1,000,000 Zipf(1.3) keys (see "Side by side with Apache Flink": '
        "keyshift one worker process, Flink one task slot, CPU over the measured window).\n\n"
        "| priced as | records per CPU second (= per worker) | from |\n|---|---:|---|\n"
        f"{cap_rows}\n\n"
        f"Traces: `benchmarks/autoscaler_sim.py`'s step, drop and daily sine, loads x "
        f"{data['load_scale']:g}, a business-hours day (idle from 19 h to 7 h: a "
        "trickle of 1% of the peak; ramps 7-9 h and 17-19 h) and a business-hours week "
        "(input on weekdays 9-18 h, nothing at all at night and on the weekend; below), "
        "+-5% noise where named. "
        "keyshift: `decide` with the `AutoscalerSpec` defaults (on the week: "
        "`minParallelism: 0`), a rescale moves key ranges "
        "(new workers start 5 s before, moved key groups pause 1 s). Flink: its Kubernetes "
        "operator autoscaler's default rules (`benchmarks/flink_autoscaler.py`), a rescale "
        "restarts the job (5 min, nothing processed); static = the smallest parallelism "
        f"whose capacity at {STATIC_UTILIZATION:g} utilisation covers the peak's nominal "
        "load. Each starts at the parallelism keyshift's rule gives the initial load with "
        "its own capacity (static: its peak parallelism). Not priced: the control plane "
        "(keyshift's operator, with its idle probe at zero; Flink's JobManager); the Kafka "
        "broker, if any.\n\n"
        "Cells: CPU-hours (rescales; max lag in seconds of input, over the steps with "
        "input).\n\n"
        f"| trace | {head} | keyshift / Flink autoscaler | keyshift / Flink static |\n"
        f"|---|{'---:|' * (len(sys_names) + 2)}\n" + "\n".join(rows) + "\n\n"
        "Targets (issue 18, keyshift's CPU-hours on the daily trace below Flink's "
        "autoscaler's, and at most half of Flink's static peak provisioning; issue 23, the "
        "same on the idle week):\n"
        + "\n".join(verdicts)
        + "\n\n"
        + need
        + "![cost in CPU-hours](cost.png)\n\n"
        "What decides these figures: the capacities per CPU second (measured, one machine, "
        f"one workload: a counter whose per-record work is small; {capacity_ratio(data)}) "
        "and the autoscalers' reaction "
        "(simulated: Flink's figures are its default rules on this model, with a 5 min "
        "restart, not a measured Flink job). keyshift's autoscaler follows the load more "
        "closely and keeps the lag at seconds, where Flink's runs hotter and lets minutes of "
        "lag build (the cells); where the ratio to Flink's autoscaler is above 1, what "
        "keyshift pays for that (or for a lower capacity) outweighs the rest. The "
        "capacities come from one run (its "
        'conditions in the notes under "Side by side with Apache Flink"); on a machine '
        "shared with other work they move by tens of percent between runs; the load scale "
        "and whole-worker granularity move the CPU-hours too (`--load-scale`).\n"
        + "".join(f"\n{n}\n" for n in data.get("notes") or [])
        + ("\n" + idle_markdown(data) if IDLE in data["cpu_hours"] and "wake_study" in data else "")
    )


# -- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--load-scale", type=float, default=100.0,
                        help="the simulation traces' loads times this (default 100: the daily "
                        "sine 200,000-800,000 records/s)")  # fmt: skip
    parser.add_argument("--throughput", type=Path, default=THROUGHPUT)
    parser.add_argument("--compare", type=Path, default=COMPARE)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--note", action="append", help="a paragraph added under the figures (kept in the JSON)"
    )
    parser.add_argument(
        "--wake-ramps",
        type=lambda v: tuple(float(x) for x in v.split(",") if x.strip()),
        default=WAKE_RAMPS,
        help="seconds from 0 to the peak, comma-separated, for the wake study (default "
        + ",".join(f"{r:g}" for r in WAKE_RAMPS)
        + "; empty: no study)",
    )
    args = parser.parse_args(argv)
    compare = json.loads(args.compare.read_text())
    throughput = json.loads(args.throughput.read_text())
    caps = capacities(throughput, compare, args.throughput, args.compare)
    for c in caps.values():
        print(f"{c.name}: {c.records_per_cpu_second:,.0f} records per CPU second ({c.source})")
    system_list = systems(caps)
    trace_list = traces(args.load_scale)
    runs = run_all(trace_list, system_list)
    idle_peak = 8000.0 * args.load_scale
    study = wake_study(system_list[0], idle_peak, args.wake_ramps) if args.wake_ramps else None
    cpu_hours = {
        t: {s: round(price(r.summary()), 2) for s, r in by.items()} for t, by in runs.items()
    }
    data: dict[str, Any] = {
        "command": "python -m benchmarks.cost" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
        "load_scale": args.load_scale,
        "cores_per_worker": CORES_PER_WORKER,
        "static_utilization": STATIC_UTILIZATION,
        "machine": compare.get("throughput_machine") or compare.get("machine", {}),
        "capacities": {k: dataclasses.asdict(c) for k, c in caps.items()},
        "systems": [
            {
                "name": s.name,
                "label": s.label,
                "capacity": next(k for k, c in caps.items() if c == s.capacity),
                "rescale_model": dataclasses.asdict(s.model()),
                "policy": s.policy().name,
            }
            for s in system_list
        ],
        "traces": [
            {
                "name": t.name,
                "title": t.title,
                "duration_seconds": t.duration,
                "peak_records_per_second": peak_load(t),
                "noise": t.noise,
            }
            for t in trace_list
        ],
        "cpu_hours": cpu_hours,
        "rescales": {t: {s: len(r.actions) for s, r in by.items()} for t, by in runs.items()},
        "max_lag_seconds": {
            t: {s: round(r.max_lag_seconds, 1) for s, r in by.items()} for t, by in runs.items()
        },
        "parallelism": {
            t: {s: {"min": min(r.parallelism), "max": max(r.parallelism)} for s, r in by.items()}
            for t, by in runs.items()
        },
        "targets": {k: targets(cpu_hours, k) for k in ("keyshift", "keyshift+valkey") if k in caps},
        "scale_to_zero_traces": sorted(SCALE_TO_ZERO),
        "hours_at_zero": {
            t: {s: round(r.seconds_at_zero / HOUR, 2) for s, r in by.items()}
            for t, by in runs.items()
        },
        "records": {
            t: {
                s: {
                    "arrived": round(r.records_arrived),
                    "processed": round(r.records_processed),
                    "final_lag": round(r.final_lag),
                }
                for s, r in by.items()
            }
            for t, by in runs.items()
        },
        "wakes": {
            t: {s: [w.summary() for w in r.wakes] for s, r in by.items() if r.wakes}
            for t, by in runs.items()
        },
        "wake_targets": {
            s: wake_targets([w.summary() for w in r.wakes])
            for s, r in runs.get(IDLE, {}).items()
            if r.wakes
        },
        "series": {
            t: {
                s: {
                    "t": [round(x) for x in r.times],
                    "load": [round(x) for x in r.load],
                    "parallelism": r.parallelism,
                }
                for s, r in by.items()
            }
            for t, by in runs.items()
        },
        "python": platform.python_version(),
    }
    if study is not None:
        data["wake_study"] = {
            "system": system_list[0].name,
            "peak": idle_peak,
            "asleep_seconds": 1800.0,
            "rows": study,
        }
    if args.note:
        data["notes"] = list(args.note)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.output}")
    if not args.no_plot:
        plot(data, PLOT)
        print(f"wrote {PLOT}")
    section = results_markdown(data)
    if args.no_results_md:
        print(section)
    else:
        from benchmarks.results_md import replace_section

        replace_section(SECTION, section)
        print("updated benchmarks/RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
