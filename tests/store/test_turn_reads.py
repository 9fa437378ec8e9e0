"""Reads asked in one turn of the event loop go to the store as one pipeline
(``keyshift.store.turn_reads``), each with its own replies and its own error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from keyshift.store import open_store
from keyshift.store.server import LocalServer
from keyshift.store.turn_reads import JOIN_AT_MOST, TurnReads


class CountingPipelines:
    """The pipeline factory of a real client, counting the pipelines made."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.made = 0

    def __call__(self) -> Any:
        self.made += 1
        return self.client.pipeline(transaction=False)


@pytest.fixture
async def client(standalone_server: LocalServer) -> Any:
    redis = aioredis.Redis.from_url(standalone_server.url)
    await redis.delete("tr:h0", "tr:h1", "tr:h2", "tr:string")
    await redis.hset("tr:h0", mapping={b"a": b"0a", b"b": b"0b"})
    await redis.hset("tr:h1", mapping={b"a": b"1a"})
    await redis.hset("tr:h2", mapping={b"c": b"2c"})
    await redis.set("tr:string", b"not a hash")
    yield redis
    await redis.aclose()


async def test_the_reads_of_one_turn_are_one_pipeline_each_with_its_replies(client: Any) -> None:
    pipelines = CountingPipelines(client)
    reads = TurnReads(pipelines)
    replies: list[Any] = await asyncio.gather(
        reads.hmget([("tr:h0", [b"a", b"b", b"x"])]),
        reads.hmget([("tr:h1", [b"a"]), ("tr:h2", [b"c", b"a"])]),
        reads.hmget([("tr:missing", [b"a"])]),
    )
    assert replies == [[[b"0a", b"0b", None]], [[b"1a"], [b"2c", None]], [[None]]]
    assert pipelines.made == 1
    # a read in a later turn is a pipeline of its own
    assert await reads.hmget([("tr:h1", [b"a"])]) == [[b"1a"]]
    assert pipelines.made == 2


async def test_a_command_the_store_refuses_fails_only_its_read(client: Any) -> None:
    reads = TurnReads(CountingPipelines(client))
    results: list[Any] = await asyncio.gather(
        reads.hmget([("tr:h0", [b"a"])]),
        reads.hmget([("tr:h1", [b"a"]), ("tr:string", [b"a"])]),  # WRONGTYPE
        reads.hmget([("tr:h2", [b"c"])]),
        return_exceptions=True,
    )
    first, refused, last = results
    assert first == [[b"0a"]] and last == [[b"2c"]]
    assert isinstance(refused, rexc.ResponseError) and "WRONGTYPE" in str(refused)
    # the sender's own refusal, the others served
    results = await asyncio.gather(
        reads.hmget([("tr:string", [b"a"])]), reads.hmget([("tr:h0", [b"b"])]),
        return_exceptions=True,
    )  # fmt: skip
    own, other = results
    assert isinstance(own, rexc.ResponseError) and other == [[b"0b"]]


async def test_a_read_whose_caller_gives_up_leaves_the_others_served(client: Any) -> None:
    reads = TurnReads(CountingPipelines(client))
    sender = asyncio.ensure_future(reads.hmget([("tr:h0", [b"a"])]))
    joined = asyncio.ensure_future(reads.hmget([("tr:h1", [b"a"])]))
    given_up = asyncio.ensure_future(reads.hmget([("tr:h2", [b"c"])]))
    await asyncio.sleep(0)  # one turn: the three asked, the first waits to send them
    assert not sender.done()
    sender.cancel()
    given_up.cancel()
    assert await joined == [[b"1a"]]  # sent without the sender
    with pytest.raises(asyncio.CancelledError):
        await sender
    with pytest.raises(asyncio.CancelledError):
        await given_up


async def test_a_lost_connection_fails_every_read_of_the_turn() -> None:
    # no retries of the client's own: the refusal comes at once
    unreachable = aioredis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    reads = TurnReads(CountingPipelines(unreachable))
    try:
        results = await asyncio.gather(
            reads.hmget([("tr:h0", [b"a"])]), reads.hmget([("tr:h1", [b"a"])]),
            return_exceptions=True,
        )  # fmt: skip
    finally:
        await unreachable.aclose()
    assert all(isinstance(r, rexc.ConnectionError) for r in results), results


async def test_the_store_loads_many_key_groups_in_one_turn(standalone_server: LocalServer) -> None:
    """``get_states`` of sixteen key groups at once: each gets its own states."""
    store = open_store(standalone_server.url)
    try:
        await store.init_job("turn-reads", 16, created_at=0.0)
        claims = [await store.claim("turn-reads", kg, "w") for kg in range(16)]
        for kg, claim in enumerate(claims):
            await store.commit(
                "turn-reads", kg, epoch=claim.epoch, token=claim.token, seq=claim.seq,
                position=1, puts={"s": {f"k{kg}".encode(): f"v{kg}".encode()}},
            )  # fmt: skip
        found = await asyncio.gather(
            *(store.get_states("turn-reads", kg, {"s": [f"k{kg}".encode(), b"k99"]})
              for kg in range(16))
        )  # fmt: skip
    finally:
        await store.close()
    assert found == [{"s": {f"k{kg}".encode(): f"v{kg}".encode()}} for kg in range(16)]


async def test_a_batchs_worth_of_fields_leaves_at_once(client: Any) -> None:
    """Only small reads wait for the rest of their turn; a large one (a batch's worth under
    load) is sent at once, its own pipeline; with ``join_at_most=0`` (a Cluster) every
    read is."""
    pipelines = CountingPipelines(client)
    reads = TurnReads(pipelines)
    large = [f"k{i}".encode() for i in range(JOIN_AT_MOST + 1)]
    found: list[Any] = await asyncio.gather(
        reads.hmget([("tr:h0", [b"a"])]),
        reads.hmget([("tr:h0", [b"a", *large])]),
        reads.hmget([("tr:h1", [b"a"]), ("tr:h2", [b"c"])]),
    )
    assert found == [[[b"0a"]], [[b"0a"] + [None] * len(large)], [[b"1a"], [b"2c"]]]
    assert pipelines.made == 2  # the large read's, and the two small ones' together

    alone = CountingPipelines(client)
    each = TurnReads(alone, join_at_most=0)
    await asyncio.gather(each.hmget([("tr:h0", [b"a"])]), each.hmget([("tr:h1", [b"a"])]))
    assert alone.made == 2
