"""The conformance suite every state store backend must pass.

Each test runs three times (the ``store`` fixture of this module, or ``worker_store``):
against a real standalone Valkey/Redis, a real 3-master Redis Cluster and the
in-process ``MemoryStore``.  The tests that edit the Redis keys directly, as a fault
would (through :func:`raw`: lost or garbled metadata, a generation written behind the
notification's back), are Redis-specific: they are skipped for ``MemoryStore``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from keyshift.store import (
    Assignment,
    Fenced,
    RedisStateStore,
    Released,
    StaleClaim,
    StaleGeneration,
    StateStore,
    StillOwned,
    StoreCorrupt,
    Timer,
    TimerChanges,
    keys,
    open_store,
)
from keyshift.store.savepoint import export_job, import_job


@pytest.fixture
def store(worker_store: StateStore) -> StateStore:
    """Each backend in turn: Valkey/Redis standalone, Redis Cluster, ``MemoryStore``
    (``worker_store`` of tests/conftest.py)."""
    return worker_store


async def test_claim_increments_epoch_and_returns_committed_position(
    store: StateStore, job: str
) -> None:
    first = await store.claim(job, 3, "w0")
    assert (first.epoch, first.seq, first.position, first.watermark) == (1, 0, 0, None)
    await store.commit(
        job, 3, epoch=first.epoch, token=first.token, seq=0, position=42, watermark=7
    )
    second = await store.claim(job, 3, "w1", generation=5)
    assert (second.epoch, second.seq, second.position, second.watermark) == (2, 1, 42, 7)
    info = await store.key_group_info(job, 3)
    assert (info.owner, info.epoch, info.claimed_generation) == ("w1", 2, 5)


async def test_commit_applies_puts_deletes_position_and_advances_sequence(
    store: StateStore, job: str
) -> None:
    c = await store.claim(job, 0, "w0")
    r1 = await store.commit(
        job,
        0,
        epoch=c.epoch,
        token=c.token,
        seq=c.seq,
        puts={"count": {b"a": b"1", b"b": b"2", b"c": b"3"}, "last": {b"a": b"x"}},
        position=3,
    )
    assert r1.seq == 1 and not r1.replayed
    r2 = await store.commit(
        job,
        0,
        epoch=c.epoch,
        token=c.token,
        seq=r1.seq,
        puts={"count": {b"a": b"10"}},
        deletes={"count": [b"b"], "last": [b"a"]},
        position=5,
    )
    assert r2.seq == 2
    assert await store.get_many(job, 0, "count", [b"a", b"b", b"c", b"zz"]) == {
        b"a": b"10",
        b"c": b"3",
    }
    assert await store.get_many(job, 0, "last", [b"a"]) == {}
    info = await store.key_group_info(job, 0)
    assert (info.seq, info.position, info.entries) == (2, 5, 2)


async def test_get_states_reads_several_states_of_a_key_group_as_get_many_does(
    store: StateStore, job: str
) -> None:
    c = await store.claim(job, 2, "w0")
    await store.commit(
        job,
        2,
        epoch=c.epoch,
        token=c.token,
        seq=c.seq,
        puts={"count": {b"a": b"1", b"b": b"2"}, "last": {b"b": b"x"}},
        position=2,
    )
    other = await store.claim(job, 3, "w0")  # same state names, another key group
    await store.commit(
        job, 3, epoch=other.epoch, token=other.token, seq=other.seq,
        puts={"count": {b"a": b"99"}}, position=1,
    )  # fmt: skip
    wanted = {"count": [b"a", b"b", b"zz"], "last": [b"a", b"b"], "never": [b"a"], "none": []}
    got = await store.get_states(job, 2, wanted)
    assert got == {
        "count": {b"a": b"1", b"b": b"2"},
        "last": {b"b": b"x"},
        "never": {},
        "none": {},
    }
    for state, keys_ in wanted.items():
        assert got[state] == await store.get_many(job, 2, state, keys_)
    assert await store.get_states(job, 2, {}) == {}


async def test_stale_epoch_is_fenced_and_writes_nothing(store: StateStore, job: str) -> None:
    old = await store.claim(job, 1, "old")
    await store.commit(
        job, 1, epoch=old.epoch, token=old.token, seq=0, puts={"s": {b"k": b"v1"}}, position=1
    )
    new = await store.claim(job, 1, "new")
    with pytest.raises(Fenced) as caught:
        await store.commit(
            job,
            1,
            epoch=old.epoch,
            token=old.token,
            seq=1,
            puts={"s": {b"k": b"zombie", b"other": b"zombie"}},
            deletes={"s": [b"k"]},
            position=99,
            timers={"t": TimerChanges(add=[Timer(1, b"zombie")])},
        )
    assert caught.value.reason == "epoch"
    assert (caught.value.expected_epoch, caught.value.stored_epoch) == (old.epoch, new.epoch)
    assert await store.get_many(job, 1, "s", [b"k", b"other"]) == {b"k": b"v1"}
    assert await store.next_timer(job, 1, "t") is None
    info = await store.key_group_info(job, 1)
    assert (info.seq, info.position, info.owner) == (1, 1, "new")


async def test_stale_sequence_is_fenced_and_writes_nothing(store: StateStore, job: str) -> None:
    c = await store.claim(job, 2, "w")
    await store.commit(job, 2, epoch=c.epoch, token=c.token, seq=0, position=10)
    await store.commit(job, 2, epoch=c.epoch, token=c.token, seq=1, position=20)
    for wrong in (0, 3, 7):
        with pytest.raises(Fenced) as caught:
            await store.commit(
                job,
                2,
                epoch=c.epoch,
                token=c.token,
                seq=wrong,
                puts={"s": {b"k": b"v"}},
                position=99,
            )
        assert caught.value.reason == "sequence"
        assert caught.value.stored_seq == 2
    assert await store.get_many(job, 2, "s", [b"k"]) == {}
    assert (await store.key_group_info(job, 2)).position == 20


async def test_another_commit_with_a_used_sequence_is_fenced(store: StateStore, job: str) -> None:
    """Only a retry of the very commit the store applied (its reply lost) is answered
    "replayed" (tests/faults/test_lost_reply.py); any other commit with that sequence,
    even one with the same content, is fenced and writes nothing."""
    c = await store.claim(job, 0, "w")
    first = await store.commit(
        job, 0, epoch=c.epoch, token=c.token, seq=0, puts={"s": {b"a": b"1"}}, position=1
    )
    assert (first.seq, first.replayed) == (1, False)
    for puts, position in (({b"a": b"2", b"b": b"1"}, 2), ({b"a": b"1"}, 1)):
        with pytest.raises(Fenced) as fenced:
            await store.commit(
                job, 0, epoch=c.epoch, token=c.token, seq=0, puts={"s": puts}, position=position
            )
        assert (fenced.value.reason, fenced.value.stored_seq) == ("sequence", 1)
    info = await store.key_group_info(job, 0)
    assert (info.seq, info.position) == (1, 1)
    assert await store.get_many(job, 0, "s", [b"a", b"b"]) == {b"a": b"1"}


async def test_same_epoch_number_with_another_token_is_fenced(store: StateStore, job: str) -> None:
    """A fence is (epoch, token): guessing the epoch number is not enough."""
    c = await store.claim(job, 0, "w")
    with pytest.raises(Fenced):
        await store.commit(job, 0, epoch=c.epoch, token="f" * 32, seq=0, position=5)


async def test_concurrent_claimers_exactly_one_can_commit(store: StateStore, job: str) -> None:
    claims = await asyncio.gather(*(store.claim(job, 4, f"w{i}") for i in range(8)))
    assert sorted(c.epoch for c in claims) == list(range(1, 9))

    async def try_commit(i: int) -> bool:
        c = claims[i]
        try:
            await store.commit(
                job, 4, epoch=c.epoch, token=c.token, seq=c.seq,
                puts={"s": {b"winner": c.owner.encode()}}, position=1,
            )  # fmt: skip
        except Fenced:
            return False
        return True

    results = await asyncio.gather(*(try_commit(i) for i in range(8)))
    assert sum(results) == 1
    winner = max(claims, key=lambda c: c.epoch)
    assert results[claims.index(winner)]
    assert await store.get_many(job, 4, "s", [b"winner"]) == {b"winner": winner.owner.encode()}


async def test_release_marks_generation_and_fences_the_releaser(
    store: StateStore, job: str
) -> None:
    c = await store.claim(job, 5, "w0", generation=1)
    await store.commit(job, 5, epoch=c.epoch, token=c.token, seq=0, position=8)
    await store.release(job, 5, epoch=c.epoch, token=c.token, generation=2)
    await store.release(job, 5, epoch=c.epoch, token=c.token, generation=2)  # a retry is fine
    info = await store.key_group_info(job, 5)
    assert (info.released_generation, info.owner, info.position) == (2, "", 8)
    with pytest.raises(Fenced):
        await store.commit(job, 5, epoch=c.epoch, token=c.token, seq=1, position=9)
    nxt = await store.claim(job, 5, "w1", generation=2)
    assert (nxt.epoch, nxt.position, nxt.seq) == (c.epoch + 1, 8, 1)
    handed = await store.key_group_info(job, 5)
    assert handed.claimed_at is not None and handed.released_at is not None
    assert handed.last_pause == pytest.approx(handed.claimed_at - handed.released_at)
    with pytest.raises(Fenced):
        await store.release(job, 5, epoch=c.epoch, token=c.token, generation=3)


async def test_owners_names_each_key_groups_holder(store: StateStore, job: str) -> None:
    await store.init_job(job, 8)
    c = await store.claim(job, 1, "w0", generation=1)
    await store.claim(job, 2, "w1", generation=1)
    assert await store.owners(job, [1, 2, 3]) == {1: "w0", 2: "w1", 3: ""}
    await store.release(job, 1, epoch=c.epoch, token=c.token, generation=2)
    assert await store.owners(job, [1, 2]) == {1: "", 2: "w1"}


async def test_large_commit_is_atomic_and_complete(store: StateStore, job: str) -> None:
    c = await store.claim(job, 0, "w")
    puts = {f"k{i}".encode(): f"v{i}".encode() * 10 for i in range(10_000)}
    await store.commit(job, 0, epoch=c.epoch, token=c.token, seq=0, puts={"s": puts}, position=1)
    got = await store.get_many(job, 0, "s", list(puts))
    assert got == puts
    dels = [f"k{i}".encode() for i in range(0, 10_000, 2)]
    await store.commit(job, 0, epoch=c.epoch, token=c.token, seq=1, deletes={"s": dels}, position=2)
    assert (await store.key_group_info(job, 0)).entries == 5_000


async def test_a_commit_keeps_any_bytes(worker_store: Any, job: str) -> None:
    """Keys and values are bytes of any kind, whatever the commit's framing: every byte,
    NUL, empty values, digits (never read as numbers), values past 64 KiB; an entry
    state's index holds more entries than one call of the script takes at once."""
    c = await worker_store.claim(job, 0, "w")
    every = bytes(range(256))
    puts = {
        every: every[::-1],
        b"\x00": b"",
        b"": b"\x00\x00",
        b"1e3": b"007",
        b"-0": b"1.0",
        b"big": bytes(range(256)) * 300,
    }
    many = {b"m\xa1" + n.to_bytes(2, "big"): n.to_bytes(2, "little") for n in range(2_500)}
    await worker_store.commit(
        job, 0, epoch=c.epoch, token=c.token, seq=c.seq, position=1,
        puts={"s": puts, "m": many}, entry_states={"m"},
    )  # fmt: skip
    assert await worker_store.get_many(job, 0, "s", list(puts)) == puts
    assert await worker_store.entries(job, 0, "m", b"m", count=5_000) == sorted(many.items())
    gone = [every, b""]
    await worker_store.commit(
        job, 0, epoch=c.epoch, token=c.token, seq=c.seq + 1, position=2,
        deletes={"s": gone, "m": list(many)[1:]}, entry_states={"m"},
    )  # fmt: skip
    kept = {k: v for k, v in puts.items() if k not in gone}
    assert await worker_store.get_many(job, 0, "s", list(puts)) == kept
    assert await worker_store.entries(job, 0, "m", b"m", count=5_000) == list(many.items())[:1]


