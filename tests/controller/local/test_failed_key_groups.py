"""Key groups a worker stopped are visible where a user looks: ``keyshift status``
(text and ``--json``), the live view's log lines, and on Kubernetes the StreamJob's
status (``failedKeyGroups``, a ``Degraded`` condition).  Tested through ``keyshift run``
as a user runs it, and through the pure functions behind each place."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from keyshift.api.spec import GeneratorSource
from keyshift.controller.autoscaling.metrics.base import (
    FailedKeyGroup,
    WorkerLoad,
    failed_key_groups,
)
from keyshift.controller.autoscaling.metrics.direct import parse_exposition
from keyshift.controller.core.assignment import plan_assignment
from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.core.records import ControllerRecord
from keyshift.controller.core.status import failed_summary, status_document, workers_to_restart
from keyshift.controller.kubernetes.status import job_status
from keyshift.runtime.metrics import FailureMark, WorkerMetrics
from keyshift.runtime.sources.generator import Generator
from keyshift.store import Assignment
from tests.controller.local.localjob import LocalJob
from tests.runtime import jobs
from tests.support import assert_exact_counter_state, counter_manifest, write_manifest

K = 4
LIMIT = 400
SOURCE = {"seed": 4, "keys": 500, "distribution": "zipf", "limit": LIMIT}


def first_bad_offsets() -> dict[int, int]:
    gen = Generator(GeneratorSource.model_validate({"type": "generator", **SOURCE}), K, 0.0)
    return {
        kg: next(i for i, e in enumerate(gen.read(kg, 0, LIMIT)) if e.value == jobs.BAD_VALUE)
        for kg in range(K)
    }


def test_keyshift_status_shows_each_failed_key_group_with_its_offset(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    job = "flaky"
    doc = counter_manifest(
        job, key_groups=K, parallelism=2, store_url="redis://127.0.0.1:1", source=SOURCE,
        errorPolicy="fail",
    )  # fmt: skip
    doc["spec"]["job"] = "tests.runtime.jobs:flaky"
    local = LocalJob(tmp_path, write_manifest(tmp_path, doc), job)
    local_jobs.append(local)
    local.start()
    bad = first_bad_offsets()
    status = local.wait_status(
        lambda s: len(s["failed_key_groups"]) == K, 60, "every key group to stop at its record"
    )
    assert {(f["key_group"], f["reason"], f["offset"]) for f in status["failed_key_groups"]} == {
        (kg, "user-function", bad[kg]) for kg in range(K)
    }
    owners = plan_assignment(K, 2)
    assert all(f["worker"] == f"{job}-worker-{owners[f['key_group']]}"
               for f in status["failed_key_groups"])  # fmt: skip
    text = local.cli("status", job)
    assert text.returncode == 0
    assert "FAILED key groups" in text.stdout and "user-function" in text.stdout
    assert f"at offset {bad[0]}" in text.stdout


def test_a_workers_failure_metrics_read_back_as_failed_key_groups() -> None:
    metrics = WorkerMetrics("j", "j-worker-0")
    metrics.failures({
        2: FailureMark("user-function", 1_700_000_000.0, 17),
        5: FailureMark("store", 1_700_000_100.0, None),
    })  # fmt: skip
    snapshot = parse_exposition(metrics.exposition().decode())
    assert snapshot.failed == (
        FailedKeyGroup(2, "j-worker-0", "user-function", 1_700_000_000.0, 17),
        FailedKeyGroup(5, "j-worker-0", "store", 1_700_000_100.0, None),
    )
    metrics.failures({5: FailureMark("store", 1_700_000_100.0, None)})  # 2 runs again
    snapshot = parse_exposition(metrics.exposition().decode())
    assert [f.key_group for f in snapshot.failed] == [5]
    assert "keyshift_key_groups_failed" in metrics.exposition().decode()
    assert failed_key_groups("w", [({"key_group": "x"}, 1.0)], {}) == ()


def test_failed_key_groups_make_the_streamjob_degraded() -> None:
    failed = [FailedKeyGroup(1, "j-worker-0", "user-function", 1_700_000_000.0, 17)]
    ready = {0: WorkerInfo(0, "j-worker-0", running=True, ready=True, not_ready_since=None)}
    status = job_status(
        assignment=Assignment(1, 1, (0, 0)), workers=ready, record=ControllerRecord(job="j"),
        selector="s", previous_conditions=[], observed_generation=1, error=None,
        at=1_700_000_050.0, failed=failed,
    )  # fmt: skip
    assert status["phase"] == "Degraded"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "KeyGroupsFailed")
    assert "1 at offset 17 on j-worker-0" in degraded["message"]
    assert status["failedKeyGroups"] == [
        {"key_group": 1, "worker": "j-worker-0", "reason": "user-function",
         "since": 1_700_000_000.0, "offset": 17}
    ]  # fmt: skip
    healthy = job_status(
        assignment=Assignment(1, 1, (0, 0)), workers=ready, record=ControllerRecord(job="j"),
        selector="s", previous_conditions=status["conditions"], observed_generation=1,
        error=None, at=1_700_000_060.0,
    )  # fmt: skip
    assert healthy["phase"] == "Running" and healthy["failedKeyGroups"] == []


def test_the_status_document_lists_failed_key_groups_of_every_worker() -> None:
    def load(ordinal: int, failed: tuple[FailedKeyGroup, ...]) -> WorkerLoad:
        return WorkerLoad(ordinal, f"j-worker-{ordinal}", 10.0, 0.5, 2, 1, None, 3, failed)

    from keyshift.controller.autoscaling.metrics.base import LoadSample

    f1 = FailedKeyGroup(3, "j-worker-1", "poison-record", 5.0, 8)
    f0 = FailedKeyGroup(0, "j-worker-0", "store", 4.0, None)
    sample = LoadSample(
        at=10.0, window_seconds=5.0, workers_expected=2, workers_reporting=2,
        arrival_rate=1.0, processed_rate=1.0, lag=6, lag_trend=0.0,
        per_worker=(load(0, (f0,)), load(1, (f1,))), lag_by_key_group={},
        complete=True, missing=(),
    )  # fmt: skip
    doc = status_document(
        "j", 4, Assignment(1, 2, (0, 0, 1, 1)), 2, {}, sample, None, [], running=True, at=10.0
    )
    assert [(f["key_group"], f["reason"]) for f in doc["failed_key_groups"]] == [
        (0, "store"),
        (3, "poison-record"),
    ]


FIXABLE = '''"""The counter, with a bug for records of value {bad} while BROKEN."""
from examples.counter import count, job as counter, process as count_record, total
from keyshift.runtime.api import Job

BROKEN = {broken}


def process(event, ctx):
    if BROKEN and event.value == {bad}:
        raise RuntimeError("cannot handle {bad}")
    count_record(event, ctx)


job = Job(name="fixable", process=process, key_by=counter.key_by, states=[count, total])
'''


def test_fix_the_code_and_resume_replays_the_stopped_key_groups_exactly(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    """The documented way back: the job's code is fixed while its key groups are
    stopped, ``keyshift resume`` restarts their workers, and each stopped key group
    replays from its last commit: the state ends exactly the counter's, nothing of the
    failed records counted twice."""
    job = "fixable"
    (tmp_path / "fixable.py").write_text(FIXABLE.format(bad=jobs.BAD_VALUE, broken=True))
    doc = counter_manifest(
        job, key_groups=K, parallelism=2, store_url="redis://127.0.0.1:1", source=SOURCE,
        errorPolicy="fail",
    )  # fmt: skip
    doc["spec"]["job"] = "fixable:job"
    local = LocalJob(tmp_path, write_manifest(tmp_path, doc), job)
    local_jobs.append(local)
    local.start()
    local.wait_status(lambda s: len(s["failed_key_groups"]) == K, 60, "every key group to stop")

    nothing = local.cli("resume", job, "99")
    assert nothing.returncode == 1 and "not stopped: key group(s) 99" in nothing.stdout
    (tmp_path / "fixable.py").write_text(FIXABLE.format(bad=jobs.BAD_VALUE, broken=False))
    resumed = local.cli("resume", job)
    assert resumed.returncode == 0, resumed.stderr
    assert f"restarting {job}-worker-0; key group(s) 0, 1 replay" in resumed.stdout
    local.wait_status(
        lambda s: not s["failed_key_groups"] and s["finished"], 90,
        "the resumed key groups to process their whole input",
    )  # fmt: skip
    assert "resume: restarted fixable-worker-1" in local.log()

    async def exact() -> None:
        store = local.store()
        try:
            await assert_exact_counter_state(store, job, SOURCE, K, LIMIT)
        finally:
            await store.close()

    asyncio.run(exact())


def test_resume_restarts_the_workers_of_the_asked_stopped_key_groups() -> None:
    failed = [failed_summary(f) for f in (
        FailedKeyGroup(3, "j-worker-1", "user-function", 1.0, 8),
        FailedKeyGroup(0, "j-worker-0", "store", 2.0, None),
        FailedKeyGroup(1, "j-worker-1", "poison-record", 3.0, 2),
    )]  # fmt: skip
    assert workers_to_restart(failed, None) == ({"j-worker-0": [0], "j-worker-1": [1, 3]}, [])
    assert workers_to_restart(failed, [3, 5]) == ({"j-worker-1": [3]}, [5])
    assert workers_to_restart([], None) == ({}, [])


def test_a_streamjob_whose_bounded_input_is_all_processed_is_finished() -> None:
    ready = {0: WorkerInfo(0, "j-worker-0", running=True, ready=True, not_ready_since=None)}

    def status(finished: bool, failed: tuple[FailedKeyGroup, ...] = ()) -> dict[str, Any]:
        return job_status(
            assignment=Assignment(1, 1, (0, 0)), workers=ready,
            record=ControllerRecord(job="j"), selector="s", previous_conditions=[],
            observed_generation=1, error=None, at=1_700_000_000.0, finished=finished,
            failed=failed,
        )  # fmt: skip

    done = status(True)
    assert done["phase"] == "Finished"
    conditions = {c["type"]: c for c in done["conditions"]}
    assert conditions["Finished"]["status"] == "True"
    assert conditions["Finished"]["reason"] == "InputProcessed"
    assert conditions["Ready"]["status"] == "True"
    assert status(False)["phase"] == "Running"
    stopped = (FailedKeyGroup(1, "j-worker-0", "user-function", 1.0, 3),)
    assert status(True, stopped)["phase"] == "Degraded"  # a stopped key group is not done
