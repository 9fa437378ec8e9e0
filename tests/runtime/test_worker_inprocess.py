"""The worker loop in-process over the in-memory store: exactness, handoff, error policies."""

from __future__ import annotations

import asyncio
import json
import operator
import time
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec
import pytest

from examples.counter import job as counter_job
from keyshift.api.spec import StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.api import Job, encode_key
from keyshift.runtime.cache import StateCache
from keyshift.runtime.config import settings_from
from keyshift.runtime.expected import counter_state_encoded
from keyshift.runtime.sinks import Origin
from keyshift.runtime.sources.generator import Generator
from keyshift.runtime.windows import Reduce, Tumbling, window_job
from keyshift.runtime.worker import Worker
from keyshift.store import Assignment, MemoryStore
from tests.runtime import jobs, running_worker
from tests.runtime.test_window_jobs import Identity, assert_deduplicable
from tests.support import wait_for


def manifest(key_groups: int, limit: int, rate: float | None = None, **spec: Any) -> StreamJob:
    """The counter over a bounded generator; ``rate``: records per second (unlimited)."""
    source: dict[str, Any] = {"seed": 4, "keys": 500, "distribution": "zipf", "limit": limit}
    if rate is not None:
        source["rate"] = {"recordsPerSecond": rate}
    return StreamJob.model_validate(
        {
            "metadata": {"name": "inproc"},
            "spec": {
                "job": "examples.counter:job",
                "keyGroups": key_groups,
                "source": source,
                "checkpointInterval": "50ms",
                **spec,
            },
        }
    )


def running(
    m: StreamJob, job: Job[Any], store: MemoryStore, ordinal: int
) -> AbstractAsyncContextManager[Worker]:
    return running_worker(settings_from(m, ordinal=ordinal, store_url="memory://"), job, store)


async def positions(store: MemoryStore, key_groups: int) -> list[int]:
    return [(await store.key_group_info("inproc", kg)).position for kg in range(key_groups)]


async def assigned_to_one_worker(store: MemoryStore, key_groups: int) -> None:
    """The job ``inproc`` initialised in ``store``, all its key groups on worker 0."""
    await store.init_job("inproc", key_groups)
    await store.publish_assignment(
        "inproc", Assignment(1, 1, plan_assignment(key_groups, 1)), expected_generation=0
    )


async def test_one_worker_then_two_hand_off_without_losing_a_record() -> None:
    k, limit = 6, 4000
    m = manifest(k, limit, 12_000, batchSize=100)
    store = MemoryStore()
    await assigned_to_one_worker(store, k)
    async with running(m, counter_job, store, 0) as w0, running(m, counter_job, store, 1) as w1:

        async def some_progress() -> bool:
            return min(await positions(store, k)) > 0

        await wait_for(some_progress, 20, "some progress", interval=0.02)
        await store.publish_assignment(
            "inproc", Assignment(2, 2, plan_assignment(k, 2)), expected_generation=1
        )
        assert max(await positions(store, k)) < limit, "the handoff came too late"

        async def done() -> bool:
            return await positions(store, k) == [limit] * k and w0.ready and w1.ready

        await wait_for(done, 20, "both workers to finish at generation 2", interval=0.02)
        assert sorted(w0.runners) == [0, 1, 2] and sorted(w1.runners) == [3, 4, 5]
        assert store.acks["inproc"] == {"inproc-worker-0": 2, "inproc-worker-1": 2}
    for kg in range(k):
        expected = counter_state_encoded(m.spec.generator, k, kg, limit)
        for state in ("count", "total"):
            assert store.state("inproc", kg, state) == expected[state]


