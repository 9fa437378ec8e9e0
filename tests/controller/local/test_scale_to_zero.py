"""Scale to zero and wake on input, locally: ``keyshift run`` with real worker processes.

The generator's rate is a burst, a long silence, and a second burst. The autoscaler
(``minParallelism: 0``) stops every worker once the input has been idle for
``scaleToZeroAfter``; the job is ``Idle`` at parallelism 0 with its state committed and
released in the store. The second burst wakes it (the controller compares the generator's
clock with the positions in the store), and it processes the rest exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from keyshift.api.spec import GeneratorSource
from keyshift.runtime.api import Context, Job, ValueState, decode_key
from keyshift.runtime.sources.generator import Event, Generator
from keyshift.runtime.timers import PROCESSING_TIME, FiredTimer
from keyshift.store import RedisStateStore
from tests.controller.local.localjob import LocalJob
from tests.support import (
    all_done,
    assert_exact_counter_state,
    counter_manifest,
    positions,
    wait_for,
    write_manifest,
)

pytestmark = pytest.mark.slow

K = 4
LIMIT = 300
"""Records per key group: the first burst gives 200 each, the second the rest."""
WAKE_AT = 25.0
"""Job time (s) of the second burst: after the job has gone to zero."""
SOURCE: dict[str, Any] = {
    "seed": 11,
    "keys": 400,
    "limit": LIMIT,
    "rate": {"shape": "points", "points": [[0, 400], [2, 400], [2, 0], [WAKE_AT, 0],
                                           [WAKE_AT, 800], [WAKE_AT + 60, 800]]},
}  # fmt: skip
AUTOSCALER = {
    "enabled": True, "minParallelism": 0, "maxParallelism": 2, "scaleToZeroAfter": "3s",
    "wakeCheckSeconds": "500ms", "metricsWindowSeconds": 2, "intervalSeconds": 1,
    "cooldownSeconds": 2, "scaleDownStabilizationSeconds": 60,
}  # fmt: skip


def wakes(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The rescales from zero (the first deployment is one too, but not the autoscaler's)."""
    return [r for r in status["rescales"] if r["from"] == 0 and r["reason"] == "autoscaler"]


def reasons(status: dict[str, Any]) -> list[str]:
    return [d["reason"] for d in (status.get("autoscaler") or {}).get("decisions") or []]


async def assert_state_at(store: RedisStateStore, job: str, at: list[int]) -> None:
    """Every key group holds exactly the counter state of its first ``at[kg]`` records."""
    from keyshift.runtime.expected import counter_state_encoded

    spec = GeneratorSource.model_validate({"type": "generator", **SOURCE})
    for kg in range(K):
        for state, values in counter_state_encoded(spec, K, kg, at[kg]).items():
            stored = {k: v async for k, v in store.scan_all(job, kg, state)}
            assert stored == values, f"key group {kg} state {state!r} differs at {at[kg]}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_the_job_scales_to_zero_when_idle_and_wakes_on_input(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    doc = counter_manifest(
        "sleepy", key_groups=K, parallelism=1, store_url="redis://127.0.0.1:1", source=SOURCE,
        autoscaler=AUTOSCALER,
    )  # fmt: skip
    job = LocalJob(tmp_path, write_manifest(tmp_path, doc), "sleepy").start()
    local_jobs.append(job)
    running = await asyncio.to_thread(
        job.wait_status, lambda s: s["parallelism"] == 1 and s["workers"], 60, "the first worker"
    )
    pid = next(w["pid"] for w in running["workers"])
    store = job.store()
    info = await store.job_info("sleepy")
    assert info is not None

    idle = await asyncio.to_thread(
        job.wait_status, lambda s: s["phase"] == "Idle", WAKE_AT - 5, "the job to scale to zero"
    )
    now = time.time()
    assert now - info.created_at < WAKE_AT, "the job went idle too late: the test proves nothing"
    assert (idle["parallelism"], idle["workers"]) == (0, [])
    assert not alive(pid), "the worker process still runs"
    assert "idle" in reasons(idle)
    # everything that arrived is processed, committed and released to nobody
    generator = Generator(GeneratorSource.model_validate(SOURCE), K, info.created_at)
    first = [generator.available(kg, now) for kg in range(K)]
    assert min(first) > 0 and max(first) < LIMIT
    assert await positions(store, "sleepy", K) == first
    assert set((await store.owners("sleepy", range(K))).values()) == {""}
    await assert_state_at(store, "sleepy", first)

    woken = await asyncio.to_thread(
        job.wait_status,
        lambda s: any(r["outcome"] == "succeeded" for r in wakes(s)),
        WAKE_AT + 60 - (time.time() - info.created_at), "the job to wake on input",
    )  # fmt: skip
    assert wakes(woken)[0]["to"] >= 1
    assert "input_waiting" in reasons(woken)
    await wait_for(lambda: all_done(store, "sleepy", K, LIMIT), 60, "the rest of the input")
    await assert_exact_counter_state(store, "sleepy", SOURCE, K, LIMIT)
    # the input has ended: idle again
    again = await asyncio.to_thread(
        job.wait_status, lambda s: s["phase"] == "Idle" and s["generation"] > idle["generation"],
        60, "the job to scale to zero again",
    )  # fmt: skip
    assert again["parallelism"] == 0
    await store.close()
    assert job.interrupt() == 0


