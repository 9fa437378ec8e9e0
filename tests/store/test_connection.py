"""The store's connections (``keyshift.store.connection``): a request is written inline,
under the client's timeout, not in a task of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

import pytest
import redis.exceptions as rexc

from keyshift.store import open_store
from keyshift.store.server import LocalServer
from tests.faults.proxy import FaultProxy


async def test_a_request_makes_no_task(standalone_server: LocalServer) -> None:
    """A task per request (redis-py's ``wait_for`` on CPython 3.11) would delay every
    request by an event-loop iteration: on a busy worker, milliseconds per round trip."""
    store = open_store(standalone_server.url)
    loop = asyncio.get_running_loop()
    made: list[str] = []

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any]
    ) -> asyncio.Task[Any]:
        made.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop)

    try:
        await store.ping()  # connected
        loop.set_task_factory(factory)
        await store.ping()
        await store.get_states("conn-test", 0, {"s": [b"a", b"b"]})
    finally:
        loop.set_task_factory(None)
        await store.close()
    assert made == []


async def test_a_write_that_cannot_leave_times_out(standalone_server: LocalServer) -> None:
    """The timeout still bounds the write: a stalled connection whose buffers are full
    fails the request after ``socket_timeout`` with the client's own error."""
    proxy = FaultProxy("127.0.0.1", standalone_server.port).start()
    store = open_store(f"redis://{proxy.address}", socket_timeout=0.5, retry_seconds=0.1)
    client: Any = store._client  # the raw command: the store would retry it
    try:
        await client.ping()
        proxy.stall()
        with pytest.raises(rexc.TimeoutError, match="writing"):
            await client.set("big", b"x" * (64 << 20))  # more than the socket buffers hold
    finally:
        proxy.heal()
        await store.close()
        proxy.stop()
