"""The StreamJob's ``status``, as a pure function of what the controller knows.

Phases: ``Pending`` (no assignment published yet), ``Running``, ``Rescaling``, ``Idle``
(scaled to zero by the autoscaler: no worker runs, the state waits in the store),
``Degraded`` (a worker of the assignment is not ready, or key groups stopped with an
error: ``failedKeyGroups``, from the workers' metrics), ``Failed`` (the spec
is invalid: the ``InvalidSpec`` condition says why). A Secret the spec names that does
not opt in to StreamJobs makes ``Ready`` False with the reason ``SecretNotAllowed``
(the job stays ``Pending`` if it never ran). Conditions follow the
Kubernetes convention: ``lastTransitionTime`` changes only when ``status``
does.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from keyshift.controller.autoscaling.metrics.base import FailedKeyGroup
from keyshift.controller.core.assignment import describe_ranges, key_groups_of
from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.core.reconcile import Desired
from keyshift.controller.core.records import ControllerRecord
from keyshift.controller.core.status import (
    FAILED_HINT,
    failed_by_reason,
    failed_summary,
    lifecycle_phase,
    rescale_summary,
)
from keyshift.errors import KeyshiftError
from keyshift.store.protocol import Assignment

Obj = dict[str, Any]
HISTORY_IN_STATUS = 10
"""Finished rescales shown in ``status.rescales`` (the record keeps more)."""


def timestamp(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    previous: Sequence[Obj], kind: str, true: bool, reason: str, message: str, at: float
) -> Obj:
    """A condition; keeps the previous ``lastTransitionTime`` if the status did not change."""
    status = "True" if true else "False"
    before = next((c for c in previous if c.get("type") == kind), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status else None
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or timestamp(at),
    }


STUCK_SECONDS = 10.0
"""A worker outside the assignment (starting for a rescale) that is not ready for this
long counts as degraded too: e.g. an entry point that cannot be loaded."""


def _stuck(info: WorkerInfo, at: float) -> bool:
    since = info.not_ready_since
    return not info.ready and since is not None and at - since >= STUCK_SECONDS


def invalid_status(message: str, previous: Sequence[Obj], observed: int | None, at: float) -> Obj:
    return {
        "phase": "Failed",
        "observedGeneration": observed,
        "conditions": [
            condition(previous, "InvalidSpec", True, "InvalidSpec", message, at),
            condition(previous, "Ready", False, "InvalidSpec", "the spec is invalid", at),
        ],
    }


def refused_status(
    reason: str, message: str, previous: Sequence[Obj], observed: int | None, at: float
) -> Obj:
    """The status of a job that cannot start because Secrets it names are refused."""
    return {
        "phase": "Pending",
        "observedGeneration": observed,
        "conditions": [
            condition(previous, "Ready", False, reason, message, at),
            condition(previous, "InvalidSpec", False, "Valid", "the spec is valid", at),
        ],
    }


def failed_message(failed: Sequence[FailedKeyGroup]) -> str:
    """The stopped key groups in one sentence per reason, with what to do."""
    return "; ".join(
        f"key groups stopped ({reason}): {where}; {FAILED_HINT.get(reason, '')}"
        for reason, where, _, _ in failed_by_reason([failed_summary(f) for f in failed])
    )


def job_status(
    *,
    assignment: Assignment | None,
    workers: Mapping[int, WorkerInfo],
    record: ControllerRecord,
    selector: str,
    previous_conditions: Sequence[Obj],
    observed_generation: int | None,
    error: str | None,
    at: float,
    invalid: str | None = None,
    failed: Sequence[FailedKeyGroup] = (),
    desired: Desired | None = None,
    lag: int | None = None,
    refused: str | None = None,
    finished: bool = False,
) -> Obj:
    """``invalid``: why the newest spec is rejected, while the job runs by an older one;
    ``failed``: the key groups the workers' metrics say are stopped; ``refused``: why
    Secrets the spec names are refused (the workers run as they were); ``finished``: the
    workers' metrics say every key group processed its whole (bounded) input and
    committed it."""
    owners = assignment.owners if assignment is not None else ()
    parallelism = 0 if assignment is None else assignment.parallelism
    current = record.current
    history = record.history
    not_ready = sorted(
        {w for w in range(parallelism) if not (w in workers and workers[w].ready)}
        | {w for w, info in workers.items() if _stuck(info, at)}
    )
    phase = lifecycle_phase(assignment, current) or (
        "Degraded" if not_ready or failed else "Finished" if finished else "Running"
    )
    last = history[-1] if history else None
    degraded_msg = "every worker is ready"
    if not_ready:
        details = [f"worker {w}: {workers[w].detail}" for w in not_ready
                   if w in workers and workers[w].detail]  # fmt: skip
        degraded_msg = f"workers {not_ready} are not ready" + (
            f" ({'; '.join(details)[:1000]})" if details else ""
        )
    if failed:
        degraded_msg = (
            failed_message(failed) if not not_ready else f"{degraded_msg}; {failed_message(failed)}"
        )
    if error:
        degraded_msg = f"{degraded_msg}; {error}"
    degraded_reason = (
        "WorkersNotReady"
        if not_ready
        else "KeyGroupsFailed"
        if failed
        else ("Error" if error else "AllReady")
    )
    rescaling_msg = (
        f"{current.from_parallelism} -> {current.to_parallelism} ({current.reason}), "
        f"phase {current.phase}"
        if current is not None
        else "no rescale in progress"
    )
    running = (f"{parallelism} workers run generation "
               f"{0 if assignment is None else assignment.generation}")  # fmt: skip
    if phase == "Idle":
        running = (f"scaled to zero (generation {assignment.generation if assignment else 0}): "
                   "no worker runs, the state waits in the store; input or a due timer wakes "
                   "the job")  # fmt: skip
    conditions = [
        condition(previous_conditions, "Ready",
                  phase in ("Running", "Finished", "Idle") and refused is None,
                  "SecretNotAllowed" if refused else phase,
                  f"{refused}; meanwhile {running}, as before" if refused else running, at),
        condition(previous_conditions, "Rescaling", current is not None,
                  "Rescaling" if current is not None else "Idle", rescaling_msg, at),
        condition(previous_conditions, "Degraded", bool(not_ready or failed or error),
                  degraded_reason, degraded_msg[:4000], at),
        condition(previous_conditions, "Finished", phase == "Finished",
                  "InputProcessed" if phase == "Finished" else "Processing",
                  "every key group processed its whole input and committed it; the workers "
                  "stay up (delete the StreamJob to free them)" if phase == "Finished"
                  else "not every key group is at the end of its input", at),
        condition(previous_conditions, "InvalidSpec", invalid is not None,
                  "InvalidSpec" if invalid else "Valid",
                  f"{invalid}; the job runs by its last valid spec" if invalid
                  else "the spec is valid", at),
    ]  # fmt: skip
    return {
        "phase": phase,
        "observedGeneration": observed_generation,
        "parallelism": parallelism,
        "desiredParallelism": None if desired is None else desired.parallelism,
        "desiredParallelismSource": None if desired is None else desired.reason,
        "lag": lag,
        "generation": 0 if assignment is None else assignment.generation,
        "selector": selector,
        "conditions": conditions,
        "workers": [
            {
                "ordinal": o,
                "name": w.name,
                "ready": w.ready,
                "keyRanges": describe_ranges(key_groups_of(owners, o)),
                "keyGroups": len(key_groups_of(owners, o)),
                "detail": w.detail,
            }
            for o, w in sorted(workers.items())
        ],
        "failedKeyGroups": [failed_summary(f) for f in failed],
        "rescale": None if current is None else rescale_summary(current),
        "rescales": [rescale_summary(r) for r in history[-HISTORY_IN_STATUS:]],
        "lastRescalePauseSeconds": None if last is None else last.max_pause_seconds,
    }


def record_to_status(record: ControllerRecord) -> Obj:
    """The executor's persistent record, as stored in ``status.controller``."""
    out: Obj = msgspec.to_builtins(record)
    return out


class InvalidStatus(KeyshiftError, ValueError):
    """``status.controller`` that is not a controller record (edited by hand?)."""


def record_from_status(status: Mapping[str, Any] | None, job: str) -> ControllerRecord:
    """The executor's record saved in ``status.controller`` (:class:`InvalidStatus`)."""
    raw = (status or {}).get("controller")
    if not raw:
        return ControllerRecord(job=job)
    try:
        return msgspec.convert(raw, type=ControllerRecord)
    except msgspec.ValidationError as exc:
        raise InvalidStatus(f"status.controller is not a controller record: {exc}") from None