# -- a timer wakes the job -------------------------------------------------------------------------

REMIND_AFTER_MS = 20_000
"""Each key's reminder is due this long after its first record: after the job is at zero."""
seen = ValueState("seen", int, default=0)
reminded = ValueState("reminded", int, default=0)


def _remember(event: Event, ctx: Context) -> None:
    s = ctx.state(seen)
    if s.value() == 0:
        ctx.timers.register_processing_time(int(time.time() * 1000) + REMIND_AFTER_MS)
    s.update(s.value() + 1)


def _remind(timer: FiredTimer, ctx: Context) -> None:
    assert timer.domain == PROCESSING_TIME
    r = ctx.state(reminded)
    r.update(r.value() + 1)


reminder_job = Job(
    name="reminder", process=_remember, key_by=lambda e: e.key, states=[seen, reminded],
    on_timer=_remind,
)  # fmt: skip


async def test_a_timer_due_while_at_zero_wakes_the_job(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    source = {"seed": 4, "keys": 40, "limit": 50}  # every key's records at once, then nothing
    doc = counter_manifest(
        "reminded", key_groups=K, parallelism=1, store_url="redis://127.0.0.1:1",
        source=source, autoscaler=AUTOSCALER,
    )  # fmt: skip
    doc["spec"]["job"] = "tests.controller.local.test_scale_to_zero:reminder_job"
    job = LocalJob(tmp_path, write_manifest(tmp_path, doc), "reminded").start()
    local_jobs.append(job)
    started = time.time()
    await asyncio.to_thread(
        job.wait_status, lambda s: s["phase"] == "Idle", 60, "the job to scale to zero"
    )
    assert time.time() - started < REMIND_AFTER_MS / 1000, "idle too late to prove anything"
    store = job.store()
    keys: set[Any] = set()
    for kg in range(K):
        keys |= {decode_key(k) async for k, _ in store.scan_all("reminded", kg, "seen")}
        assert await store.next_timer("reminded", kg, PROCESSING_TIME) is not None

    woken = await asyncio.to_thread(
        job.wait_status, lambda s: "timer_due" in reasons(s) and wakes(s), 60,
        "the job to wake for its timers",
    )  # fmt: skip
    assert wakes(woken)[0]["to"] == 1

    async def every_key_reminded_once() -> bool:
        counts: dict[Any, bytes] = {}
        for kg in range(K):
            counts |= {
                decode_key(k): v async for k, v in store.scan_all("reminded", kg, "reminded")
            }
        return set(counts) == keys and all(v == b"\x01" for v in counts.values())

    await wait_for(every_key_reminded_once, 60, "every key's reminder, once")
    for kg in range(K):
        assert await store.next_timer("reminded", kg, PROCESSING_TIME) is None
    await asyncio.to_thread(
        job.wait_status, lambda s: s["phase"] == "Idle" and s["generation"] > woken["generation"],
        60, "the job to scale to zero again",
    )  # fmt: skip
    await store.close()
    assert job.interrupt() == 0


async def test_a_controller_killed_while_waking_the_job_completes_the_wake(
    tmp_path: Path, local_jobs: list[LocalJob]
) -> None:
    """``keyshift run`` SIGKILLed right after publishing the wake's assignment (its third
    publication: the first deployment, the scale to zero, the wake), with its workers; a
    restart resumes the wake from its record and the state is exact at the end."""
    doc = counter_manifest(
        "insomniac", key_groups=K, parallelism=1, store_url="redis://127.0.0.1:1",
        source=SOURCE, autoscaler=AUTOSCALER,
    )  # fmt: skip
    job = LocalJob(tmp_path, write_manifest(tmp_path, doc), "insomniac")
    job.env["KEYSHIFT_CRASH_POINTS"] = "executor.publish.after@3"
    job.start()
    local_jobs.append(job)
    assert job.process is not None
    code = await asyncio.to_thread(job.process.wait, WAKE_AT + 60)
    assert code == -signal.SIGKILL, job.log()
    job.process = None
    current = job.controller_record()["current"]
    assert current is not None and current["from_parallelism"] == 0, current
    # published in the store, not yet recorded as handing off: the restart finds it published
    assert current["phase"] == "publishing" and current["to_parallelism"] >= 1
    del job.env["KEYSHIFT_CRASH_POINTS"]
    job.start()
    status = await asyncio.to_thread(
        job.wait_status, lambda s: any(r["outcome"] == "succeeded" for r in wakes(s)), 60,
        "the restarted controller to complete the wake",
    )  # fmt: skip
    assert wakes(status)[0]["id"] == current["id"]
    store = job.store()
    await wait_for(lambda: all_done(store, "insomniac", K, LIMIT), 60, "the rest of the input")
    await assert_exact_counter_state(store, "insomniac", SOURCE, K, LIMIT)
    await store.close()
    assert job.interrupt() == 0
