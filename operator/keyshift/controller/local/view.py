"""How a person sees a running job: the live terminal view and plain log lines.

Both render a status document (``core/status.py``); neither does any I/O.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from keyshift.controller.autoscaling.metrics.base import ScalingMetric
from keyshift.controller.core.status import FAILED_HINT, failed_by_reason


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "?"
    return f"{value:,.{digits}f}{unit}"


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value * 100:.1f}%"


def _when(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def render(doc: dict[str, Any], events: Sequence[str] = ()) -> Group:
    """The live view: job summary, workers, rescales, recent events."""
    rescaling = doc["rescale_in_progress"]
    head = Text.assemble(
        (f"{doc['job']}", "bold"),
        f"  parallelism {doc['parallelism']}",
        (" (idle: scaled to zero)", "cyan") if doc.get("phase") == "Idle" else "",
        (f" -> {doc['desired_parallelism']}", "yellow")
        if doc["desired_parallelism"] != doc["parallelism"]
        else "",
        f"  generation {doc['generation']}  key groups {doc['key_groups']}",
        f"  input {_num(doc['rates']['input'])}/s",
        f"  processed {_num(doc['rates']['processed'])}/s",
        f"  lag {_num(doc['lag'])}",
        f"  cache hits {_pct(doc['cache_hit_ratio'])}",
    )
    if rescaling:
        head.append(
            f"\nrescaling {rescaling['from']} -> {rescaling['to']} ({rescaling['reason']}): "
            f"{rescaling['phase']}",
            style="yellow",
        )
    auto = doc.get("autoscaler")
    if auto and auto.get("last"):
        last = auto["last"]
        head.append(
            f"\nautoscaler ({auto['mode']}): {last['action']} {last['current']} -> "
            f"{last['desired']} [{last['reason']}] {last['message']}",
            style="red" if last["action"] == "blocked" else "cyan",
        )
    elif auto:
        head.append(f"\nautoscaler ({auto['mode']}): collecting a first window", style="dim")
    if doc.get("finished"):
        head.append("\nfinished: every key group processed its whole input", style="green")
    for line in failed_lines(doc):
        head.append("\n" + line, style="bold red")
    if not doc["metrics_complete"] and doc["metrics_missing"]:
        head.append("\nmetrics incomplete: " + "; ".join(doc["metrics_missing"][:3]), style="dim")

    workers = Table(expand=True, box=None, header_style="bold")
    for column in ("worker", "pid", "ready", "key groups", "processed/s", "busy", "lag", "cache"):
        workers.add_column(column, justify="left" if column == "key groups" else "right")
    for w in doc["workers"]:
        ready = Text("yes", "green") if w["ready"] else Text("no", "red")
        workers.add_row(
            str(w["ordinal"]), str(w["pid"] or "-"), ready, w["key_ranges"],
            _num(w[ScalingMetric.PROCESSED_RATE]), _pct(w[ScalingMetric.BUSY_RATIO]),
            _num(w[ScalingMetric.LAG]), _pct(w[ScalingMetric.CACHE_HIT_RATIO]),
        )  # fmt: skip

    rescales = Table(expand=True, box=None, header_style="bold")
    for column in ("started", "from", "to", "reason", "took", "longest pause", "outcome"):
        rescales.add_column(column, justify="right")
    for r in doc["rescales"][-8:]:
        rescales.add_row(
            _when(r["started_at"]), str(r["from"]), str(r["to"]), r["reason"],
            _num(r["duration_seconds"], " s", 2),
            _num(None if r["max_pause_seconds"] is None else r["max_pause_seconds"] * 1000,
                 " ms"),
            Text(r["outcome"] or "", "green" if r["outcome"] == "succeeded" else "red"),
        )  # fmt: skip

    parts: list[Any] = [
        head,
        Panel(workers, title="workers", title_align="left"),
        Panel(rescales, title="rescales", title_align="left"),
    ]
    if events:
        parts.append(Panel(Text("\n".join(events[-5:])), title="events", title_align="left"))
    if doc.get("outputs"):
        parts.append(Text("outputs go to " + ", ".join(doc["outputs"]), style="dim"))
    if doc.get("running", True):
        hint = (
            f"Ctrl-C stops the job (state is committed); `keyshift scale {doc['job']} N` "
            "rescales it from another terminal."
        )
        parts.append(Text(hint, style="dim"))
    return Group(*parts)


def failed_lines(doc: dict[str, Any]) -> list[str]:
    """One line per reason the job's stopped key groups have, saying what to do."""
    unknown = "see the worker's log"
    return [
        f"FAILED key group{'s' if count > 1 else ''} {where} ({reason}, since {_when(since)}): "
        f"{FAILED_HINT.get(reason, unknown)}; the error is in the worker's log"
        for reason, where, since, count in failed_by_reason(doc.get("failed_key_groups", []))
    ]


def log_line(doc: dict[str, Any]) -> str:
    """One line per interval when stdout is not a terminal."""
    ready = sum(1 for w in doc["workers"] if w["ready"])
    line = (
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(doc['at']))} "
        f"job={doc['job']} phase={doc.get('phase', 'Running')} parallelism={doc['parallelism']} "
        f"desired={doc['desired_parallelism']} generation={doc['generation']} "
        f"workers_ready={ready}/{len(doc['workers'])} input={_num(doc['rates']['input'])}/s "
        f"processed={_num(doc['rates']['processed'])}/s lag={_num(doc['lag'])} "
        f"cache_hits={_pct(doc['cache_hit_ratio'])}"
    )
    failed = doc.get("failed_key_groups", [])
    if failed:
        line += " failed_key_groups=" + ",".join(str(f["key_group"]) for f in failed)
    if doc["rescale_in_progress"]:
        r = doc["rescale_in_progress"]
        line += f" rescaling={r['from']}->{r['to']}:{r['phase']}"
    last = (doc.get("autoscaler") or {}).get("last")
    if last:
        line += f" autoscaler={last['action']}:{last['desired']}:{last['reason']}"
    return line
