"""Restarting and finishing a local run (issue 20, section 2): a manual ``keyshift scale``
survives a restart while the manifest's parallelism is unchanged, ``--fresh`` starts from
nothing, a bounded job ends the run with exit 0 once all is processed,
and a manifest's store URL that a local run does not use is said so."""

from __future__ import annotations

from pathlib import Path

from keyshift.controller.local.run import keep_manual_parallelism
from keyshift.store.server import wait_until
from tests.controller.local.localjob import LocalJob
from tests.support import counter_manifest, write_manifest

SOURCE = {"seed": 3, "keys": 500, "rate": {"shape": "constant", "recordsPerSecond": 400}}


def test_keep_manual_parallelism() -> None:
    scaled = {"parallelism": 3, "requested_at": 1.0, "manifest_parallelism": 2}
    assert keep_manual_parallelism(scaled, 2) == 3
    assert keep_manual_parallelism(scaled, 4) is None  # the manifest changed: it wins
    assert keep_manual_parallelism({"parallelism": 2, "manifest_parallelism": 2}, 2) is None
    assert keep_manual_parallelism(None, 2) is None
    assert keep_manual_parallelism({"requested_at": 1.0, "manifest_parallelism": 2}, 2) is None


def test_a_manual_scale_survives_a_restart_and_fresh_starts_over(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    job = "restarts"
    doc = counter_manifest(job, key_groups=8, parallelism=2,
                           store_url="redis://store.example:6379", source=SOURCE)  # fmt: skip
    manifest = write_manifest(tmp_path, doc)

    first = LocalJob(tmp_path, manifest, job)
    local_jobs.append(first)
    first.start()
    first.wait_status(lambda s: s["parallelism"] == 2 and all(w["ready"] for w in s["workers"]),
                      60, "two ready workers")  # fmt: skip
    assert "stateStore.url (redis://store.example:6379) is not used locally" in first.log()
    first.scale(3)
    assert first.interrupt() == 0

    second = LocalJob(tmp_path, manifest, job)
    local_jobs.append(second)
    second.start()
    status = second.wait_status(
        lambda s: s["workers"] and all(w["ready"] for w in s["workers"])
        and s["rescale_in_progress"] is None,
        60, "ready workers, no rescale in progress",
    )  # fmt: skip
    assert (status["parallelism"], status["desired_parallelism"]) == (3, 3)
    assert "keeping parallelism 3 set by `keyshift scale`" in second.log()
    assert [(r["from"], r["to"]) for r in status["rescales"]] == [(0, 2), (2, 3)]
    generation = status["generation"]
    assert second.interrupt() == 0

    fresh = LocalJob(tmp_path, manifest, job, extra_args=("--fresh",))
    local_jobs.append(fresh)
    fresh.start()
    status = fresh.wait_status(
        lambda s: s["parallelism"] == 2 and s["workers"] and all(w["ready"] for w in s["workers"])
        and s["rescale_in_progress"] is None,  # the first rescale (0 -> 2) is in the history
        60, "the manifest's two workers, the first rescale finished",
    )  # fmt: skip
    assert "--fresh: deleted the job's state" in fresh.log()
    assert status["generation"] < generation
    assert [(r["from"], r["to"]) for r in status["rescales"]] == [(0, 2)]  # history gone


def test_a_bounded_job_finishes_and_the_run_exits_0(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    job = "bounded"
    source = {"seed": 9, "keys": 300, "limit": 500}
    doc = counter_manifest(job, key_groups=4, parallelism=2, store_url="redis://127.0.0.1:1",
                           source=source)  # fmt: skip
    manifest = write_manifest(tmp_path, doc)
    kept = LocalJob(tmp_path, manifest, job)  # keep_running: True
    local_jobs.append(kept)
    kept.start()
    status = kept.wait_status(lambda s: s["finished"], 60, "the job to finish")
    assert status["running"]
    # the status file may be written a moment before the controller says so in its log
    wait_until(lambda: "--keep-running keeps the workers up" in kept.log(), 30, "the log's note")
    assert kept.interrupt() == 0

    run = LocalJob(tmp_path, manifest, job, keep_running=False)  # all processed already
    run.start()
    assert run.process is not None
    assert run.process.wait(timeout=60) == 0, run.log()
    assert "finished: every key group processed its whole input and committed" in run.log()
    assert run.status()["finished"] is True