async def test_scan_by_prefix_returns_each_matching_entry_once(store: StateStore, job: str) -> None:
    c = await store.claim(job, 0, "w")
    entries = {b"user:1:" + str(i).encode(): b"a" for i in range(500)}
    entries |= {b"user:2:" + str(i).encode(): b"b" for i in range(300)}
    entries |= {b"us*r:[1]:x": b"glob", b"user:1": b"exact"}
    await store.commit(job, 0, epoch=c.epoch, token=c.token, seq=0, puts={"m": entries}, position=1)
    found = [kv async for kv in store.scan_all(job, 0, "m", b"user:1:")]
    assert len(found) == 500
    assert dict(found) == {k: v for k, v in entries.items() if k.startswith(b"user:1:")}
    glob = [kv async for kv in store.scan_all(job, 0, "m", b"us*r:[1]")]
    assert glob == [(b"us*r:[1]:x", b"glob")]
    everything = [kv async for kv in store.scan_all(job, 0, "m")]
    assert dict(everything) == entries and len(everything) == len(entries)


async def test_timers_are_ordered_by_time_and_removable(store: StateStore, job: str) -> None:
    c = await store.claim(job, 0, "w")
    add = [Timer(t, f"t{t}".encode()) for t in (500, 100, 300, 200, 400)]
    await store.commit(
        job, 0, epoch=c.epoch, token=c.token, seq=0, position=0,
        timers={"event": TimerChanges(add=add), "processing": TimerChanges(add=[Timer(5, b"p")])},
    )  # fmt: skip
    due = await store.due_timers(job, 0, "event", 300)
    assert due == [Timer(100, b"t100"), Timer(200, b"t200"), Timer(300, b"t300")]
    assert await store.due_timers(job, 0, "event", 1000, limit=2) == due[:2]
    assert await store.next_timer(job, 0, "processing") == Timer(5, b"p")
    await store.commit(
        job, 0, epoch=c.epoch, token=c.token, seq=1, position=1,
        timers={"event": TimerChanges(remove=[b"t100", b"t200"])},
    )  # fmt: skip
    assert await store.next_timer(job, 0, "event") == Timer(300, b"t300")
    assert (await store.key_group_info(job, 0)).timers == 4