async def test_error_policy_fail_parks_the_key_group_and_reports_it() -> None:
    k, limit = 4, 2000
    m = manifest(k, limit, errorPolicy="fail", job="tests.runtime.jobs:flaky")
    gen = Generator(m.spec.generator, k, 0.0)
    first_bad = {
        kg: next(i for i, e in enumerate(gen.read(kg, 0, limit)) if e.value == jobs.BAD_VALUE)
        for kg in range(k)
    }
    store = MemoryStore()
    await assigned_to_one_worker(store, k)
    async with running(m, jobs.flaky, store, 0) as worker:

        async def all_failed() -> bool:
            return worker.failed_key_groups == list(range(k))

        await wait_for(all_failed, 20, "every key group to hit its bad record", interval=0.02)
        health = worker.health()
        assert health["status"] == "degraded"
        assert health["failed_key_groups"] == {
            str(kg): {"reason": "user-function", "offset": first_bad[kg], "error": "RuntimeError"}
            for kg in range(k)
        }
        assert f"cannot handle {jobs.BAD_VALUE}" not in json.dumps(health)  # the record's words
        await wait_for(
            lambda: worker.metrics.key_groups_failed._value.get() == k, 5, "the failed gauge"
        )
        marks = worker.failure_marks()
        assert {kg: (m.reason, m.offset) for kg, m in marks.items()} == {
            kg: ("user-function", first_bad[kg]) for kg in range(k)
        }
        # the records before the failing one are committed, the failing one is not
        assert await positions(store, k) == [first_bad[kg] for kg in range(k)]
        records = gen.read(0, 0, first_bad[0])
        counts: dict[str, int] = {}
        for e in records:
            counts[e.key] = counts.get(e.key, 0) + 1
        stored = store.state("inproc", 0, "count")
        assert {msgspec.msgpack.decode(key): msgspec.msgpack.decode(v)
                for key, v in stored.items()} == counts  # fmt: skip
        # the assignment can still move a failed key group away
        await store.publish_assignment(
            "inproc", Assignment(2, 2, plan_assignment(k, 2)), expected_generation=1
        )

        async def released() -> bool:
            return worker.ready and sorted(worker.runners) == [0, 1]

        await wait_for(released, 20, "the failed key groups 2 and 3 to be released", interval=0.02)
        assert (await store.key_group_info("inproc", 2)).owner == ""


async def test_error_policy_skip_counts_and_leaves_no_trace_of_the_record() -> None:
    k, limit = 2, 3000
    m = manifest(k, limit, errorPolicy="skip", job="tests.runtime.jobs:flaky")
    gen = Generator(m.spec.generator, k, 0.0)
    store = MemoryStore()
    await assigned_to_one_worker(store, k)
    async with running(m, jobs.flaky, store, 0) as worker:

        async def done() -> bool:
            return await positions(store, k) == [limit] * k

        await wait_for(done, 20, "all records", interval=0.02)
        bad = sum(e.value == jobs.BAD_VALUE for kg in range(k) for e in gen.read(kg, 0, limit))
        assert bad > 0
        assert worker.metrics.records_skipped._value.get() == bad
        assert worker.health()["status"] == "ok"
    for kg in range(k):
        counts: dict[bytes, int] = {}
        for e in gen.read(kg, 0, limit):
            if e.value != jobs.BAD_VALUE:
                counts[encode_key(e.key)] = counts.get(encode_key(e.key), 0) + 1
        stored = store.state("inproc", kg, "count")
        assert {key: msgspec.msgpack.decode(v) for key, v in stored.items()} == counts


async def test_a_commit_the_store_lost_is_redone_from_the_stored_position() -> None:
    """The store restarts and loses its last commits (AOF everysec): the worker's next
    commit is fenced on the sequence; it claims again and replays from the store."""
    k, limit = 2, 3000
    m = manifest(k, limit, 3000)
    store = MemoryStore()
    await assigned_to_one_worker(store, k)
    async with running(m, counter_job, store, 0) as worker:

        async def committed_once() -> bool:
            return (await store.key_group_info("inproc", 0)).seq >= 1

        await wait_for(committed_once, 20, "a first commit", interval=0.02)
        lost = store.snapshot("inproc", 0)

        async def committed_more() -> bool:
            return (await store.key_group_info("inproc", 0)).seq >= lost.seq + 3

        await wait_for(committed_more, 20, "three more commits", interval=0.02)
        store.restore("inproc", 0, lost)  # those three commits are gone

        async def done() -> bool:
            return await positions(store, k) == [limit] * k

        await wait_for(done, 20, "all records, the lost ones again", interval=0.02)
        assert worker.fenced_key_groups == [0]
        assert (await store.key_group_info("inproc", 0)).epoch == lost.epoch + 1
        assert worker.metrics.commits_fenced._value.get() == 1
    for kg in range(k):
        expected = counter_state_encoded(m.spec.generator, k, kg, limit)
        for state in ("count", "total"):
            assert store.state("inproc", kg, state) == expected[state]


