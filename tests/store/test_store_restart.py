"""Store restarts: a crashed server comes back, the client recovers, and a commit
the store lost is never silently built upon.

A SIGKILLed Valkey with ``appendfsync everysec`` keeps everything it had
written to the kernel, so a process crash alone loses no acknowledged commit.
What loses acknowledged commits is an OS crash within the fsync second or a
failover to a lagging replica; the second test reproduces that loss exactly by
restarting the server from a copy of its AOF taken a few commits earlier.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from keyshift.store import Claim, Fenced, RedisStateStore, open_store
from keyshift.store.server import LocalServer

KEY_GROUPS = 4


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    srv = LocalServer(tmp_path / "valkey", appendfsync="everysec").start()
    yield srv
    srv.stop()


@dataclass
class Writer:
    """A key group's writer with the history of what it committed."""

    claim: Claim
    seq: int
    counter: int = 0
    position: int = 0

    async def commit(self, store: RedisStateStore) -> None:
        result = await store.commit(
            self.claim.job, self.claim.key_group,
            epoch=self.claim.epoch, token=self.claim.token, seq=self.seq,
            puts={"count": {b"n": str(self.counter + 1).encode()}},
            position=self.position + 10,
        )  # fmt: skip
        self.seq, self.counter, self.position = result.seq, self.counter + 1, self.position + 10


async def _stored(store: RedisStateStore, job: str, kg: int) -> tuple[int, int, int]:
    """(seq, position, counter) as the store holds them."""
    info = await store.key_group_info(job, kg)
    got = await store.get_many(job, kg, "count", [b"n"])
    return info.seq, info.position, int(got.get(b"n", b"0"))


async def _writers(store: RedisStateStore, job: str) -> list[Writer]:
    claims = [await store.claim(job, kg, "w") for kg in range(KEY_GROUPS)]
    return [Writer(c, c.seq) for c in claims]


async def test_sigkill_and_restart_loses_no_acknowledged_commit(
    server: LocalServer, job: str
) -> None:
    store = open_store(server.url, retry_seconds=30)
    writers = await _writers(store, job)
    for _ in range(50):
        for w in writers:
            await w.commit(store)
    server.kill()
    # a commit issued while the server is down waits (back-off) and lands once it is back
    in_flight = asyncio.ensure_future(writers[0].commit(store))
    await asyncio.to_thread(server.start)
    await asyncio.wait_for(in_flight, 30)
    for kg, w in enumerate(writers):
        assert await _stored(store, job, kg) == (w.seq, w.position, w.counter)
        await w.commit(store)
        assert await _stored(store, job, kg) == (w.seq, w.position, w.counter)
    await store.close()


async def test_a_lost_acknowledged_commit_is_rejected_not_built_upon(
    server: LocalServer, job: str, tmp_path: Path
) -> None:
    store = open_store(server.url, retry_seconds=30)
    writers = await _writers(store, job)
    for _ in range(5):
        for w in writers:
            await w.commit(store)
    durable = [(w.seq, w.position, w.counter) for w in writers]
    snapshot = tmp_path / "aof-copy"
    shutil.copytree(server.directory / "appendonlydir", snapshot)

    for _ in range(3):  # acknowledged, then lost
        for w in writers:
            await w.commit(store)
    # the last claim is lost too for key group 0: a new owner took it over
    takeover = await store.claim(job, 0, "new-owner")
    server.kill()
    shutil.rmtree(server.directory / "appendonlydir")
    shutil.copytree(snapshot, server.directory / "appendonlydir")
    await asyncio.to_thread(server.start)

    for kg, w in enumerate(writers):
        assert await _stored(store, job, kg) == durable[kg]
        with pytest.raises(Fenced) as caught:
            await w.commit(store)
        assert caught.value.reason == "sequence"
        assert caught.value.stored_seq == durable[kg][0] < w.seq
        assert await _stored(store, job, kg) == durable[kg]  # nothing applied on the gap

    # the lost claim's fence is unknown to the store: its commits are refused
    with pytest.raises(Fenced) as lost:
        await store.commit(
            job, 0, epoch=takeover.epoch, token=takeover.token, seq=takeover.seq, position=1
        )
    assert lost.value.reason == "epoch"

    # a writer that re-claims resumes from what the store holds, and goes on
    again = await store.claim(job, 1, "w")
    assert (again.seq, again.position) == durable[1][:2]
    resumed = Writer(again, again.seq, counter=durable[1][2], position=again.position)
    await resumed.commit(store)
    assert await _stored(store, job, 1) == (
        durable[1][0] + 1,
        durable[1][1] + 10,
        durable[1][2] + 1,
    )
    await store.close()