async def test_job_info_is_written_once(store: StateStore, job: str) -> None:
    first = await store.init_job(job, 16)
    again = await store.init_job(job, 32)
    assert again == first
    assert first.key_groups == 16 and first.created_at > 0
    with pytest.raises(ValueError, match="invalid job name"):
        await store.init_job("Bad/Name", 4)


async def test_assignment_publish_is_compare_and_set(store: StateStore, job: str) -> None:
    assert await store.get_assignment(job) is None
    g1 = Assignment(generation=1, parallelism=2, owners=(0, 0, 1, 1))
    await store.publish_assignment(job, g1, expected_generation=0)
    assert await store.get_assignment(job) == g1
    with pytest.raises(StaleGeneration) as caught:
        await store.publish_assignment(job, Assignment(2, 1, (0, 0, 0, 0)), expected_generation=0)
    assert caught.value.stored == 1
    g2 = Assignment(generation=2, parallelism=1, owners=(0, 0, 0, 0), forced=frozenset({2, 3}))
    await store.publish_assignment(job, g2, expected_generation=1)
    assert await store.get_assignment(job) == g2
    # the same publication again (a retry whose reply was lost) is accepted as done
    await store.publish_assignment(job, g2, expected_generation=1)
    # another assignment of generation 2 is not
    with pytest.raises(StaleGeneration):
        await store.publish_assignment(job, Assignment(2, 2, (0, 1, 0, 1)), expected_generation=1)


async def test_watchers_are_notified_of_each_new_generation(store: StateStore, job: str) -> None:
    await store.publish_assignment(job, Assignment(1, 1, (0, 0)), expected_generation=0)
    # a long poll interval: a prompt answer proves the notification, not the poll
    watcher = store.watch_assignment(job, poll_interval=30.0)
    assert (await asyncio.wait_for(anext(watcher), 5)).generation == 1
    next_one = asyncio.ensure_future(anext(watcher))
    await store.publish_assignment(job, Assignment(2, 2, (0, 1)), expected_generation=1)
    assert (await asyncio.wait_for(next_one, 5)).generation == 2
    await watcher.aclose()


