"""State that expires: ``ValueState(ttl=...)``. What a job reads (the harness, on a clock
of the test's), and what the store keeps: a worker removes expired values in the
background, within its fenced commits, whoever owns the key group now."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from keyshift.api.spec import GeneratorSource, StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime import api
from keyshift.runtime.api import (
    Context,
    Job,
    ListState,
    MapState,
    ValueState,
    split_expiry,
    with_expiry,
)
from keyshift.runtime.config import settings_from
from keyshift.runtime.expected import counter_state_encoded
from keyshift.runtime.testing import JobHarness
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, open_store
from keyshift.store.server import LocalServer
from tests.runtime import jobs, running_worker
from tests.support import WorkerProcess, all_done, counter_manifest, wait_for, write_manifest

token = ValueState("token", str, default="none", ttl=timedelta(seconds=10))


def keep(record: tuple[str, str], ctx: Context) -> None:
    t = ctx.state(token)
    ctx.emit(t.value())
    if record[1]:
        t.update(record[1])


remembering: Job[tuple[str, str]] = Job(
    name="remembering", process=keep, key_by=lambda r: r[0], states=[token]
)


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The processing time expiry reads (``api.now_ms``), moved by the test."""
    c = Clock(1_000_000)
    monkeypatch.setattr(api, "now_ms", c)
    return c


def test_a_value_reads_as_absent_once_its_ttl_since_the_last_write_has_passed(clock: Clock) -> None:
    h = JobHarness(remembering)
    h.process(("a", "t1"))
    clock.ms += 9_999
    h.process(("a", ""))  # read only: the expiry stays where the write put it
    assert h.state(token, "a") == "t1"
    clock.ms += 1
    assert h.state(token, "a") == "none"  # 10 s after the write: gone, reads the default
    h.process(("a", "t2"))  # written again: lives another 10 s from now
    clock.ms += 9_999
    h.process(("a", ""))
    assert h.output() == ["none", "t1", "none", "t2"]


visits = MapState("visits", str, int, ttl=10.0)


def visit(record: tuple[str, str], ctx: Context) -> None:
    m = ctx.state(visits)
    if record[1]:
        m.put(record[1], (m.get(record[1]) or 0) + 1)
    ctx.emit((sorted(m.items()), sorted(m.keys()), len(m), "home" in m))


def test_map_entries_expire_one_by_one(clock: Clock) -> None:
    h = JobHarness(Job(name="visits", process=visit, key_by=lambda r: r[0], states=[visits]))
    h.process(("u", "home"))
    clock.ms += 6_000
    h.process(("u", "cart"))
    clock.ms += 4_000  # home: 10 s since its put, gone; cart: 4 s
    h.process(("u", ""))
    h.process(("u", "home"))  # back, counted from nothing
    assert h.output() == [
        ([("home", 1)], ["home"], 1, True),
        ([("cart", 1), ("home", 1)], ["cart", "home"], 2, True),
        ([("cart", 1)], ["cart"], 1, False),
        ([("cart", 1), ("home", 1)], ["cart", "home"], 2, True),
    ]


clicks = ListState("clicks", str, ttl=10.0)


def click(record: tuple[str, str], ctx: Context) -> None:
    c = ctx.state(clicks)
    if record[1]:
        c.append(record[1])
    ctx.emit((c.get(), len(c)))


def test_list_elements_expire_one_by_one_and_the_list_starts_over(clock: Clock) -> None:
    h = JobHarness(Job(name="clicks", process=click, key_by=lambda r: r[0], states=[clicks]))
    h.process(("u", "a"))
    clock.ms += 6_000
    h.process(("u", "b"))
    clock.ms += 4_000  # a: 10 s since its append, gone; b: 4 s
    h.process(("u", ""))
    clock.ms += 6_000  # b gone too, and the stored length with it
    h.process(("u", ""))
    h.process(("u", "c"))
    assert h.output() == [(["a"], 1), (["a", "b"], 2), (["b"], 1), ([], 0), (["c"], 1)]
    assert h.state(clicks, "u") == ["c"]


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl must be positive"):
        ValueState("x", int, ttl=0)
    assert ValueState("x", int, ttl=timedelta(minutes=1)).ttl_ms == 60_000


def test_a_state_that_gains_or_loses_a_ttl_reads_what_is_stored() -> None:
    """Adding a ttl: values written without one never expire (until written again);
    removing it: values written with one live on. Neither is corrupt state."""
    plain = msgspec.msgpack.encode(7)
    assert ValueState("x", int, ttl=1.0)._decode(plain) == 7
    expiring = with_expiry(plain, 1)  # long expired: but this state has no ttl any more
    assert ValueState("x", int)._decode(expiring) == 7
    assert split_expiry(expiring) == (1, plain) and split_expiry(plain) == (None, plain)
    assert MapState("m", str, int, ttl=1.0)._live(plain) == plain  # never expires
    assert MapState("m", str, int)._live(expiring) == expiring  # a plain map's entry


K = 4
LIMIT = 300


def manifest() -> StreamJob:
    source = {"seed": 9, "keys": 60, "distribution": "uniform", "limit": LIMIT}
    return StreamJob.model_validate(
        {
            "metadata": {"name": "ttl"},
            "spec": {
                "job": "tests.runtime.jobs:expiring",
                "keyGroups": K,
                "source": source,
                "checkpointInterval": "50ms",
            },
        }
    )