class LosingSink:
    """Collects outputs; reports the outputs of one key group lost, once, at its third
    flush (as a Kafka producer that gave up on a delivery would)."""

    def __init__(self, lose: int) -> None:
        self.lose = lose
        self.flushes = 0
        self.lost_once = False
        self.outputs: list[tuple[int, int, Any]] = []

    def emit(self, origin: Origin, value: Any, key: Any = None) -> None:
        self.outputs.append((origin.key_group, origin.offset, value))

    async def flush(self, key_group: int) -> None:
        if key_group == self.lose:
            self.flushes += 1

    def lost(self, key_group: int) -> bool:
        if key_group == self.lose and self.flushes == 3 and not self.lost_once:
            self.lost_once = True
            return True
        return False

    async def close(self) -> None:
        return None


async def test_outputs_the_sink_lost_are_replayed_from_the_last_commit() -> None:
    """The sink reports outputs of key group 1 lost before a commit: that commit does
    not happen, the key group is claimed again and replays from its last commit.  The
    state is exact and every record's output is there (some twice)."""
    k, limit = 2, 3000
    m = manifest(k, limit, 20_000, batchSize=200)
    store = MemoryStore()
    await assigned_to_one_worker(store, k)
    sink = LosingSink(lose=1)
    worker = Worker(
        settings_from(m, ordinal=0, store_url="memory://"), counter_job, store, sink=sink
    )
    task = asyncio.create_task(worker.run())
    try:

        async def done() -> bool:
            return await positions(store, k) == [limit] * k

        await wait_for(done, 20, "every record after the replay", interval=0.02)
    finally:
        worker.stop()
        async with asyncio.timeout(30):
            await task
    assert sink.lost_once
    assert (await store.key_group_info("inproc", 1)).epoch == 2  # claimed again
    assert (await store.key_group_info("inproc", 0)).epoch == 1  # not touched
    for kg in range(k):
        expected = counter_state_encoded(m.spec.generator, k, kg, limit)
        for state in ("count", "total"):
            assert store.state("inproc", kg, state) == expected[state]
    origins = [(kg, offset) for kg, offset, _ in sink.outputs]
    assert set(origins) == {(kg, o) for kg in range(k) for o in range(limit)}
    assert len(origins) > k * limit  # the replayed ones twice


class ReplayingSink:
    """Delivers outputs at each flush (a consumer sees them), but reports those of key
    group 0 lost at its first ``times`` flushes that delivered timer outputs: the commit
    after them does not happen and the key group replays from its last commit, as after a
    crash between a flush and its commit.  Such a flush first waits until the source holds
    the record at the position the timers fired at (``has_record``), so that the replay
    finds it there."""

    def __init__(self, times: int, limit: int, has_record: Callable[[int], bool]) -> None:
        self.times = times
        self.limit = limit
        self.has_record = has_record
        self.losses = 0
        self._losing = False
        self.buffered: list[tuple[Origin, Any]] = []
        self.kept: list[tuple[Origin, Any]] = []
        self.lost_outputs: list[tuple[Origin, Any]] = []

    def emit(self, origin: Origin, value: Any, key: Any = None) -> None:
        self.buffered.append((origin, value))

    async def flush(self, key_group: int) -> None:
        fired = [o.offset for o, _ in self.buffered if o.key_group == 0 and o.timer]
        if key_group == 0 and fired and self.losses < self.times:
            self._losing = True
            self.lost_outputs += self.buffered
            at = max(fired)
            if at < self.limit:
                await wait_for(lambda: self.has_record(at), 10, f"record {at} to arrive")
        else:
            self.kept += self.buffered
        self.buffered = []

    def lost(self, key_group: int) -> bool:
        if key_group == 0 and self._losing:
            self._losing = False
            self.losses += 1
            return True
        return False

    async def close(self) -> None:
        return None