async def test_an_announcement_carries_the_assignment(store: StateStore, job: str) -> None:
    """A watcher takes a new assignment from its announcement, with no read that a busy
    worker would wait for; an announcement of a generation alone (a controller before
    this one) is followed by a read of the stored one."""
    client = raw(store)
    channel = keys.assignment_channel(job)
    await store.publish_assignment(job, Assignment(1, 1, (0, 0)), expected_generation=0)
    watcher = store.watch_assignment(job, poll_interval=30.0)
    try:
        assert (await asyncio.wait_for(anext(watcher), 5)).generation == 1
        # announced and not stored: the watcher can only have it from the message
        announced = asyncio.ensure_future(anext(watcher))
        record = b'{"generation":2,"parallelism":2,"owners":[1,0],"forced":[1]}'
        await client.execute_command("SPUBLISH", channel, record)
        assert await asyncio.wait_for(announced, 5) == Assignment(2, 2, (1, 0), frozenset({1}))
        # a bare generation: the stored assignment is read
        stored = Assignment(3, 1, (0, 0))
        await client.hset(
            keys.assignment(job),
            mapping={"generation": 3, "payload": b'{"generation":3,"parallelism":1,'
                     b'"owners":[0,0],"forced":[]}'},
        )  # fmt: skip
        read = asyncio.ensure_future(anext(watcher))
        await client.execute_command("SPUBLISH", channel, 3)
        assert await asyncio.wait_for(read, 5) == stored
    finally:
        await watcher.aclose()


async def test_watch_falls_back_to_polling(store: StateStore, job: str) -> None:
    """A generation written behind the notification's back is still seen."""
    client = raw(store)
    watcher = store.watch_assignment(job, poll_interval=0.2)
    first = asyncio.ensure_future(anext(watcher))
    await store.publish_assignment(job, Assignment(1, 1, (0,)), expected_generation=0)
    assert (await asyncio.wait_for(first, 5)).generation == 1
    nxt = asyncio.ensure_future(anext(watcher))
    # write generation 2 directly, without a notification
    payload = await client.hget(keys.assignment(job), "payload")
    await client.hset(
        keys.assignment(job),
        mapping={"generation": 2, "payload": payload.replace(b'"generation":1', b'"generation":2')},
    )
    assert (await asyncio.wait_for(nxt, 5)).generation == 2
    await watcher.aclose()


async def test_worker_generation_acknowledgements(store: StateStore, job: str) -> None:
    await store.ack_generation(job, "0", 3)
    await store.ack_generation(job, "1", 2)
    await store.ack_generation(job, "1", 3)
    assert await store.worker_generations(job) == {"0": 3, "1": 3}
    await store.forget_worker(job, "1")
    assert await store.worker_generations(job) == {"0": 3}


async def _fill(store: StateStore, job: str, key_groups: int) -> None:
    await store.init_job(job, key_groups)
    await store.publish_assignment(
        job, Assignment(1, 1, tuple(0 for _ in range(key_groups))), expected_generation=0
    )
    for kg in range(key_groups):
        c = await store.claim(job, kg, "w0")
        await store.commit(
            job, kg, epoch=c.epoch, token=c.token, seq=0,
            puts={"count": {f"k{i}".encode(): str(kg * i).encode() for i in range(50 + kg)},
                  "seen": {b"x": bytes([kg])}},
            position=100 + kg, watermark=1000 * kg,
            timers={"event": TimerChanges(add=[Timer(kg + 1, b"t%d" % kg)])},
        )  # fmt: skip


async def test_list_key_groups_shows_owner_position_and_size(store: StateStore, job: str) -> None:
    await _fill(store, job, 4)
    listing = await store.list_key_groups(job)
    assert [(i.key_group, i.owner, i.position, i.entries, i.timers) for i in listing] == [
        (kg, "w0", 100 + kg, 50 + kg + 1, 1) for kg in range(4)
    ]


async def test_delete_job_removes_only_that_job(store: StateStore, job: str) -> None:
    other = job + "-other"
    await _fill(store, job, 3)
    await _fill(store, other, 2)
    removed = await store.delete_job(job)
    assert removed > 0
    assert await store.job_info(job) is None
    assert await store.get_assignment(job) is None
    assert (await store.key_group_info(job, 0)).epoch == 0
    assert await store.get_many(job, 0, "count", [b"k1"]) == {}
    assert [i.position for i in await store.list_key_groups(other)] == [100, 101]
    await store.delete_job(other)


async def test_export_import_round_trip(store: StateStore, job: str, tmp_path: Path) -> None:
    await _fill(store, job, 4)
    path = tmp_path / "savepoint.ks"
    exported = await export_job(store, job, path)
    assert exported.key_groups == 4
    before = [await store.dump_key_group(job, kg) for kg in range(4)]
    await store.delete_job(job)
    imported = await import_job(store, job, path)
    assert imported.key_groups == 4
    after = [await store.dump_key_group(job, kg) for kg in range(4)]
    for b, a in zip(before, after, strict=True):
        assert (a.states, a.timers, a.position, a.watermark, a.seq) == (
            b.states, b.timers, b.position, b.watermark, b.seq,
        )  # fmt: skip
        assert a.epoch > b.epoch  # old writers are fenced
    assert (await store.job_info(job)) is not None
    # a claim after import resumes at the imported position
    c = await store.claim(job, 2, "w9")
    assert (c.position, c.seq) == (102, before[2].seq)


async def test_import_refuses_a_job_that_has_state(
    store: StateStore, job: str, tmp_path: Path
) -> None:
    await _fill(store, job, 2)
    path = tmp_path / "sp.ks"
    await export_job(store, job, path)
    with pytest.raises(ValueError, match="already has state"):
        await import_job(store, job, path)


