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
