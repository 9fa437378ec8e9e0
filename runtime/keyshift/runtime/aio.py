"""Small asyncio helpers.

They use ``asyncio.timeout`` rather than ``asyncio.wait_for``: on Python 3.11,
``wait_for`` can swallow a cancellation that arrives as the awaited thing
completes, and a task whose cancellation was swallowed never ends.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; return whether it is set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


class Wakeup:
    """A flag that one task waits on, with a deadline: :func:`wait_event` for a single
    waiter that waits often (a key group's runner, between its batches).

    A wait that times out costs a future and a timer, not a cancellation and the
    exceptions of ``asyncio.timeout``.  :meth:`set` is for the event loop's thread
    (``loop.call_soon_threadsafe(wakeup.set)`` from another)."""

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None:
            _resolve(self._waiter)

    def clear(self) -> None:
        self._set = False

    async def wait(self, seconds: float | None) -> bool:
        """Wait until set or ``seconds`` pass; return whether it is set."""
        if self._set:
            return True
        if self._waiter is not None:
            raise RuntimeError("Wakeup has one waiter at a time")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if seconds is None else loop.call_later(seconds, _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return self._set


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