# -- integrity: what a store that lost or garbled data must not let through --------------


def raw(store: StateStore) -> Any:
    """The Redis backend's own client, to edit the store's keys as a fault would (a
    test using it is skipped for the other backends)."""
    if not isinstance(store, RedisStateStore):
        pytest.skip("edits Redis keys directly")
    return store._client


async def test_a_claim_on_an_older_assignment_is_refused(store: StateStore, job: str) -> None:
    c = await store.claim(job, 0, "w0", generation=3)
    with pytest.raises(StaleClaim) as stale:
        await store.claim(job, 0, "w1", generation=2)
    assert (stale.value.generation, stale.value.stored) == (2, 3)
    await store.release(job, 0, epoch=c.epoch, token=c.token, generation=5)
    with pytest.raises(StaleClaim):
        await store.claim(job, 0, "w1", generation=4)
    info = await store.key_group_info(job, 0)
    assert (info.epoch, info.owner, info.claimed_generation) == (c.epoch, "", 3)
    assert (await store.claim(job, 0, "w1", generation=5)).epoch == c.epoch + 1


async def test_a_claim_if_released_waits_for_the_holder_unless_it_is_the_claimer(
    store: StateStore, job: str
) -> None:
    held = await store.claim(job, 0, "w0", generation=1)
    with pytest.raises(StillOwned) as owned:
        await store.claim(job, 0, "w1", generation=2, if_released=True)
    assert owned.value.owner == "w0"
    info = await store.key_group_info(job, 0)  # refused: nothing written
    assert (info.epoch, info.owner, info.claimed_generation) == (held.epoch, "w0", 1)
    # a restarted holder takes its own key group back
    again = await store.claim(job, 0, "w0", generation=2, if_released=True)
    assert (again.epoch, again.previous_owner) == (held.epoch + 1, "w0")
    await store.release(job, 0, epoch=again.epoch, token=again.token, generation=2)
    taken = await store.claim(job, 0, "w1", generation=2, if_released=True)
    assert (taken.epoch, taken.previous_owner) == (again.epoch + 1, "")
    # without if_released a claim fences the holder (a failover's forced claim)
    forced = await store.claim(job, 0, "w2", generation=3)
    assert forced.previous_owner == "w1"
    with pytest.raises(Fenced):
        await store.commit(job, 0, epoch=taken.epoch, token=taken.token, seq=0, position=1)


async def test_state_without_metadata_is_refused_not_restarted(store: StateStore, job: str) -> None:
    """The metadata hash deleted (or evicted) while the state is there: a claim would
    restart the key group from position 0 and count its records twice."""
    c = await store.claim(job, 2, "w0")
    await store.commit(job, 2, epoch=c.epoch, token=c.token, seq=0,
                       puts={"s": {b"k": b"7"}}, position=7)  # fmt: skip
    await raw(store).delete(keys.meta(job, 2))
    with pytest.raises(Fenced) as fenced:  # the owner's next commit, as "store lost it"
        await store.commit(job, 2, epoch=c.epoch, token=c.token, seq=1, position=8)
    assert fenced.value.stored_epoch == 0
    with pytest.raises(StoreCorrupt, match="metadata is missing") as corrupt:
        await store.claim(job, 2, "w0", generation=1)
    assert (corrupt.value.job, corrupt.value.key_group) == (job, 2)
    assert await raw(store).exists(keys.meta(job, 2)) == 0, "the refused claim wrote"
    assert await store.get_many(job, 2, "s", [b"k"]) == {b"k": b"7"}


@pytest.mark.parametrize("field", ["epoch", "seq", "position", "claimed_generation"])
async def test_a_garbled_metadata_field_is_named_and_nothing_is_written(
    store: StateStore, job: str, field: str
) -> None:
    c = await store.claim(job, 1, "w0")
    await store.commit(job, 1, epoch=c.epoch, token=c.token, seq=0, position=3)
    await raw(store).hset(keys.meta(job, 1), field, "garbage")
    before = await raw(store).hgetall(keys.meta(job, 1))
    calls = [
        store.claim(job, 1, "w1", generation=1),
        store.key_group_info(job, 1),
    ]
    if field in ("epoch", "seq"):
        calls += [
            store.commit(job, 1, epoch=c.epoch, token=c.token, seq=1, position=4),
            store.release(job, 1, epoch=c.epoch, token=c.token, generation=1),
            store.check_fence(job, 1, epoch=c.epoch, token=c.token, seq=1),
        ]
    for call in calls:
        with pytest.raises(StoreCorrupt, match=f"{field} is not a whole number") as corrupt:
            await call
        assert corrupt.value.key_group == 1
    assert await raw(store).hgetall(keys.meta(job, 1)) == before


async def test_metadata_of_the_wrong_type_is_corrupt(store: StateStore, job: str) -> None:
    await raw(store).set(keys.meta(job, 1), "not a hash")
    with pytest.raises(StoreCorrupt, match="wrong type") as corrupt:
        await store.claim(job, 1, "w0", generation=1)
    assert corrupt.value.key_group == 1


async def test_check_fence_confirms_or_fences(store: StateStore, job: str) -> None:
    c = await store.claim(job, 0, "w0")
    await store.commit(job, 0, epoch=c.epoch, token=c.token, seq=0, position=1)
    await store.check_fence(job, 0, epoch=c.epoch, token=c.token, seq=1)
    with pytest.raises(Fenced) as lost:  # acknowledged commit 1 lost, as by an older AOF
        await store.check_fence(job, 0, epoch=c.epoch, token=c.token, seq=2)
    assert (lost.value.reason, lost.value.stored_seq) == ("sequence", 1)
    await store.claim(job, 0, "w1")
    with pytest.raises(Fenced) as claimed:
        await store.check_fence(job, 0, epoch=c.epoch, token=c.token, seq=1)
    assert claimed.value.reason == "epoch"


