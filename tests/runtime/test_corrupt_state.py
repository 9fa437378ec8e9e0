"""A state value in the store that the state's codec cannot decode is a store error, not
the user's: the key group stops and says so, whatever ``errorPolicy``, and commits
nothing over the bad value (a real Valkey and worker processes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import redis.asyncio as redis

from keyshift.api.spec import GeneratorSource
from keyshift.runtime.api import encode_key
from keyshift.runtime.sources.generator import Generator
from keyshift.store import keys, open_store
from keyshift.store.server import LocalServer
from tests.support import (
    WorkerProcess,
    all_done,
    counter_manifest,
    deploy,
    positions,
    wait_for,
    write_manifest,
)

K = 2
FIRST, SECOND = 400, 800
"""The first run processes offsets [0, FIRST), the second run is given [0, SECOND)."""
GARBAGE = b"\xc1not msgpack"
"""0xc1 is the one byte msgpack never uses: no codec decodes this."""


async def test_a_corrupt_state_value_stops_its_key_group_under_error_policy_skip(
    standalone_server: LocalServer,
    job: str,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    """The counter job runs offsets [0, 400) of 2 key groups and stops; the ``count``
    value of the key of key group 0's next record is overwritten with garbage in the
    store; the job restarts with input up to 800 and ``errorPolicy: skip``.  Key group 0
    stops with an error naming it, the state and the key (in the log; ``/healthz`` gives
    its type),
    nothing skipped; its committed position and every state value in the store are
    exactly as they were; key group 1 goes on to 800."""
    url = standalone_server.url
    source = {"seed": 3, "keys": 20, "limit": FIRST}
    first = tmp_path / "first"
    second = tmp_path / "second"
    first.mkdir()
    second.mkdir()
    m1 = write_manifest(
        first, counter_manifest(job, key_groups=K, parallelism=1, store_url=url, source=source,
                                errorPolicy="skip")
    )  # fmt: skip
    m2 = write_manifest(
        second, counter_manifest(job, key_groups=K, parallelism=1, store_url=url,
                                 source={**source, "limit": SECOND}, errorPolicy="skip")
    )  # fmt: skip
    store = open_store(url, retry_seconds=10)
    raw = redis.from_url(url)
    try:
        _, (worker,) = await deploy(store, job, K, 1, m1, url, spawn)
        await wait_for(lambda: all_done(store, job, K, FIRST), 30, "the first run")
        worker.stop()

        spec = GeneratorSource.model_validate({"type": "generator", **source})
        (event,) = Generator(spec, K, created_at=0.0).read(0, FIRST, FIRST + 1)
        key_bytes = encode_key(event.key)
        count_key = keys.state(job, 0, "count")
        assert await raw.hget(count_key, key_bytes) is not None
        await raw.hset(count_key, key_bytes, GARBAGE)
        before = await store.dump_key_group(job, 0)

        restarted = spawn(m2, 0, url)

        async def key_group_0_failed() -> bool:
            try:
                health = restarted.get("/healthz").json()
            except httpx.HTTPError:
                return False
            return "0" in health["failed_key_groups"]

        await wait_for(key_group_0_failed, 30, "key group 0 to fail")

        async def key_group_1_done() -> bool:
            return (await positions(store, job, K))[1] == SECOND

        await wait_for(key_group_1_done, 30, "key group 1 to process its input")
        health = restarted.get("/healthz").json()
        assert health["status"] == "degraded"
        assert health["failed_key_groups"]["0"]["error"] == "CorruptStateError"
        assert str(event.key) not in json.dumps(health)  # data stays out of /healthz
        for part in ("corrupt state", "key group 0", "state 'count'", f"key {event.key!r}"):
            assert part in restarted.log(), part
        assert "user function failed" not in restarted.log()
        assert restarted.metric("keyshift_records_skipped_total") == 0
        assert restarted.metric("keyshift_key_groups_failed") == 1

        after = await store.dump_key_group(job, 0)
        assert after.position == before.position == FIRST
        assert after.seq == before.seq
        assert after.states == before.states
        assert after.states["count"][key_bytes] == GARBAGE
    finally:
        await raw.aclose()
        await store.delete_job(job)
        await store.close()
