"""A commit the store applied whose reply never reached the worker.

The store answers a retried commit "replayed" only when it is the very commit it applied
(same fence, same commit id). A worker that gave up on a lost reply (the store was
unreachable past its retry budget) and went on to send a later, larger commit with the
same sequence is fenced: the store never acknowledges updates it did not apply. The
worker drops its cache, claims again and replays from what the store holds.

The reply is lost by :class:`~tests.faults.proxy.FaultProxy`, between the job and a
real Valkey: the request reaches the server, the reply is swallowed, the connection
reset and new ones refused for a while.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from keyshift.store import Fenced, RedisStateStore, StillOwned, StoreUnavailable, open_store
from keyshift.store.redis_backend import _load_script
from keyshift.store.server import LocalServer
from tests.faults.proxy import FaultProxy
from tests.support import (
    WorkerProcess,
    all_done,
    assert_exact_counter_state,
    assert_owned_as_assigned,
    counter_manifest,
    deploy,
    wait_for,
    write_manifest,
)

COMMIT_SCRIPT = hashlib.sha1(_load_script("commit").encode()).hexdigest().encode()
"""What every commit request carries (the script's SHA, sent with EVALSHA)."""


def commit_of(job: str, key_group: int) -> tuple[bytes, ...]:
    """Markers of a commit request of ``key_group`` (its keys carry the hash tag)."""
    return (COMMIT_SCRIPT, f"{{{job}/{key_group}}}:names".encode())


async def load_commit_script(store: RedisStateStore, job: str) -> None:
    """Commit once elsewhere, so that the server knows the script: otherwise the first
    commit request is answered NOSCRIPT (not applied) and sent again with the script."""
    c = await store.claim(job, 9, "warm-up")
    await store.commit(job, 9, epoch=c.epoch, token=c.token, seq=0, position=0)


async def test_a_commit_retried_after_a_lost_reply_is_applied_once(
    standalone_server: LocalServer, job: str
) -> None:
    proxy = FaultProxy("127.0.0.1", standalone_server.port).start()
    store = open_store(f"redis://{proxy.address}", retry_seconds=10)
    direct = open_store(standalone_server.url)
    try:
        await load_commit_script(store, job)
        c = await store.claim(job, 0, "w")
        lost = proxy.lose_reply(commit_of(job, 0))
        result = await store.commit(
            job, 0, epoch=c.epoch, token=c.token, seq=0, puts={"s": {b"k": b"1"}}, position=1
        )
        assert lost.is_set(), "the proxy did not swallow the reply"
        assert (result.seq, result.replayed) == (1, True)
        info = await direct.key_group_info(job, 0)
        assert (info.seq, info.position) == (1, 1)
    finally:
        await store.close()
        await direct.close()
        proxy.stop()


@pytest.mark.parametrize("successor", [False, True], ids=["released", "handed-over"])
async def test_a_commit_and_release_retried_after_a_lost_reply_apply_once(
    standalone_server: LocalServer, job: str, successor: bool
) -> None:
    """A handoff's last commit carries its release in the same request: retried after a
    lost reply, the commit is the one applied (replayed) and the release stands, also
    when the release handed the key group to a waiting successor (a new epoch since)."""
    proxy = FaultProxy("127.0.0.1", standalone_server.port).start()
    store = open_store(f"redis://{proxy.address}", retry_seconds=10)
    direct = open_store(standalone_server.url)
    try:
        await load_commit_script(store, job)
        c = await store.claim(job, 0, "w", generation=1)
        if successor:
            with pytest.raises(StillOwned):
                await direct.claim(job, 0, "next", generation=2, if_released=True)
        lost = proxy.lose_reply(commit_of(job, 0))
        result = await store.commit(
            job, 0, epoch=c.epoch, token=c.token, seq=0, puts={"s": {b"k": b"1"}}, position=1,
            release_generation=2,
        )  # fmt: skip
        assert lost.is_set(), "the proxy did not swallow the reply"
        assert (result.seq, result.replayed) == (1, True)
        info = await direct.key_group_info(job, 0)
        owner = "next" if successor else ""
        assert (info.seq, info.position, info.owner, info.released_generation) == (1, 1, owner, 2)
        assert info.epoch == c.epoch + successor
        assert await direct.get_many(job, 0, "s", [b"k"]) == {b"k": b"1"}
    finally:
        await store.close()
        await direct.close()
        proxy.stop()


async def test_another_commit_with_the_sequence_of_a_lost_reply_is_fenced(
    standalone_server: LocalServer, job: str
) -> None:
    """The issue's case at the store: the reply of commit 0 is lost, the store stays
    unreachable past the client's budget, the writer sends a larger commit 0."""
    proxy = FaultProxy("127.0.0.1", standalone_server.port).start()
    store = open_store(f"redis://{proxy.address}", retry_seconds=0.5)
    direct = open_store(standalone_server.url)
    try:
        await load_commit_script(store, job)
        c = await store.claim(job, 0, "w")
        lost = proxy.lose_reply(commit_of(job, 0), refuse_for=2.0)
        with pytest.raises(StoreUnavailable):
            await store.commit(
                job, 0, epoch=c.epoch, token=c.token, seq=0, puts={"s": {b"a": b"1"}}, position=1
            )
        assert lost.is_set()
        store.retry_seconds = 10  # until the proxy listens again
        with pytest.raises(Fenced) as fenced:
            await store.commit(
                job, 0, epoch=c.epoch, token=c.token, seq=0,
                puts={"s": {b"a": b"2", b"b": b"1"}}, position=2,
            )  # fmt: skip
        assert (fenced.value.reason, fenced.value.stored_seq) == ("sequence", 1)
        info = await direct.key_group_info(job, 0)
        assert (info.seq, info.position) == (1, 1)
        assert await direct.get_many(job, 0, "s", [b"a", b"b"]) == {b"a": b"1"}
    finally:
        await store.close()
        await direct.close()
        proxy.stop()


K = 4
LIMIT = 3000
SOURCE = {"seed": 5, "keys": 2000, "distribution": "zipf", "limit": LIMIT,
          "rate": {"shape": "constant", "recordsPerSecond": 2000}}  # fmt: skip
"""6 s of input: key group 0's fifth commit comes about 1 s in."""


async def test_a_worker_that_lost_a_commit_reply_replays_and_loses_nothing(
    standalone_server: LocalServer, job: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    """Key group 0's fifth commit is applied, its reply lost, and the store unreachable
    for 4 s, past the worker's 2 s retry budget: the worker goes on processing, and its
    next commit (same sequence, more updates) is fenced; it replays, the state is exact."""
    proxy = FaultProxy("127.0.0.1", standalone_server.port).start()
    url = f"redis://{proxy.address}"
    store = open_store(standalone_server.url)
    try:
        manifest = write_manifest(
            tmp_path,
            counter_manifest(job, key_groups=K, parallelism=1, store_url=url, source=SOURCE),
        )
        lost = proxy.lose_reply(commit_of(job, 0), nth=5, refuse_for=4.0)
        spawn_retry_2s = lambda m, o, u: spawn(  # noqa: E731
            m, o, u, env={"KEYSHIFT_STORE_RETRY_SECONDS": "2"}
        )
        first, workers = await deploy(store, job, K, 1, manifest, url, spawn_retry_2s)
        await wait_for(lost.is_set, 30, "key group 0's fifth commit")
        await wait_for(lambda: all_done(store, job, K, LIMIT), 60, "every record")
        await assert_exact_counter_state(store, job, SOURCE, K, LIMIT)
        await assert_owned_as_assigned(store, job, first)
        assert "applied although its reply was lost" in workers[0].log_path.read_text()
    finally:
        await store.close()
        proxy.stop()
