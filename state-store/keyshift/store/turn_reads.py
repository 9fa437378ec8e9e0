"""Reads asked in one turn of the event loop, sent to the store as one pipeline.

A worker's idle key groups wake in the same turn of its event loop (their records come
due together) and each loads its batch's states: at a low rate a pipeline of a record or
two per key group, each with its socket write, its reply to read and its request for the
store to serve. :class:`TurnReads` sends the reads asked during one turn together: the
first read of a turn waits for the rest of the turn (``sleep(0)``: no task, no timer),
then sends every read asked meanwhile in one pipeline. Only small reads (at most
:data:`JOIN_AT_MOST` fields, a record or two) do this: a batch's worth under load is
sent at once, as before. Each read gets its own replies and its own error: a command
the store refuses fails only the read that asked it; a connection lost fails them all
(each caller retries, as it would alone).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import redis.exceptions as rexc

JOIN_AT_MOST = 16
"""Fields a read may ask and still wait for the rest of its turn; a larger one (a batch's
worth under load) leaves at once, as it costs more than its request and would otherwise
wait for the other key groups' batches of the turn."""

Read = Sequence[tuple[bytes | str, Sequence[bytes]]]
"""``HMGET`` arguments, one pair per hash: the hash's name, then its fields."""

_Waiting = list[tuple[Read, "asyncio.Future[list[Any]] | None"]]


class TurnReads:
    """``HMGET``s asked in one turn of the event loop, sent as one pipeline."""

    def __init__(self, pipeline: Callable[[], Any], *, join_at_most: int = JOIN_AT_MOST) -> None:
        """``join_at_most``: the fields a read may ask and still join its turn (0: every
        read is its own pipeline, sent at once)."""
        self._pipeline = pipeline
        self._join_at_most = join_at_most
        self._turn: _Waiting | None = None
        self._sending: set[asyncio.Task[Any]] = set()

    async def hmget(self, read: Read) -> list[Any]:
        """The replies to ``read``'s ``HMGET``s, one list of values per hash."""
        if sum(len(fields) for _, fields in read) > self._join_at_most:
            replies = await self._send([(read, None)])  # at once, alone
        else:
            replies = await self._joined(read)
        assert replies is not None  # the sender's own
        return replies

    async def _joined(self, read: Read) -> list[Any] | None:
        """``read`` sent with the others of its turn."""
        if self._turn is not None:  # another read of this turn sends it
            future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
            self._turn.append((read, future))
            return await future
        turn: _Waiting = [(read, None)]
        self._turn = turn
        try:
            await asyncio.sleep(0)  # the rest of this turn: other reads join
        except asyncio.CancelledError:
            self._turn = None
            if len(turn) > 1:  # the others are sent without this one
                task = asyncio.ensure_future(self._send_for_others(turn[1:]))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
            raise
        self._turn = None
        return await self._send(turn)

    async def _send_for_others(self, turn: _Waiting) -> None:
        """Send reads whose sender gave up; their futures carry any error."""
        with contextlib.suppress(Exception):
            await self._send(turn)

    async def _send(self, turn: _Waiting) -> list[Any] | None:
        """Send the turn's reads; settle the waiting ones; the first read's replies if it
        has no future (its caller is the sender)."""
        live = [(read, future) for read, future in turn if future is None or not future.done()]
        pipe = self._pipeline()
        for read, _ in live:
            for key, fields in read:
                pipe.hmget(key, fields)
        try:
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        except BaseException as exc:
            lost = exc
            if isinstance(exc, asyncio.CancelledError):  # the sender's caller gave up
                lost = rexc.ConnectionError("a read sent with others was cancelled")
            for _, future in live:
                if future is not None and not future.done():
                    future.set_exception(lost)
            raise
        own: list[Any] | None = None
        own_error: Exception | None = None
        at = 0
        for read, future in live:
            mine, at = replies[at : at + len(read)], at + len(read)
            error = next((r for r in mine if isinstance(r, Exception)), None)
            if future is None:
                own, own_error = mine, error
            elif future.done():
                continue  # its caller stopped waiting
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(mine)
        if own_error is not None:
            raise own_error
        return own
