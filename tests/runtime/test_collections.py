"""Maps and lists stored per entry, run by real workers on every store backend: exact
state across a handoff with a cache far smaller than the state, iteration, a map too
large to iterate, and state of the old per-key layout refused, then migrated."""

from __future__ import annotations

import asyncio
import secrets
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec
import pytest

from keyshift.api.spec import StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.api import Job, encode_key
from keyshift.runtime.config import settings_from
from keyshift.runtime.keygroup import StateLayoutError
from keyshift.runtime.sinks import Origin
from keyshift.runtime.sources.generator import Event, Generator
from keyshift.runtime.store import read_entries
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, RedisStateStore
from keyshift.store.migrate import LayoutError, migrate_entries
from keyshift.store.server import LocalServer
from tests.runtime import jobs, running_worker
from tests.store.test_admin_cli import keyshift
from tests.support import wait_for

K = 4


class CollectingSink:
    """Every output with its origin (a consumer's view: duplicates after a handoff)."""

    def __init__(self) -> None:
        self.outputs: list[tuple[int, int, Any]] = []

    def emit(self, origin: Origin, value: Any, key: Any = None) -> None:
        self.outputs.append((origin.key_group, origin.offset, value))

    async def flush(self, key_group: int) -> None:
        return None

    def lost(self, key_group: int) -> bool:
        return False

    async def close(self) -> None:
        return None


def manifest(
    name: str, limit: int, job: str, *, cache_bytes: int, rate: float | None = None
) -> StreamJob:
    source: dict[str, Any] = {"seed": 11, "keys": 24, "limit": limit, "maxValue": 1000}
    if rate is not None:
        source["rate"] = {"recordsPerSecond": rate}
    return StreamJob.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "job": job,
                "keyGroups": K,
                "source": source,
                "checkpointInterval": "50ms",
                "batchSize": 100,
                "stateStore": {"cacheBytes": cache_bytes},
            },
        }
    )


def running(
    m: StreamJob, job: Job[Any], store: Any, ordinal: int, sink: CollectingSink
) -> AbstractAsyncContextManager[Worker]:
    settings = settings_from(m, ordinal=ordinal, store_url="memory://")
    return running_worker(settings, job, store, sink=sink)


async def positions(store: Any, name: str) -> list[int]:
    return [(await store.key_group_info(name, kg)).position for kg in range(K)]


def expected_visits(
    m: StreamJob, kg: int, limit: int
) -> tuple[dict[str, dict[int, int]], dict[str, list[int]], set[tuple[int, int, Any]]]:
    """What ``jobs.visits`` must leave: per key its map and list, and its outputs."""
    maps: dict[str, dict[int, int]] = {}
    lists: dict[str, list[int]] = {}
    outputs: set[tuple[int, int, Any]] = set()
    events: list[Event] = Generator(m.spec.generator, K, 0.0).read(kg, 0, limit)
    for offset, e in enumerate(events):
        slots = maps.setdefault(e.key, {})
        slot = e.value % jobs.SLOTS
        slots[slot] = slots.get(slot, 0) + 1
        lists.setdefault(e.key, []).append(e.value)
        if e.value % 25 == 0:
            total = sum(slots.values())
            outputs.add((kg, offset, (e.key, total, len(lists[e.key]))))
    return maps, lists, outputs


async def stored_visits(
    store: Any, name: str, kg: int, keys: list[str]
) -> tuple[dict[str, dict[int, int]], dict[str, list[int]]]:
    decode = msgspec.msgpack.decode
    maps = {}
    lists = {}
    for key in keys:
        kb = encode_key(key)
        maps[key] = {
            decode(k): decode(v) for k, v in await read_entries(store, name, kg, "visits", kb)
        }
        lists[key] = [decode(v) for _, v in await read_entries(store, name, kg, "recent", kb)]
        (length,) = (await store.get_many(name, kg, "recent", [kb])).values()
        assert decode(length) == len(lists[key]), f"the length of {key}'s list"
    return maps, lists


async def test_maps_and_lists_are_exact_across_a_handoff_with_a_small_cache(
    worker_store: Any,
) -> None:
    """``jobs.visits`` keeps a map of 40 entries and a growing list per key, with a cache
    of 64 KiB (a few percent of the state: entries are evicted and loaded again, maps
    listed again); one worker, then two.  Every map and list in the store is exactly what
    the input makes, and every output (the map's total by iteration, the list's length)
    is the one its record must give."""
    name = f"coll-{secrets.token_hex(3)}"
    limit = 2500
    m = manifest(name, limit, "tests.runtime.jobs:visits", cache_bytes=64 * 1024, rate=15_000)
    store = worker_store
    await store.init_job(name, K)
    await store.publish_assignment(
        name, Assignment(1, 1, plan_assignment(K, 1)), expected_generation=0
    )
    sink = CollectingSink()
    async with (
        running(m, jobs.visits, store, 0, sink) as w0,
        running(m, jobs.visits, store, 1, sink) as w1,
    ):

        async def some_progress() -> bool:
            return min(await positions(store, name)) > 0

        await wait_for(some_progress, 30, "some progress", interval=0.02)
        await store.publish_assignment(
            name, Assignment(2, 2, plan_assignment(K, 2)), expected_generation=1
        )
        assert max(await positions(store, name)) < limit, "the handoff came too late"

        async def done() -> bool:
            return await positions(store, name) == [limit] * K and w0.ready and w1.ready

        await wait_for(done, 60, "both workers to finish at generation 2", interval=0.05)
        assert w0.failed_key_groups == [] and w1.failed_key_groups == []
        assert w0.cache.evictions > 0, "the cache was large enough: nothing was reloaded"
    emitted = {(kg, off, (v["key"], v["total"], v["n"])) for kg, off, v in sink.outputs}
    expected_outputs: set[tuple[int, int, Any]] = set()
    for kg in range(K):
        maps, lists, outputs = expected_visits(m, kg, limit)
        expected_outputs |= outputs
        assert await stored_visits(store, name, kg, sorted(maps)) == (maps, lists), kg
    assert emitted == expected_outputs