async def test_warming_opens_the_connections_a_handoff_would_open(
    worker_store: Any, job: str
) -> None:
    """A worker warms its store at start: a handoff's claims and first loads, which run at
    once, then find their connections open instead of each opening one."""
    await worker_store.init_job(job, 8)
    if not isinstance(worker_store, RedisStateStore) or worker_store.cluster:
        await worker_store.warm(6)  # nothing to open ahead here: harmless
        assert (await worker_store.key_group_info(job, 0)).owner == ""
        return
    observer = worker_store._client  # on a connection of its own pool

    async def clients() -> int:
        return int((await observer.info("clients"))["connected_clients"])

    fresh = open_store(worker_store.url)
    try:
        before = await clients()
        await fresh.warm(6)
        warmed = await clients()
        assert warmed - before == 6
        await asyncio.gather(*(fresh.key_group_info(job, kg) for kg in range(6)))
        assert await clients() == warmed  # the six calls at once opened none
    finally:
        await fresh.close()


async def test_a_commit_can_release_in_the_same_request(worker_store: Any, job: str) -> None:
    """A handoff's last commit carries the release: both apply, the watchers hear of it,
    and the new owner resumes from that commit."""
    c = await worker_store.claim(job, 4, "old", generation=1)
    watch = worker_store.watch_releases(job)
    try:
        assert await asyncio.wait_for(anext(watch), 10) is None  # subscribed
        notified = asyncio.ensure_future(anext(watch))
        marks = {"release_requested": 10.0, "batch_ended": 10.5, "committed": 11.0}
        result = await worker_store.commit(
            job, 4, epoch=c.epoch, token=c.token, seq=0, position=7,
            puts={"count": {b"k": b"3"}}, release_generation=2, release_marks=marks,
        )  # fmt: skip
        assert result.seq == 1
        assert await asyncio.wait_for(notified, 5) == Released(4)  # nobody waited
    finally:
        await watch.aclose()
    info = await worker_store.key_group_info(job, 4)
    assert (info.owner, info.released_generation, info.position, info.seq) == ("", 2, 7, 1)
    assert info.release_marks == marks
    new = await worker_store.claim(job, 4, "new", generation=2, if_released=True)
    assert (new.position, new.seq, new.previous_owner) == (7, 1, "")
    assert (await worker_store.get_many(job, 4, "count", [b"k"])) == {b"k": b"3"}


async def test_a_refused_commit_does_not_release(store: StateStore, job: str) -> None:
    c = await store.claim(job, 1, "w0", generation=1)
    await store.commit(job, 1, epoch=c.epoch, token=c.token, seq=0, position=3)
    with pytest.raises(Fenced):  # a used sequence: the commit is refused, and the release
        await store.commit(
            job, 1, epoch=c.epoch, token=c.token, seq=0, position=5, release_generation=2
        )
    info = await store.key_group_info(job, 1)
    assert (info.owner, info.released_generation, info.position, info.seq) == ("w0", 0, 3, 1)
    forcer = await store.claim(job, 1, "w1", generation=2)  # fenced by a newer claim
    with pytest.raises(Fenced):
        await store.commit(
            job, 1, epoch=c.epoch, token=c.token, seq=1, position=5, release_generation=3
        )
    info = await store.key_group_info(job, 1)
    assert (info.owner, info.epoch, info.released_generation) == ("w1", forcer.epoch, 0)


async def test_release_reports_the_stored_sequence(store: StateStore, job: str) -> None:
    """A releaser learns whether the store still holds its last commit."""
    c = await store.claim(job, 0, "w0", generation=1)
    await store.commit(job, 0, epoch=c.epoch, token=c.token, seq=0, position=1)
    await store.commit(job, 0, epoch=c.epoch, token=c.token, seq=1, position=2)
    await raw(store).hset(keys.meta(job, 0), mapping={"seq": 1, "position": 1})  # one lost
    stored = await store.release(job, 0, epoch=c.epoch, token=c.token, generation=2, seq=2)
    assert stored == 1
    assert (await store.key_group_info(job, 0)).owner == ""


# -- release notifications and handoff marks: both backends of the worker's store ----------


async def test_a_release_is_announced_to_every_watcher_of_its_job(
    worker_store: Any, job: str
) -> None:
    old = await worker_store.claim(job, 5, "old", generation=1)
    other_job = f"{job}-other"
    await worker_store.init_job(other_job, 8)
    watch = worker_store.watch_releases(job)
    second = worker_store.watch_releases(job)  # another worker of the job
    other = worker_store.watch_releases(other_job)
    try:
        for subscription in (watch, second, other):
            assert await asyncio.wait_for(anext(subscription), 10) is None  # subscribed
        notified = asyncio.ensure_future(anext(watch))
        also = asyncio.ensure_future(anext(second))
        elsewhere = asyncio.ensure_future(anext(other))
        await worker_store.release(job, 5, epoch=old.epoch, token=old.token, generation=2)
        # no poll here: only the notification wakes them, with the key group's number
        assert await asyncio.wait_for(notified, 5) == Released(5)
        assert await asyncio.wait_for(also, 5) == Released(5)
        assert not elsewhere.done()  # another job's watcher hears nothing
        elsewhere.cancel()
        # a later release is announced too, and a retried release again (harmless)
        again = await worker_store.claim(job, 5, "new", generation=2)
        await worker_store.release(job, 5, epoch=again.epoch, token=again.token, generation=3)
        assert await asyncio.wait_for(anext(watch), 5) == Released(5)
        released = await worker_store.claim(job, 6, "w", generation=3)
        await worker_store.release(job, 6, epoch=released.epoch, token=released.token, generation=4)
        assert await asyncio.wait_for(anext(watch), 5) == Released(6)
    finally:
        for subscription in (watch, second, other):
            await subscription.aclose()