tiny_windows: Job[Any] = window_job(
    name="tiny-windows",
    key_by=lambda e: e.key,
    value=lambda e: e.value,
    windows=Tumbling(100),
    aggregate=Reduce(operator.add, int),
    result=lambda key, window, total: {"key": key, "start": window.start, "total": total},
)


async def test_a_replay_fires_event_time_windows_at_the_same_positions() -> None:
    """Live input, a record every 500 ms per key group, 100 ms windows, ``idleTimeout``
    20 ms: idle key groups' watermarks follow the wall clock and fire each window before
    the next record.  Three times, key group 0's window results are delivered but not
    committed (the sink reports them lost) and it replays from its last commit, the next
    record already there.  Every result delivered before a loss is delivered again by
    the replay with the same identity (the window fires at the same position), and the
    results deduplicate by identity."""
    k, limit = 2, 8
    m = manifest(k, limit, 4, checkpointInterval="300ms", time={"idleTimeout": "20ms"})
    store = MemoryStore()
    info = await store.init_job("inproc", k)
    generator = Generator(m.spec.generator, k, info.created_at)
    await store.publish_assignment(
        "inproc", Assignment(1, 1, plan_assignment(k, 1)), expected_generation=0
    )
    sink = ReplayingSink(3, limit, lambda at: generator.available(0, time.time()) > at)
    worker = Worker(
        settings_from(m, ordinal=0, store_url="memory://"), tiny_windows, store, sink=sink
    )
    task = asyncio.create_task(worker.run())
    try:

        async def done() -> bool:
            infos = [await store.key_group_info("inproc", kg) for kg in range(k)]
            return all(i.position == limit and i.timers == 0 for i in infos)

        await wait_for(done, 30, "every record and every window", interval=0.02)
    finally:
        worker.stop()
        async with asyncio.timeout(30):
            await task
    assert sink.losses == 3
    assert (await store.key_group_info("inproc", 0)).epoch == 4  # claimed again: replayed

    def identified(outputs: list[tuple[Origin, Any]]) -> list[tuple[Identity, int, Any]]:
        return [((o.key_group, o.offset, o.index, o.timer), o.key_group, v) for o, v in outputs]

    kept = identified(sink.kept)
    lost = identified(sink.lost_outputs)
    assert lost
    not_replayed = [o for o in lost if o not in kept]
    assert not not_replayed, f"delivered, then never delivered again by the replay: {not_replayed}"
    assert_deduplicable(kept + lost)


minute_windows: Job[Any] = window_job(
    name="minute-windows",
    key_by=lambda e: e.key,
    value=lambda e: e.value,
    windows=Tumbling(60_000),
    aggregate=Reduce(operator.add, int),
)