async def test_a_map_too_large_to_iterate_stops_its_key_group_with_the_reason(
    worker_store: Any,
) -> None:
    """``jobs.iterating`` puts one entry per record and iterates the map: with a 32 KiB
    cache, a map of a few hundred entries cannot be iterated.  Under ``errorPolicy:
    fail`` the key group stops at that record, the error says why; what came before is
    committed."""
    name = f"big-{secrets.token_hex(3)}"
    m = manifest(name, 3000, "tests.runtime.jobs:iterating", cache_bytes=32 * 1024)
    store = worker_store
    await store.init_job(name, K)
    await store.publish_assignment(
        name, Assignment(1, 1, plan_assignment(K, 1)), expected_generation=0
    )
    sink = CollectingSink()
    async with running(m, jobs.iterating, store, 0, sink) as worker:

        async def all_failed() -> bool:
            return worker.failed_key_groups == list(range(K))

        await wait_for(all_failed, 60, "every key group to meet a map too large", interval=0.05)
        runner = worker.runners[0]
        assert "too large to iterate" in str(runner.failed)
        assert worker.health()["failed_key_groups"]["0"]["error"] == "StateTooLarge"
        committed = (await store.key_group_info(name, 0)).position
        assert 0 < committed == runner.failed.offset  # type: ignore[union-attr]
    # the lengths emitted before it grew, one entry at a time per key
    lengths = [v for kg, _, v in sink.outputs if kg == 0]
    assert max(lengths) > 20


OLD_MAP = {3: 5, 17: 1}
OLD_LIST = [3, 17, 3]


async def test_state_of_the_per_key_layout_is_refused_then_migrated(
    standalone_server: LocalServer,
) -> None:
    """A job whose map and list are stored one value per key (as before per-entry
    collections): its key groups stop with an error naming the states and the command;
    nothing is committed.  ``keyshift store migrate-entries`` converts them (a value that
    is not what its kind says is refused, changing nothing; a second run changes nothing),
    and the job then runs on from them."""
    from keyshift.store import open_store

    name = f"old-{secrets.token_hex(3)}"
    limit = 400
    m = manifest(name, limit, "tests.runtime.jobs:visits", cache_bytes=1 << 20)
    store: RedisStateStore = open_store(standalone_server.url, retry_seconds=10)
    try:
        await store.init_job(name, K)
        first = Generator(m.spec.generator, K, 0.0).read(0, 0, 1)[0]
        kb = encode_key(first.key)
        c = await store.claim(name, 0, "old-version")
        encode = msgspec.msgpack.encode
        await store.commit(
            name, 0, epoch=c.epoch, token=c.token, seq=c.seq, position=0,
            puts={"visits": {kb: encode(OLD_MAP)}, "recent": {kb: encode(OLD_LIST)}},
        )  # fmt: skip
        await store.release(name, 0, epoch=c.epoch, token=c.token, generation=0)
        await store.publish_assignment(
            name, Assignment(1, 1, plan_assignment(K, 1)), expected_generation=0
        )
        sink = CollectingSink()
        async with running(m, jobs.visits, store, 0, sink) as worker:

            async def refused() -> bool:
                return worker.failed_key_groups == [0] and await positions(store, name) == [
                    0, limit, limit, limit,
                ]  # fmt: skip

            await wait_for(refused, 30, "key group 0 refused, the others done", interval=0.05)
            failed = worker.runners[0].failed
            assert isinstance(failed, StateLayoutError)
            assert failed.states == {"visits": "map", "recent": "list"}
            assert "migrate-entries" in str(failed) and "--map visits --list recent" in str(failed)
            assert worker.health()["failed_key_groups"]["0"]["reason"] == "store"
        before = await store.dump_key_group(name, 0)
        with pytest.raises(LayoutError, match="not a list"):
            await migrate_entries(store, name, {"visits": "list"})
        assert (await store.dump_key_group(name, 0)).states == before.states
        url = ["--url", standalone_server.url]
        migrated = await asyncio.to_thread(
            keyshift, "store", "migrate-entries", name, "--map", "visits", "--list", "recent", *url
        )
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        assert "2 keys in 1 of 4 key groups" in migrated.stdout
        again = await migrate_entries(store, name, {"visits": "map", "recent": "list"})
        assert again.migrated == 0  # idempotent

        sink = CollectingSink()
        await store.publish_assignment(
            name, Assignment(2, 1, plan_assignment(K, 1)), expected_generation=1
        )
        async with running(m, jobs.visits, store, 0, sink) as worker:

            async def done() -> bool:
                return await positions(store, name) == [limit] * K

            await wait_for(done, 30, "key group 0 to run from the migrated state")
        maps, lists, _ = expected_visits(m, 0, limit)
        for slot, n in OLD_MAP.items():
            maps[first.key][slot] = maps[first.key].get(slot, 0) + n
        lists[first.key] = OLD_LIST + lists[first.key]
        assert await stored_visits(store, name, 0, sorted(maps)) == (maps, lists)
    finally:
        await store.delete_job(name)
        await store.close()
