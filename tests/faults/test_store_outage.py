"""The store unreachable while a job runs (``keyshift run``, two workers, the store
behind :class:`~tests.faults.proxy.FaultProxy`): the workers back off and say they are
not ready, resume when the store is back, and lose nothing; the controller fails over
no one, since a store outage is a common cause a failover would not cure.

Outages of 1 s (connections cut) and 10 s (connections stalled: only timeouts help)
run in CI; 60 s (cut) runs with ``KEYSHIFT_LONG_FAULTS=1``. The last test is the
controller alone (as both hosts run it) through an outage its store client gave up on.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.core.reconcile import Desired
from keyshift.controller.core.records import FileRecordStore
from keyshift.controller.supervisor import ManualRequest, Supervisor
from keyshift.store import StoreUnavailable, open_store
from keyshift.store.server import LocalServer
from tests.controller.local.localjob import LocalJob
from tests.faults.proxy import FaultProxy
from tests.support import (
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    counter_manifest,
    positions,
    wait_for,
    write_manifest,
)

KEY_GROUPS = 8
LONG = os.environ.get("KEYSHIFT_LONG_FAULTS") == "1"
OUTAGES = [
    pytest.param("cut", 1.0, id="cut-1s"),
    pytest.param("stall", 10.0, id="stall-10s"),
    pytest.param(
        "cut", 60.0, id="cut-60s",
        marks=pytest.mark.skipif(not LONG, reason="long: set KEYSHIFT_LONG_FAULTS=1"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("fault", "seconds"), OUTAGES)
async def test_a_store_outage_loses_nothing_and_fails_over_no_one(
    fault: str, seconds: float, standalone_server: LocalServer, job: str, tmp_path: Path
) -> None:
    proxy = FaultProxy("127.0.0.1", standalone_server.port).start()
    url = f"redis://{proxy.address}"
    # 30 s of input at 2,400 records/s from the job's creation: the outage comes in it
    limit = 9000
    source = {"seed": 21, "keys": 2000, "distribution": "zipf", "limit": limit,
              "rate": {"shape": "constant", "recordsPerSecond": 2400}}  # fmt: skip
    manifest = write_manifest(
        tmp_path,
        counter_manifest(job, key_groups=KEY_GROUPS, parallelism=2, store_url=url,
                         source=source, checkpoint_interval="100ms", failoverAfter="2s"),
    )  # fmt: skip
    local = LocalJob(tmp_path, manifest, job, extra_args=("--store-url", url))
    direct = open_store(standalone_server.url, retry_seconds=10)  # the test's own view
    try:
        local.start()
        local.wait_status(
            lambda s: sum(w["ready"] for w in s["workers"]) == 2, 60, "two ready workers"
        )

        async def processing() -> bool:
            return min(await positions(direct, job, KEY_GROUPS)) > 0

        await wait_for(processing, 30, "every key group to commit some progress")
        before = await positions(direct, job, KEY_GROUPS)
        assert max(before) < limit, "the outage came too late"
        getattr(proxy, fault)()
        started = time.monotonic()
        local.wait_status(
            lambda s: not any(w["ready"] for w in s["workers"]),
            seconds + 15, "the workers to report themselves not ready",
        )  # fmt: skip
        during = await positions(direct, job, KEY_GROUPS)
        # the outage lasts its full length: the fault itself, not a synchronisation
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
        assert await positions(direct, job, KEY_GROUPS) == during, "a commit got through"
        proxy.heal()

        async def done() -> bool:
            return await all_done(direct, job, KEY_GROUPS, limit)

        await wait_for(done, 90, "every record once the store is back")
        local.wait_status(lambda s: sum(w["ready"] for w in s["workers"]) == 2, 30, "ready again")
        await assert_exact_counter_state(direct, job, source, KEY_GROUPS, limit)
        assignment = await direct.get_assignment(job)
        assert assignment is not None
        await assert_owned_as_assigned(direct, job, assignment)
        reasons = [r["reason"] for r in local.controller_record()["history"]]
        assert reasons == ["initial"], f"rescales besides the first deployment: {reasons}"
        assert assignment.generation == 1
    finally:
        local.close()
        await direct.close()
        proxy.stop()


class NoWorkers:
    """A WorkerPool that starts nothing: the controller alone, without its workers."""

    async def start(self, ordinals: Collection[int]) -> None:
        return None

    async def stop(self, ordinals: Collection[int]) -> None:
        return None

    async def workers(self) -> dict[int, WorkerInfo]:
        return {}

    async def close(self) -> None:
        return None


async def test_an_outage_the_store_client_gave_up_on_restarts_the_failover_clock(
    standalone_server: LocalServer, job: str, tmp_path: Path
) -> None:
    """Both hosts tick through :meth:`Supervisor.tick_through_outage`: when a tick failed on
    the store (its client's retries ran out) and the next one finds the store at once, no
    stall shows, yet the workers' heartbeats are as old as the outage: failover must count
    from the store's return (``store_ok_since``), not fail over every worker."""
    proxy = FaultProxy("127.0.0.1", standalone_server.port).start()
    store = open_store(f"redis://{proxy.address}", retry_seconds=0.5)
    events: list[str] = []
    supervisor = Supervisor(
        job, KEY_GROUPS, store, NoWorkers(), FileRecordStore(tmp_path / "record.json", job),
        manual=lambda: ManualRequest(Desired(2, "manual"), None),
        on_event=lambda kind, message: events.append(message),
    )  # fmt: skip
    try:
        assert await supervisor.tick_through_outage() is None
        proxy.cut()
        outage = await supervisor.tick_through_outage()
        assert isinstance(outage, StoreUnavailable), outage
        assert supervisor.controller.last_error == f"state store: {outage}"
        assert f"state store: {outage}" in events
        proxy.heal()
        returned = time.time()
        assert await supervisor.tick_through_outage() is None
        assert supervisor.controller.store_ok_since >= returned
        assert "state store reachable again" in events
        assert supervisor.controller.last_error is None
    finally:
        await supervisor.close()
        await store.close()
        proxy.stop()
