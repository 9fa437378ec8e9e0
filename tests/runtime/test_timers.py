"""Event time: watermarks and timers (pure), and timers committed with the state across a
handoff against a real Valkey."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import msgspec

from keyshift.api.spec import StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.api import Context, Job, ListState, ValueState, encode_key
from keyshift.runtime.config import settings_from
from keyshift.runtime.faults import ENV
from keyshift.runtime.sources.generator import Event, Generator
from keyshift.runtime.store import read_entries
from keyshift.runtime.timers import (
    END_OF_TIME,
    EVENT_TIME,
    PROCESSING_TIME,
    FiredTimer,
    TimerTable,
    Watermark,
    timer_member,
)
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, MemoryStore, RedisStateStore, open_store
from keyshift.store.protocol import Timer, TimerChanges
from keyshift.store.server import LocalServer
from tests.runtime import running_worker
from tests.support import WorkerProcess, write_manifest

# -- pure: the watermark --------------------------------------------------------------


def test_watermark_trails_the_largest_event_time_and_never_goes_back() -> None:
    wm = Watermark(out_of_orderness=0.05, idle_timeout=10)
    assert wm.value is None
    assert wm.observe(1_000, now=0.0)
    assert wm.value == 950
    assert not wm.observe(990, now=0.1)  # out of order, not late: no change
    assert wm.value == 950
    assert not wm.is_late(990)
    assert wm.observe(1_100, now=0.2)
    assert wm.value == 1_050
    assert not wm.observe(500, now=0.3)  # late
    assert wm.is_late(500)
    assert wm.value == 1_050


def test_watermark_restored_from_a_commit_does_not_go_back() -> None:
    wm = Watermark(out_of_orderness=0, value=5_000)
    assert not wm.observe(4_000, now=0.0)
    assert wm.value == 5_000
    assert wm.observe(5_001, now=0.0)


def test_idle_key_group_follows_processing_time_after_the_timeout() -> None:
    wm = Watermark(out_of_orderness=1, idle_timeout=10)
    wm.observe(100_000, now=100.0)
    assert wm.value == 99_000
    assert not wm.idle(now=105.0)  # not idle long enough
    assert wm.value == 99_000
    assert wm.idle(now=120.0)
    assert wm.value == 120_000 - 10_000 - 1_000
    assert not wm.idle(now=119.0)  # processing time going back does not move it back
    assert wm.end()
    assert wm.value == END_OF_TIME


def test_idle_without_any_record_starts_the_idle_clock() -> None:
    wm = Watermark(idle_timeout=2)
    assert not wm.idle(now=50.0)
    assert wm.value is None
    assert wm.idle(now=52.0)
    assert wm.value == 50_000


# -- pure: the timer table -------------------------------------------------------------


def _fire_all(table: TimerTable, queue: str, until: int) -> list[tuple[int, bytes]]:
    fired = []
    for t, kb, member in table.peek_due(queue, until, 1000):
        table.pop_fired(queue, kb, t, member)
        fired.append((t, kb))
    return fired


def test_timers_are_deduplicated_by_key_and_time_and_fire_in_time_order() -> None:
    table = TimerTable()
    a, b = encode_key("a"), encode_key("b")
    for t, k in [(300, a), (100, b), (200, a), (100, b), (100, a), (300, a)]:
        table.register(EVENT_TIME, k, t)
    table.register(EVENT_TIME, a, 200, payload="last wins")
    assert len(table) == 4
    assert table.next_time(EVENT_TIME) == 100
    assert _fire_all(table, EVENT_TIME, 150) == [(100, a), (100, b)]
    assert _fire_all(table, EVENT_TIME, 150) == []
    due = table.peek_due(EVENT_TIME, 1_000, 10)
    assert [(t, kb) for t, kb, _ in due] == [(200, a), (300, a)]
    assert msgspec.msgpack.decode(due[0][2]) == [a, 200, "last wins"]
    assert table.peek_due(PROCESSING_TIME, END_OF_TIME, 10) == []


def test_timer_changes_are_disjoint_and_cleared_by_commit() -> None:
    table = TimerTable()
    a = encode_key("a")
    stored = Timer(time=50, payload=timer_member(a, 50, None))
    table.load(EVENT_TIME, [stored])
    assert not table.has_changes()
    table.register(EVENT_TIME, a, 60)
    table.register(EVENT_TIME, a, 70)
    table.delete(EVENT_TIME, a, 70)  # not added any more (its removal is a no-op in the store)
    table.delete(EVENT_TIME, a, 50)  # committed: removed in the next commit
    table.delete(EVENT_TIME, a, 999)  # unknown: nothing
    changes = table.changes()
    assert list(changes) == [EVENT_TIME]
    assert [t.time for t in changes[EVENT_TIME].add] == [60]
    assert list(changes[EVENT_TIME].remove) == sorted([stored.payload, timer_member(a, 70, None)])
    table.committed()
    assert not table.has_changes()
    assert table.next_time(EVENT_TIME) == 60
    # fire a committed timer, register it again in the same interval: one add, no remove
    table.load(EVENT_TIME, [stored])
    (entry,) = table.peek_due(EVENT_TIME, 50, 10)
    table.pop_fired(EVENT_TIME, a, 50, entry[2])
    table.register(EVENT_TIME, a, 50)
    changes = table.changes()
    assert [t.time for t in changes[EVENT_TIME].add] == [50]
    assert list(changes[EVENT_TIME].remove) == []


# -- the job: a count per key, reported on an event-time timer every INTERVAL ms --------

INTERVAL = 100
count = ValueState("count", int, default=0)
fired = ListState("fired", list[int])


async def fired_of(store: RedisStateStore, job: str, kg: int, key: str) -> list[list[int]]:
    """The ``fired`` list of ``key`` as the store holds it."""
    entries = await read_entries(store, job, kg, "fired", encode_key(key))
    return [msgspec.msgpack.decode(v) for _, v in entries]


def process(event: Event, ctx: Context) -> None:
    c = ctx.state(count)
    c.update(c.value() + 1)
    ts = ctx.timestamp
    assert ts is not None
    ctx.timers.register_event_time((ts // INTERVAL + 1) * INTERVAL)


def on_timer(timer: FiredTimer, ctx: Context) -> None:
    n = ctx.state(count).value()
    ctx.state(fired).append([timer.time, n])
    ctx.emit({"key": ctx.key, "time": timer.time, "count": n})


timer_job = Job(
    name="timer-counter",
    process=process,
    key_by=lambda e: e.key,
    states=[count, fired],
    on_timer=on_timer,
)


def expected_firings(
    gen: Generator, kg: int, limit: int, out_of_orderness_ms: int
) -> dict[str, list[list[int]]]:
    """A plain re-statement of the semantics: after each record, the timers at or below
    the watermark fire in (time, key) order; at the end of the input, all of them."""
    counts: dict[str, int] = {}
    pending: set[tuple[int, bytes, str]] = set()
    out: dict[str, list[list[int]]] = {}
    wm: int | None = None

    def fire(until: int) -> None:
        for t, kb, key in sorted(p for p in pending if p[0] <= until):
            pending.discard((t, kb, key))
            out.setdefault(key, []).append([t, counts[key]])

    for offset, event in enumerate(gen.read(kg, 0, limit)):
        et = gen.event_time(kg, offset)
        counts[event.key] = counts.get(event.key, 0) + 1
        t = (et // INTERVAL + 1) * INTERVAL
        pending.add((t, encode_key(event.key), event.key))
        if wm is None or et - out_of_orderness_ms > wm:
            wm = et - out_of_orderness_ms
        fire(wm)
    fire(END_OF_TIME)
    return out


def manifest(name: str, key_groups: int, limit: int, sink: Path) -> StreamJob:
    return StreamJob.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "job": "tests.runtime.test_timers:timer_job",
                "keyGroups": key_groups,
                "source": {
                    "seed": 7,
                    "keys": 40,
                    "limit": limit,
                    "disorder": "30ms",
                    "rate": {"recordsPerSecond": 4000},
                },
                "sink": {"type": "log", "path": sink.name},
                "checkpointInterval": "50ms",
                "batchSize": 50,
                "time": {"outOfOrderness": "30ms"},
            },
        }
    )


def running(
    m: StreamJob, store: Any, ordinal: int, url: str, output_dir: Path | None = None
) -> AbstractAsyncContextManager[Worker]:
    settings = settings_from(m, ordinal=ordinal, store_url=url, output_dir=output_dir)
    return running_worker(settings, timer_job, store)


def test_generator_event_times_follow_the_schedule_with_bounded_disorder() -> None:
    m = manifest("x", 4, 100, Path("/dev/null"))
    gen = Generator(m.spec.generator, 4, created_at=1000.0)
    for kg in range(4):
        for offset in range(100):
            scheduled = round((1000.0 + (offset + 1) * 4 / 4000) * 1000)
            et = gen.event_time(kg, offset)
            assert scheduled - 30 <= et <= scheduled
            assert gen.event_time(kg, offset) == et  # deterministic
    assert (
        len({gen.event_time(0, o) - round((1000.0 + (o + 1) / 1000) * 1000) for o in range(100)})
        > 5
    )


async def _wait(condition: Any, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_timers_fire_exactly_once_across_a_handoff(
    standalone_server: LocalServer, tmp_path: Path
) -> None:
    k, limit = 4, 1200
    name = f"t-{secrets.token_hex(4)}"
    sink = tmp_path / "out.jsonl"
    m = manifest(name, k, limit, sink)
    store: RedisStateStore = open_store(standalone_server.url, retry_seconds=10)
    try:
        await store.init_job(name, k)
        await store.publish_assignment(
            name, Assignment(1, 1, plan_assignment(k, 1)), expected_generation=0
        )
        url = standalone_server.url
        async with running(m, store, 0, url, tmp_path), running(m, store, 1, url, tmp_path):

            async def positions() -> list[int]:
                return [(await store.key_group_info(name, kg)).position for kg in range(k)]

            async def some_progress() -> bool:
                return min(await positions()) > 0

            await _wait(some_progress, "some progress")
            await store.publish_assignment(
                name, Assignment(2, 2, plan_assignment(k, 2)), expected_generation=1
            )
            assert max(await positions()) < limit, "the handoff came too late"

            async def done() -> bool:
                infos = [await store.key_group_info(name, kg) for kg in range(k)]
                return all(
                    i.position == limit and i.timers == 0 and i.watermark == END_OF_TIME
                    for i in infos
                )

            await _wait(done, "all records and all timers")
            moved = [kg for kg in range(k) if (await store.key_group_info(name, kg)).epoch > 1]
            assert moved, "the handoff moved no key group"

        info = await store.job_info(name)
        assert info is not None
        gen = Generator(m.spec.generator, k, info.created_at)
        emitted: list[tuple[str, int, int]] = []
        decoder = msgspec.json.Decoder()
        for line in sink.read_bytes().splitlines():
            v = decoder.decode(line)["value"]
            emitted.append((v["key"], v["time"], v["count"]))
        expected_emitted: list[tuple[str, int, int]] = []
        total = 0
        for kg in range(k):
            expected = expected_firings(gen, kg, limit, 30)
            got = {key: await fired_of(store, name, kg, key) for key in expected}
            assert got == expected, f"key group {kg}"
            for key, firings in expected.items():
                expected_emitted += [(key, t, n) for t, n in firings]
                total += len(firings)
        assert total > 4 * 40  # several windows per key
        assert sorted(emitted) == sorted(expected_emitted)  # no handoff duplicates
    finally:
        await store.delete_job(name)
        await store.close()


async def test_memory_store_keeps_timers_and_watermark_across_claims() -> None:
    store = MemoryStore()
    await store.init_job("j", 1)
    claim = await store.claim("j", 0, "w")
    assert claim.watermark is None
    member = timer_member(encode_key("a"), 10, None)
    await store.commit(
        "j", 0, epoch=claim.epoch, token=claim.token, seq=claim.seq, position=3, watermark=7,
        timers={EVENT_TIME: TimerChanges(add=[Timer(10, member)])},
    )  # fmt: skip
    again = await store.claim("j", 0, "w2")
    assert again.watermark == 7
    assert await store.due_timers("j", 0, EVENT_TIME, 9) == []
    assert await store.due_timers("j", 0, EVENT_TIME, 10) == [Timer(10, member)]


async def test_timers_after_crashes_before_and_after_commits(
    standalone_server: LocalServer,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    """A worker killed before a commit fires its uncommitted timers again on replay (state
    replayed too); killed after one, it never fires the committed ones again.

    Each crash point is one the incarnation must pass, however fast it runs: the first
    needs a commit per key group (four) to finish, so its fourth commit is always sent;
    that one is lost, so the second always commits at least once."""
    k, limit = 4, 1200
    name = f"t-{secrets.token_hex(4)}"
    sink = tmp_path / "out.jsonl"
    url = standalone_server.url
    m = manifest(name, k, limit, sink)
    raw = m.model_dump(by_alias=True, mode="json", exclude_none=True)
    raw["spec"]["stateStore"] = {"url": url}
    path = write_manifest(tmp_path, raw)
    store: RedisStateStore = open_store(url, retry_seconds=10)
    try:
        await store.init_job(name, k)
        await store.publish_assignment(
            name, Assignment(1, 1, plan_assignment(k, 1)), expected_generation=0
        )
        worker = spawn(path, 0, url, http=False, env={ENV: "commit.before@4"})
        incarnations = ["commit.after@1", ""]

        async def done() -> bool:
            if worker.died_by_itself():
                worker.env[ENV] = incarnations.pop(0) if incarnations else ""
                worker.start()
            infos = [await store.key_group_info(name, kg) for kg in range(k)]
            finished = all(i.position == limit and i.watermark == END_OF_TIME for i in infos)
            # a crash point hit by the last commit may still be killing the worker: done
            # once the third incarnation, which has none, runs
            return finished and not incarnations and worker.alive

        await _wait(done, "all records and all timers", 60)
        assert worker.self_kills == 2
        for kg in range(k):
            assert (await store.key_group_info(name, kg)).timers == 0
        info = await store.job_info(name)
        assert info is not None
        gen = Generator(m.spec.generator, k, info.created_at)
        expected_emitted: set[tuple[str, int, int]] = set()
        for kg in range(k):
            expected = expected_firings(gen, kg, limit, 30)
            got = {key: await fired_of(store, name, kg, key) for key in expected}
            assert got == expected, f"key group {kg}"
            expected_emitted |= {(key, t, n) for key, fs in expected.items() for t, n in fs}
        decoder = msgspec.json.Decoder()
        emitted = []
        for line in sink.read_bytes().splitlines():
            v = decoder.decode(line)["value"]
            emitted.append((v["key"], v["time"], v["count"]))
        # at least once: the outputs of uncommitted firings may be written again
        assert set(emitted) == expected_emitted
    finally:
        await store.delete_job(name)
        await store.close()


seen = ValueState("seen", int, default=0)
woke = ValueState("woke", int, default=0)


def _remind(event: Event, ctx: Context) -> None:
    s = ctx.state(seen)
    if s.value() == 0:
        ctx.timers.register_processing_time(int(time.time() * 1000) + 100, payload=event.key)
        ctx.timers.register_event_time(10**15)  # far away: deleted below
        ctx.timers.delete_event_time(10**15)
    s.update(s.value() + 1)


def _woken(timer: FiredTimer, ctx: Context) -> None:
    assert timer.domain == PROCESSING_TIME and timer.payload == ctx.key
    assert ctx.state(seen).value() > 0
    w = ctx.state(woke)
    w.update(w.value() + 1)


reminder_job = Job(
    name="reminder",
    process=_remind,
    key_by=lambda e: e.key,
    states=[seen, woke],
    on_timer=_woken,
)


async def test_processing_time_timers_fire_once_per_key_in_process() -> None:
    k, limit = 2, 300
    m = StreamJob.model_validate(
        {
            "metadata": {"name": "proc"},
            "spec": {
                "job": "tests.runtime.test_timers:reminder_job",
                "keyGroups": k,
                "source": {"seed": 3, "keys": 20, "limit": limit},
                "checkpointInterval": "50ms",
            },
        }
    )
    store = MemoryStore()
    await store.init_job("proc", k)
    await store.publish_assignment(
        "proc", Assignment(1, 1, plan_assignment(k, 1)), expected_generation=0
    )
    worker = Worker(settings_from(m, ordinal=0, store_url="memory://"), reminder_job, store)
    task = asyncio.create_task(worker.run())
    try:

        async def all_woken() -> bool:
            infos = [await store.key_group_info("proc", kg) for kg in range(k)]
            return all(i.position == limit and i.timers == 0 for i in infos) and all(
                len(store.state("proc", kg, "woke")) == len(store.state("proc", kg, "seen"))
                for kg in range(k)
            )

        await _wait(all_woken, "every key's reminder")
    finally:
        worker.stop()
        async with asyncio.timeout(30):
            await task
    for kg in range(k):
        woken = store.state("proc", kg, "woke")
        assert woken and all(msgspec.msgpack.decode(v) == 1 for v in woken.values())


def test_a_committed_timer_deleted_registered_and_deleted_again_is_removed() -> None:
    table = TimerTable()
    a = encode_key("a")
    stored = Timer(time=50, payload=timer_member(a, 50, None))
    table.load(EVENT_TIME, [stored])
    table.delete(EVENT_TIME, a, 50)
    table.register(EVENT_TIME, a, 50)
    table.delete(EVENT_TIME, a, 50)
    changes = table.changes()
    assert changes[EVENT_TIME].add == []
    assert list(changes[EVENT_TIME].remove) == [stored.payload]
    assert table.next_time(EVENT_TIME) is None
