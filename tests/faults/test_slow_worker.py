"""A worker starved of CPU during a handoff (``keyshift run``, real worker processes).

The starved worker runs ~0.2% of the time, in slices (SIGSTOP and SIGCONT, as
``cpulimit`` does), from the start of a rescale 2 -> 3 in which it must give key
groups away (which ones, the plan says: by count, or by the measured load with the
fewest moves). Its release misses ``handoffTimeout`` (2 s): the controller claims them
by force for their new owners, which go on processing. When the starved worker runs
again it is fenced: its late commits of them are rejected, and it stands down from
them. The final state is exact and every key group has
the one owner the assignment names.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from keyshift.api.names import worker_name
from keyshift.controller.core.assignment import moved
from tests.controller.local.localjob import LocalJob
from tests.support import (
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    counter_manifest,
    metric_value,
    positions,
    wait_for,
    write_manifest,
)

pytestmark = pytest.mark.slow

JOB = "starved"
KEY_GROUPS = 8
LIMIT = 5000
SOURCE = {"seed": 5, "keys": 2000, "distribution": "zipf", "limit": LIMIT,
          "rate": {"shape": "constant", "recordsPerSecond": 2000}}  # fmt: skip
"""20 s of input: the rescale comes early in it."""


class Starver:
    """Lets process ``pid`` run ``run_ms`` out of every ``period_ms``: the duty cycle of
    ``cpulimit`` (SIGSTOP, then SIGCONT for a slice). The process runs freely again on exit."""

    def __init__(self, pid: int, run_ms: float = 2.0, period_ms: float = 1000.0) -> None:
        self.pid, self.run_s, self.stop_s = pid, run_ms / 1000, (period_ms - run_ms) / 1000
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, daemon=True)

    def _cycle(self) -> None:
        while not self._done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            if self._done.wait(self.stop_s):
                break
            os.kill(self.pid, signal.SIGCONT)
            self._done.wait(self.run_s)
        os.kill(self.pid, signal.SIGCONT)

    def __enter__(self) -> Starver:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join()


async def test_a_cpu_starved_worker_misses_the_handoff_deadline_and_is_fenced(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    doc = counter_manifest(
        JOB, key_groups=KEY_GROUPS, parallelism=2,
        store_url="redis://127.0.0.1:1",  # replaced by the embedded store
        source=SOURCE, checkpoint_interval="100ms",
    )  # fmt: skip
    doc["spec"]["handoffTimeout"] = "2s"
    # failover must not be what moves 2 and 3: the starved worker is not ready for long
    job = LocalJob(tmp_path, write_manifest(tmp_path, doc), JOB,
                   extra_args=("--failover-after", "120")).start()  # fmt: skip
    local_jobs.append(job)
    status = await asyncio.to_thread(
        job.wait_status, lambda s: s["parallelism"] == 2 and len(s["workers"]) == 2
        and all(w["ready"] for w in s["workers"]), 60, "two ready workers",
    )  # fmt: skip
    starved = next(w for w in status["workers"] if w["ordinal"] == 0)
    store = job.store()
    epochs = {kg: (await store.key_group_info(JOB, kg)).epoch for kg in range(KEY_GROUPS)}

    scaled = job.cli("scale", JOB, "3")
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr

    def current() -> dict[str, Any]:
        record = job.controller_record()
        return record.get("current") or {}

    # the new worker 2 is still starting: worker 0 has not been asked to release yet
    await wait_for(lambda: current().get("phase") == "starting_workers", 20,
                   "the rescale to start its new worker")  # fmt: skip
    # the plan's ranges (by count, or by the measured load with the fewest moves)
    old, new = tuple(current()["from_owners"]), tuple(current()["to_owners"])
    given_away = [kg for kg in moved(old, new) if old[kg] == 0]
    assert given_away, (old, new)
    assert all(old[kg] != 0 for kg in moved(old, new) if new[kg] == 0), "0 must only release"
    epochs_before = [epochs[kg] for kg in given_away]
    with Starver(int(starved["pid"])):
        assert current().get("phase") == "starting_workers", "worker 0 was asked too early"
        await wait_for(lambda: bool(current().get("handoff_forced")), 30,
                       "the controller to force the late handoff")  # fmt: skip
        claimed_at = await positions(store, JOB, KEY_GROUPS)

        async def claimed_and_moving() -> bool:
            now = await positions(store, JOB, KEY_GROUPS)
            for kg in given_away:
                info = await store.key_group_info(JOB, kg)
                if info.owner != worker_name(JOB, new[kg]) or now[kg] <= claimed_at[kg]:
                    return False
            return True

        # the new owners run them while their old owner is still starved
        await wait_for(claimed_and_moving, 20, f"the new owners to process {given_away}")
        for kg, before in zip(given_away, epochs_before, strict=True):
            assert (await store.key_group_info(JOB, kg)).epoch > before

    # running again, the late owner's commits of 2 and 3 are rejected
    def fenced() -> bool:
        fenced = metric_value(starved["metrics_url"], "keyshift_commits_fenced_total",
                              required=True)  # fmt: skip
        return fenced >= 1

    await wait_for(fenced, 30, "worker 0's late commit to be fenced")

    def finished() -> bool:
        history = job.controller_record()["history"]
        return bool(history) and history[-1]["to_parallelism"] == 3 and current() == {}

    await wait_for(finished, 60, "the rescale to finish")
    rescale = job.controller_record()["history"][-1]
    assert (rescale["outcome"], rescale["forced"], rescale["handoff_forced"]) == (
        "succeeded", given_away, True,
    ), rescale  # fmt: skip

    await wait_for(lambda: all_done(store, JOB, KEY_GROUPS, LIMIT), 90, "every record")
    assignment = await store.get_assignment(JOB)
    assert assignment is not None and tuple(assignment.owners) == new
    await assert_owned_as_assigned(store, JOB, assignment)
    await assert_exact_counter_state(store, JOB, SOURCE, KEY_GROUPS, LIMIT)
    await store.close()
    assert job.interrupt() == 0