async def test_a_release_hands_the_key_group_to_the_claimer_waiting_for_it(
    worker_store: Any, job: str
) -> None:
    """The new owner's refused claim registers it; the release claims the key group for
    it, with its token, and the announcement carries that claim: the new owner resumes
    from it with no request of its own."""
    old = await worker_store.claim(job, 3, "old", generation=1)
    with pytest.raises(StillOwned):
        await worker_store.claim(job, 3, "new", generation=2, if_released=True, token="t-new")
    watch = worker_store.watch_releases(job)
    try:
        assert await asyncio.wait_for(anext(watch), 10) is None  # subscribed
        notified = asyncio.ensure_future(anext(watch))
        await worker_store.commit(
            job, 3, epoch=old.epoch, token=old.token, seq=0, position=9,
            puts={"count": {b"k": b"1"}}, release_generation=2,
        )  # fmt: skip
        released = await asyncio.wait_for(notified, 5)
    finally:
        await watch.aclose()
    handed = released.handed_to
    assert released.key_group == 3 and handed is not None
    assert (handed.owner, handed.token, handed.epoch) == ("new", "t-new", old.epoch + 1)
    assert (handed.position, handed.seq, handed.watermark, handed.states) == (
        9, 1, None, frozenset({"count"}),
    )  # fmt: skip
    info = await worker_store.key_group_info(job, 3)
    assert (info.owner, info.epoch, info.claimed_generation) == ("new", handed.epoch, 2)
    assert info.released_generation == 2
    # the announcement lost: the claimer's next claim, same token, is answered with it
    again = await worker_store.claim(job, 3, "new", generation=2, if_released=True, token="t-new")
    assert (again.epoch, again.token, again.position, again.seq) == (handed.epoch, "t-new", 9, 1)
    # the new owner holds the fence; the old one is fenced
    await worker_store.commit(job, 3, epoch=handed.epoch, token="t-new", seq=1, position=10)
    with pytest.raises(Fenced):
        await worker_store.commit(job, 3, epoch=old.epoch, token=old.token, seq=1, position=11)


async def test_a_release_hands_over_only_to_a_claimer_of_its_generation_or_newer(
    worker_store: Any, job: str
) -> None:
    """A claimer of an older assignment than the release is not handed the key group (it
    is free for the release's own), and of several claimers the newest generation's
    waits; a claim that succeeds meanwhile forgets the waiting one."""
    old = await worker_store.claim(job, 1, "old", generation=1)
    with pytest.raises(StillOwned):
        await worker_store.claim(job, 1, "stale", generation=1, if_released=True, token="t1")
    await worker_store.release(job, 1, epoch=old.epoch, token=old.token, generation=2)
    info = await worker_store.key_group_info(job, 1)
    assert (info.owner, info.epoch) == ("", old.epoch)  # released, to nobody
    # two claimers wait: the newer generation's is handed it, whoever asked last
    holder = await worker_store.claim(job, 1, "holder", generation=2, if_released=True)
    with pytest.raises(StillOwned):
        await worker_store.claim(job, 1, "newer", generation=4, if_released=True, token="t4")
    with pytest.raises(StillOwned):
        await worker_store.claim(job, 1, "older", generation=3, if_released=True, token="t3")
    await worker_store.release(job, 1, epoch=holder.epoch, token=holder.token, generation=3)
    info = await worker_store.key_group_info(job, 1)
    assert (info.owner, info.epoch, info.claimed_generation) == ("newer", holder.epoch + 1, 4)
    # a claim by force forgets the waiting claimer: its holder's release frees the key group
    with pytest.raises(StillOwned):
        await worker_store.claim(job, 1, "waiter", generation=5, if_released=True, token="t5")
    forced = await worker_store.claim(job, 1, "forcer", generation=5)
    await worker_store.release(job, 1, epoch=forced.epoch, token=forced.token, generation=5)
    assert (await worker_store.key_group_info(job, 1)).owner == ""


async def test_a_retried_release_after_a_handover_is_answered_as_applied(
    store: StateStore, job: str
) -> None:
    """A release (or the commit carrying it) retried after a lost reply is recognised by
    the releaser's token and commit, though the key group is the successor's since."""
    old = await store.claim(job, 2, "old", generation=1)
    await store.commit(job, 2, epoch=old.epoch, token=old.token, seq=0, position=4)
    with pytest.raises(StillOwned):
        await store.claim(job, 2, "new", generation=2, if_released=True, token="t-new")
    assert await store.release(job, 2, epoch=old.epoch, token=old.token, generation=2) == 1
    assert (await store.key_group_info(job, 2)).owner == "new"
    # the reply lost: the same release again is answered with the sequence it released at
    assert await store.release(job, 2, epoch=old.epoch, token=old.token, generation=2) == 1
    # ... even after the successor committed
    await store.commit(job, 2, epoch=old.epoch + 1, token="t-new", seq=1, position=5)
    assert await store.release(job, 2, epoch=old.epoch, token=old.token, generation=2) == 1


