"""A job's status as one document: what ``keyshift status --json`` prints, what
the live view shows, and (later) what the operator writes to the StreamJob's
status. Built by a pure function from what the controller knows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from keyshift.controller.autoscaling.metrics.base import (
    FailedKeyGroup,
    LoadSample,
    ScalingMetric,
    job_processed_rate,
)
from keyshift.controller.core.assignment import describe_ranges, key_groups_of
from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.core.rescale import Rescale
from keyshift.store.protocol import Assignment


def rescale_summary(r: Rescale) -> dict[str, Any]:
    return {
        "id": r.id,
        "from": r.from_parallelism,
        "to": r.to_parallelism,
        "reason": r.reason,
        "generation": r.to_generation,
        "started_at": r.started_at,
        "phase": r.phase,
        "duration_seconds": None if r.duration_seconds is None else round(r.duration_seconds, 4),
        "max_pause_seconds": r.max_pause_seconds,
        "handoff": None if r.handoff is None else msgspec.to_builtins(r.handoff),
        "moved_key_groups": r.moved_key_groups,
        "predicted_balance": r.predicted_balance,
        "load_aware": r.load_aware,
        "steps": {s.phase: s.seconds for s in r.steps},
        "outcome": r.outcome,
        "message": r.message,
    }


def finished(load: LoadSample | None, key_groups: int) -> bool:
    """Every key group's bounded input ended, and all of it is processed and committed."""
    return load is not None and sum(w.key_groups_finished for w in load.per_worker) == key_groups


def failed_summary(f: FailedKeyGroup) -> dict[str, Any]:
    return {
        "key_group": f.key_group,
        "worker": f.worker,
        "reason": f.reason,
        "since": f.since,
        "offset": f.offset,
    }


def workers_to_restart(
    failed: Sequence[Mapping[str, Any]], key_groups: Sequence[int] | None
) -> tuple[dict[str, list[int]], list[int]]:
    """Which workers to restart to resume stopped key groups (entries as
    :func:`failed_summary` writes them): ``key_groups`` of them, or all when ``None``.
    Returns ``({worker: [key groups it resumes]}, [asked key groups that are not
    stopped])``: a restarted worker claims its key groups again, and each stopped one
    replays from its last commit with the code as it is now."""
    stopped = {int(f["key_group"]): str(f["worker"]) for f in failed}
    wanted = sorted(stopped) if key_groups is None else sorted(set(key_groups))
    restart: dict[str, list[int]] = {}
    for kg in wanted:
        if kg in stopped:
            restart.setdefault(stopped[kg], []).append(kg)
    return restart, [kg for kg in wanted if kg not in stopped]


def failed_by_reason(failed: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, float, int]]:
    """Stopped key groups (entries as :func:`failed_summary` writes them) grouped by reason:
    ``(reason, where in words, since when, how many)``, where reads
    ``"3 at offset 8 on job-worker-1, 5 on job-worker-0"``."""
    by_reason: dict[str, list[Mapping[str, Any]]] = {}
    for f in failed:
        by_reason.setdefault(f["reason"], []).append(f)
    return [
        (
            reason,
            ", ".join(
                f"{f['key_group']}"
                + (f" at offset {f['offset']}" if f["offset"] is not None else "")
                + f" on {f['worker']}"
                for f in found
            ),
            min(f["since"] for f in found),
            len(found),
        )
        for reason, found in sorted(by_reason.items())
    ]


FAILED_HINT = {
    "user-function": "the job's code raised (errorPolicy fail): fix it, then `keyshift "
    "resume JOB` (or run it again; on Kubernetes a new image in the StreamJob rolls the "
    "workers); the key group replays from its last commit",
    "poison-record": "a record could not be decoded (onPoison fail): choose skip or "
    "dead-letter, or fix the record, then `keyshift resume JOB` (on Kubernetes: roll the "
    "workers)",
    "store": "the store refused it or holds corrupt data for it; retried with back-off, "
    "it resumes once the store is repaired (see docs/reliability.md)",
}
"""What a person can do about each reason a key group stopped."""


def lifecycle_phase(assignment: Assignment | None, current: Rescale | None) -> str | None:
    """The phase the assignment and the rescale say, on both hosts: ``Pending`` (nothing
    published yet), ``Rescaling``, ``Idle`` (scaled to zero: no worker runs, the state
    waits in the store); None while workers run (how well: the host's status says)."""
    if assignment is None:
        return "Pending"
    if current is not None:
        return "Rescaling"
    if assignment.parallelism == 0:
        return "Idle"
    return None


def status_document(
    job: str,
    key_groups: int,
    assignment: Assignment | None,
    desired_parallelism: int,
    workers: Mapping[int, WorkerInfo],
    load: LoadSample | None,
    current: Rescale | None,
    history: Sequence[Rescale],
    *,
    running: bool,
    at: float,
) -> dict[str, Any]:
    owners = assignment.owners if assignment is not None else ()
    per_worker = {w.ordinal: w for w in load.per_worker} if load is not None else {}
    worker_docs = []
    for ordinal, info in sorted(workers.items()):
        mine = key_groups_of(owners, ordinal)
        wl = per_worker.get(ordinal)
        worker_docs.append({
            "ordinal": ordinal,
            "name": info.name,
            "key_groups": mine,
            "key_ranges": describe_ranges(mine),
            "ready": info.ready,
            "running": info.running,
            "pid": info.pid,
            "metrics_url": info.metrics_url,
            "detail": info.detail,
            ScalingMetric.PROCESSED_RATE: None if wl is None else wl.processed_rate,
            ScalingMetric.BUSY_RATIO: None if wl is None else wl.busy_ratio,
            ScalingMetric.LAG: None if wl is None else wl.lag,
            ScalingMetric.CACHE_HIT_RATIO: None if wl is None else wl.cache_hit_ratio,
            ScalingMetric.GENERATION: None if wl is None else wl.generation,
            "failed_key_groups": [] if wl is None else [f.key_group for f in wl.failed_key_groups],
        })  # fmt: skip
    failed = sorted(
        (f for wl in per_worker.values() for f in wl.failed_key_groups),
        key=lambda f: f.key_group,
    )
    return {
        "job": job,
        "running": running,
        "at": at,
        "key_groups": key_groups,
        "phase": lifecycle_phase(assignment, current) or "Running",
        "parallelism": 0 if assignment is None else assignment.parallelism,
        "desired_parallelism": desired_parallelism,
        "generation": 0 if assignment is None else assignment.generation,
        "workers": worker_docs,
        "lag": None if load is None else load.lag,
        "rates": {
            "input": None if load is None else load.arrival_rate,
            "processed": job_processed_rate(load, key_groups),
        },
        "failed_key_groups": [failed_summary(f) for f in failed],
        "finished": finished(load, key_groups),
        "metrics_complete": False if load is None else load.complete,
        "metrics_missing": [] if load is None else list(load.missing),
        "cache_hit_ratio": _cache_hit_ratio(load),
        "rescale_in_progress": None if current is None else rescale_summary(current),
        "rescales": [rescale_summary(r) for r in history],
    }


def _cache_hit_ratio(load: LoadSample | None) -> float | None:
    if load is None:
        return None
    ratios = [w.cache_hit_ratio for w in load.per_worker if w.cache_hit_ratio is not None]
    return sum(ratios) / len(ratios) if ratios else None
