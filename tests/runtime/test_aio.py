"""The small asyncio helpers: a timed wait on a flag."""

from __future__ import annotations

import asyncio
import time

import pytest

from keyshift.runtime.aio import Wakeup, wait_event


async def test_a_wakeup_wakes_its_waiter_at_once_or_at_the_deadline() -> None:
    wakeup = Wakeup()
    started = time.monotonic()
    assert await wakeup.wait(0.05) is False  # nobody set it: the deadline
    assert time.monotonic() - started >= 0.05
    asyncio.get_running_loop().call_later(0.01, wakeup.set)
    started = time.monotonic()
    assert await wakeup.wait(10.0) is True  # set: at once, not after ten seconds
    assert time.monotonic() - started < 5.0
    assert await wakeup.wait(10.0) is True  # still set until cleared
    wakeup.clear()
    assert await wakeup.wait(0.0) is False


async def test_a_wakeup_set_from_another_thread_through_the_loop() -> None:
    wakeup = Wakeup()
    loop = asyncio.get_running_loop()
    waiter = asyncio.create_task(wakeup.wait(None))
    await asyncio.to_thread(loop.call_soon_threadsafe, wakeup.set)
    assert await asyncio.wait_for(waiter, 10.0) is True


async def test_a_cancelled_wait_leaves_the_wakeup_usable() -> None:
    wakeup = Wakeup()
    waiter = asyncio.create_task(wakeup.wait(10.0))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one waiter"):
        await wakeup.wait(1.0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    wakeup.set()
    assert await wakeup.wait(1.0) is True


async def test_wait_event_times_out_or_returns_when_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 10.0) is True