async def test_handoff_marks_are_kept_per_release_and_per_claim(
    worker_store: Any, job: str
) -> None:
    old = await worker_store.claim(job, 2, "old", generation=1)
    marks = {"release_requested": 100.0, "batch_ended": 100.25, "flushed": 100.5,
             "committed": 100.75}  # fmt: skip
    await worker_store.release(job, 2, epoch=old.epoch, token=old.token, generation=2, marks=marks)
    new = await worker_store.claim(job, 2, "new", generation=2)
    info = await worker_store.key_group_info(job, 2)
    assert info.release_marks == marks
    assert (info.claim_marks, info.claim_via) == ({}, "")
    assert info.released_at is not None and info.claimed_at is not None
    assert await worker_store.record_handoff(
        job, 2, epoch=new.epoch, token=new.token, marks={"learned": 101.0}, via="notified"
    )
    assert await worker_store.record_handoff(
        job, 2, epoch=new.epoch, token=new.token, marks={"loaded": 101.5, "first_batch": 102.0}
    )
    # a writer without the fence records nothing
    assert not await worker_store.record_handoff(
        job, 2, epoch=old.epoch, token=old.token, marks={"loaded": 1.0}, via="polled"
    )
    info = await worker_store.key_group_info(job, 2)
    assert info.claim_marks == {"learned": 101.0, "loaded": 101.5, "first_batch": 102.0}
    assert info.claim_via == "notified"
    # the next claim starts its own marks; the release's stay until the next release
    await worker_store.claim(job, 2, "forcer", generation=3)
    info = await worker_store.key_group_info(job, 2)
    assert (info.claim_marks, info.claim_via, info.release_marks) == ({}, "", marks)


# -- entry states: a map's or a list's entries, read by key as a range ---------------------


async def test_entries_of_one_key_are_read_in_byte_order_page_by_page(
    worker_store: Any, job: str
) -> None:
    """An entry state's fields are ``<key><entry key>``: ``entries`` reads one key's, in
    byte order, a page at a time, and never another key's (even one whose bytes start
    with the same byte, nor a key ending in 0xff)."""
    c = await worker_store.claim(job, 1, "w")
    a, b, ff = b"\xa1a", b"\xa1b", b"\xff"  # msgpack "a", "b" and -1
    puts = {a + bytes([n]): b"v%d" % n for n in range(25)}
    puts |= {b + b"\x00": b"other", ff + b"\x01": b"last", a: b"head"}
    await worker_store.commit(
        job, 1, epoch=c.epoch, token=c.token, seq=c.seq, position=1,
        puts={"m": puts}, entry_states={"m"},
    )  # fmt: skip
    pages = []
    after = None
    while True:
        page = await worker_store.entries(job, 1, "m", a, after=after, count=10)
        pages.append(page)
        if len(page) < 10:
            break
        after = page[-1][0]
    got = [item for page in pages for item in page]
    assert [len(p) for p in pages] == [10, 10, 5]
    assert got == [(a + bytes([n]), b"v%d" % n) for n in range(25)]  # the head ``a`` excluded
    assert await worker_store.entries(job, 1, "m", ff) == [(ff + b"\x01", b"last")]
    # deletes leave the range too
    await worker_store.commit(
        job, 1, epoch=c.epoch, token=c.token, seq=c.seq + 1, position=2,
        deletes={"m": [a + bytes([n]) for n in range(1, 25)]}, entry_states={"m"},
    )  # fmt: skip
    assert await worker_store.entries(job, 1, "m", a) == [(a + b"\x00", b"v0")]


async def test_a_claim_says_which_states_are_stored_and_in_which_layout(
    worker_store: Any, job: str
) -> None:
    c = await worker_store.claim(job, 0, "w")
    assert (c.states, c.entry_states) == (frozenset(), frozenset())
    await worker_store.commit(
        job, 0, epoch=c.epoch, token=c.token, seq=c.seq, position=1,
        puts={"count": {b"k": b"1"}, "m": {b"k\x01": b"x"}}, entry_states={"m"},
    )  # fmt: skip
    again = await worker_store.claim(job, 0, "w2")
    assert again.states == {"count", "m"}
    assert again.entry_states == {"m"}
    assert again.timer_queues == frozenset()


async def test_a_claim_says_which_timer_queues_hold_timers(store: StateStore, job: str) -> None:
    c = await store.claim(job, 0, "w")
    await store.commit(
        job, 0, epoch=c.epoch, token=c.token, seq=c.seq, position=1,
        timers={"event": TimerChanges(add=(Timer(5, b"t"),))},
    )  # fmt: skip
    again = await store.claim(job, 0, "w2")
    assert again.timer_queues == {"event"}


async def test_entry_states_survive_export_and_import(
    store: StateStore, job: str, tmp_path: Path
) -> None:
    c = await store.claim(job, 0, "w")
    await store.init_job(job, 1)
    entries = {b"\xa1k" + n.to_bytes(2, "big"): b"%d" % n for n in range(1500)}
    await store.commit(
        job, 0, epoch=c.epoch, token=c.token, seq=c.seq, position=7,
        puts={"m": entries}, entry_states={"m"},
    )  # fmt: skip
    path = tmp_path / "sp.ks"
    await export_job(store, job, path)
    await store.delete_job(job)
    await import_job(store, job, path)
    assert (await store.dump_key_group(job, 0)).entry_states == {"m"}
    read = []
    after = None
    while page := await store.entries(job, 0, "m", b"\xa1k", after=after):
        read += page
        after = page[-1][0]
    assert dict(read) == entries
    assert (await store.claim(job, 0, "w2")).entry_states == {"m"}