async def test_a_corrupt_window_state_stops_the_key_group_when_its_timer_fires(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A window job stops with its one-minute windows open (their timers pending); one
    window state value of key group 0 is overwritten with garbage; the job restarts on
    its input, which has ended (``errorPolicy: skip``): every window fires, and the
    corrupt one stops key group 0 with a store error.  Nothing of it is committed: not
    the timers that fired before, not the end-of-input watermark."""
    k = 2
    live = manifest(k, 10_000, 40, errorPolicy="skip")
    store = MemoryStore()
    await assigned_to_one_worker(store, k)
    async with running(live, minute_windows, store, 0):

        async def some_records() -> bool:
            return min(await positions(store, k)) >= 10

        await wait_for(some_records, 20, "some records in open windows", interval=0.02)
    before = await store.key_group_info("inproc", 0)
    assert before.timers > 1, "no open windows"
    snapshot = store.snapshot("inproc", 0)
    corrupt_field = sorted(snapshot.states["windows"])[0]  # <key><window start>, per entry
    snapshot.states["windows"][corrupt_field] = b"\xc1"
    corrupt_key = corrupt_field[: 1 + (corrupt_field[0] & 0x1F)]  # the key: a msgpack fixstr
    store.restore("inproc", 0, snapshot)

    ended = manifest(k, max(await positions(store, k)), errorPolicy="skip")
    async with running(ended, minute_windows, store, 0) as worker:

        async def key_group_0_failed() -> bool:
            return 0 in worker.failed_key_groups

        await wait_for(key_group_0_failed, 20, "key group 0 to stop", interval=0.02)
        health = worker.health()
        failed = health["failed_key_groups"]["0"]
        assert (failed["reason"], failed["error"]) == ("store", "CorruptStateError")
        # the key is in the log, never in /healthz, which the pod's network can read
        key = f"key {msgspec.msgpack.decode(corrupt_key)!r}"
        assert "corrupt state in the store: key group 0, state 'windows'" in caplog.text
        assert key in caplog.text
        assert str(msgspec.msgpack.decode(corrupt_key)) not in json.dumps(health)
        assert worker.metrics.records_skipped._value.get() == 0
        after = await store.key_group_info("inproc", 0)
        assert (after.position, after.seq, after.watermark, after.timers) == (
            before.position, before.seq, before.watermark, before.timers
        )  # fmt: skip


async def test_commits_lost_before_a_release_are_noticed_and_replayed_by_the_new_owner() -> None:
    """The store loses key group 0's last commits after its input ended, and the key group
    moves to another worker: the old owner says so (a log line, the lost-commits counter)
    and releases it; the new owner replays from what the store holds."""
    k, limit = 2, 2000
    m = manifest(k, limit, 4000)
    store = MemoryStore()
    await assigned_to_one_worker(store, k)
    async with running(m, counter_job, store, 0) as w0, running(m, counter_job, store, 1):

        async def committed_once() -> bool:
            return (await store.key_group_info("inproc", 0)).seq >= 1

        await wait_for(committed_once, 20, "a first commit", interval=0.02)
        lost = store.snapshot("inproc", 0)
        assert lost.position < limit, "the snapshot came too late"

        async def done() -> bool:
            return await positions(store, k) == [limit] * k

        await wait_for(done, 20, "all records, once", interval=0.02)
        store.restore("inproc", 0, lost)  # the commits since are gone
        await store.publish_assignment("inproc", Assignment(2, 2, (1, 0)), expected_generation=1)
        await wait_for(done, 20, "all records, the lost ones again", interval=0.02)
        assert (await store.key_group_info("inproc", 0)).owner == "inproc-worker-1"
        assert w0.metrics.commits_lost._value.get() == 1
    for kg in range(k):
        expected = counter_state_encoded(m.spec.generator, k, kg, limit)
        for state in ("count", "total"):
            assert store.state("inproc", kg, state) == expected[state]


class EvictingStore(MemoryStore):
    """A store during whose loads the worker's cache loses every clean entry (three loads
    of a key group's every four: at times every round of a batch's load), as when the
    other key groups' loads fill it while one key group waits for its own."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: StateCache | None = None
        self.loads: dict[int, int] = {}
        self.evicted = 0

    async def get_states(
        self, job: str, key_group: int, wanted: Mapping[str, Collection[bytes]]
    ) -> dict[str, dict[bytes, bytes]]:
        found = await super().get_states(job, key_group, wanted)
        loads = self.loads[key_group] = self.loads.get(key_group, 0) + 1
        if self.cache is not None and loads % 4:
            bound, before = self.cache.max_bytes, self.cache.evictions
            self.cache.max_bytes = 0
            self.cache.evict()
            self.cache.max_bytes = bound
            self.evicted += self.cache.evictions - before
        return found


async def test_entries_evicted_while_their_batch_waits_for_its_load_are_looked_up_again() -> None:
    """A batch looks its keys up before its load and keeps the entries it found; when the
    cache evicts some of them meanwhile, it must not write to those (their writes would be
    lost): the state is exact.  The rate leaves time for commits between batches, so
    that the entries a batch finds are clean, and can be evicted."""
    k, limit = 2, 3000
    m = manifest(k, limit, 4000, batchSize=200)
    store = EvictingStore()
    await assigned_to_one_worker(store, k)
    async with running(m, counter_job, store, 0) as worker:
        store.cache = worker.cache

        async def done() -> bool:
            return await positions(store, k) == [limit] * k

        await wait_for(done, 30, "every record committed", interval=0.02)
    assert store.evicted > 0, "nothing was evicted during a load"
    for kg in range(k):
        expected = counter_state_encoded(m.spec.generator, k, kg, limit)
        for state in ("count", "total"):
            assert store.state("inproc", kg, state) == expected[state], (kg, state)
