"""A TCP proxy of the tests' own, between workers and the store, that cuts or stalls
connections on demand (the network faults of the reliability suite).

- ``cut()``: every open connection is closed and new ones are refused (the port
  stops listening): what a crashed store host or a broken route looks like;
- ``stall()``: connections stay open and new ones are accepted, but no byte moves
  in either direction: a black hole, where only the clients' timeouts help;
- ``heal()``: back to forwarding;
- ``lose_reply(markers, nth, refuse_for)``: the ``nth`` request that contains every one
  of ``markers`` reaches the server, but its reply is swallowed and its connection reset,
  and new connections are refused for ``refuse_for`` seconds: a request applied whose
  client never learns it was (the case a retried commit must be recognised in).

It runs its own asyncio loop in a thread, listens on 127.0.0.1 only, and
forwards to one target.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any

from keyshift.store.server import free_port


@dataclass
class _LostReply:
    markers: tuple[bytes, ...]
    nth: int
    refuse_for: float
    seen: int = 0
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Connection:
    drop_reply: bool = False


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._lost_reply: _LostReply | None = None
        self.connections = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._init())
        self._call(self._listen())
        return self

    async def _init(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, server_w}
        conn = _Connection()
        try:
            await asyncio.gather(
                self._pump(client_r, server_w, conn, upstream=True),
                self._pump(server_r, client_w, conn, upstream=False),
            )
        finally:
            for w in (client_w, server_w):
                self._writers.discard(w)
                w.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: _Connection,
        *,
        upstream: bool,
    ) -> None:
        assert self._flowing is not None
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                await self._flowing.wait()  # stalled: hold the bytes
                if writer.is_closing():
                    return
                lost = self._lost_reply
                if upstream and lost is not None and all(m in data for m in lost.markers):
                    lost.seen += 1
                    if lost.seen == lost.nth:
                        conn.drop_reply = True
                if not upstream and conn.drop_reply:
                    await self._reply_lost()
                    return
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _reply_lost(self) -> None:
        """The armed request was applied and its reply is in hand: drop it, reset every
        connection, refuse new ones for a while."""
        lost = self._lost_reply
        assert lost is not None
        self._lost_reply = None
        await self._cut()
        lost.done.set()
        if lost.refuse_for > 0:
            await asyncio.sleep(lost.refuse_for)
        if self._server is None:
            await self._listen()

    def lose_reply(
        self, markers: tuple[bytes, ...], *, nth: int = 1, refuse_for: float = 0.0
    ) -> threading.Event:
        """Swallow the reply to the ``nth`` request containing all ``markers`` (see the
        module's docstring); the returned event is set once that has happened."""
        lost = _LostReply(markers, nth, refuse_for)

        async def arm() -> None:
            self._lost_reply = lost

        self._call(arm())
        return lost.done

    def cut(self) -> None:
        """Close every connection and refuse new ones."""
        self._call(self._cut())

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()  # a reset, not a polite close

    def stall(self) -> None:
        """Keep connections open but move no byte."""

        async def stall() -> None:
            assert self._flowing is not None
            self._flowing.clear()

        self._call(stall())

    def heal(self) -> None:
        async def heal() -> None:
            assert self._flowing is not None
            self._flowing.set()
            if self._server is None:
                await self._listen()

        self._call(heal())

    def stop(self) -> None:
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