def running(m: StreamJob, store: Any, ordinal: int) -> AbstractAsyncContextManager[Worker]:
    settings = settings_from(m, ordinal=ordinal, store_url="memory://")
    return running_worker(settings, jobs.expiring, store)


async def stored(store: Any, state: str) -> dict[int, dict[bytes, bytes]]:
    return {kg: {k: v async for k, v in store.scan_all("ttl", kg, state)} for kg in range(K)}


async def test_expired_values_leave_the_store_across_a_handoff(worker_store: Any) -> None:
    store = worker_store
    m = manifest()
    await store.delete_job("ttl")
    await store.init_job("ttl", K)
    await store.publish_assignment(
        "ttl", Assignment(1, 1, plan_assignment(K, 1)), expected_generation=0
    )
    async with running(m, store, 0) as w0, running(m, store, 1) as w1:

        async def processed() -> bool:
            infos = [await store.key_group_info("ttl", kg) for kg in range(K)]
            return all(i.position == LIMIT for i in infos)

        await wait_for(processed, 20, "every record processed", interval=0.02)
        written = await stored(store, "last")
        entries = await stored(store, "values")
        elements = await stored(store, "offsets")  # the elements and each key's length
        assert all(elements.values())
        assert all(written.values()), "each key group stored its keys' last values"
        assert all(split_expiry(v)[0] for values in written.values() for v in values.values())
        assert all(entries.values()) and all(
            split_expiry(v)[0] for values in entries.values() for v in values.values()
        )
        # a rescale: half the key groups change owner before their values expire
        await store.publish_assignment(
            "ttl", Assignment(2, 2, plan_assignment(K, 2)), expected_generation=1
        )

        async def swept() -> bool:
            left = [await stored(store, state) for state in ("last", "values", "offsets")]
            return not any(any(per_kg.values()) for per_kg in left)

        await wait_for(swept, 10, "the expired values removed from the store", interval=0.05)
        assert sorted(w0.runners) == [0, 1] and sorted(w1.runners) == [2, 3]
        for kg in range(K):  # the entry indexes (for iteration) lost them too
            assert await store.entries("ttl", kg, "values", b"") == []
            assert await store.entries("ttl", kg, "offsets", b"") == []
        expired = sum(
            w.metrics.registry.get_sample_value("keyshift_state_expired_total", w.metrics.labels)
            or 0.0
            for w in (w0, w1)
        )  # fmt: skip
        removed = (*written.values(), *entries.values(), *elements.values())
        assert expired == sum(len(v) for v in removed)
    for kg in range(K):  # the state without a ttl is exact and stays
        expected = counter_state_encoded(m.spec.generator, K, kg, LIMIT)
        kept = {k: v async for k, v in store.scan_all("ttl", kg, "seen")}
        assert kept == expected["count"]


async def test_a_crash_before_the_sweep_is_committed_leaves_the_values_to_the_next_owner(
    standalone_server: LocalServer, job: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    """The sweep's deletes go out with the owner's next commit or not at all: killed in
    between (a crash point), it removed nothing and lost nothing; the next owner sweeps."""
    url = standalone_server.url
    limit = 200
    source = {"seed": 5, "keys": 40, "distribution": "uniform", "limit": limit}
    doc = counter_manifest(job, key_groups=K, parallelism=1, store_url=url, source=source,
                           checkpoint_interval="100ms")  # fmt: skip
    doc["spec"]["job"] = "tests.runtime.jobs:expiring"
    manifest = write_manifest(tmp_path, doc)
    store = open_store(url, retry_seconds=10)
    try:
        await store.publish_assignment(
            job, Assignment(1, 1, plan_assignment(K, 1)), expected_generation=0
        )
        # killed by the sweep's crash point once the values have expired (not before:
        # nothing expired, nothing swept, nothing to crash on)
        doomed = spawn(manifest, 0, url, http=False, env={"KEYSHIFT_CRASH_POINTS": "sweep.after"})

        async def done() -> bool:
            return await all_done(store, job, K, limit)

        await wait_for(done, 30, "every record processed")
        written = await stored_in(store, job)
        assert all(written.values())
        await wait_for(lambda: not doomed.alive, 15, "the crash at the sweep")
        assert await stored_in(store, job) == written, "a sweep's delete was committed"
        spawn(manifest, 0, url, http=False)  # the next owner (the same worker, restarted)

        async def swept() -> bool:
            return not any((await stored_in(store, job)).values())

        await wait_for(swept, 15, "the next owner to remove the expired values")
        spec = GeneratorSource.model_validate({"type": "generator", **source})
        for kg in range(K):  # the state without a ttl: exact, crash and all
            kept = {k: v async for k, v in store.scan_all(job, kg, "seen")}
            assert kept == counter_state_encoded(spec, K, kg, limit)["count"]
    finally:
        await store.close()


async def stored_in(store: Any, job: str) -> dict[tuple[int, str], dict[bytes, bytes]]:
    """Every expiring state's stored values, entries and elements, by key group and state."""
    return {
        (kg, state): {k: v async for k, v in store.scan_all(job, kg, state)}
        for kg in range(K)
        for state in ("last", "values", "offsets")
    }
