"""A TCP proxy of the tests' own, between workers and the store, that cuts or stalls
connections on demand (the network faults of the reliability suite).

- ``cut()``: every open connection is closed and new ones are refused (the port
  stops listening): what a crashed store host or a broken route looks like;
- ``stall()``: connections stay open and new ones are accepted, but no byte moves
  in either direction: a black hole, where only the clients' timeouts help;
- ``heal()``: back to forwarding.

It runs its own asyncio loop in a thread, listens on 127.0.0.1 only, and
forwards to one target.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from keyshift.store.server import free_port


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
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
        try:
            await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))
        finally:
            for w in (client_w, server_w):
                self._writers.discard(w)
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                await self._flowing.wait()  # stalled: hold the bytes
                if writer.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        writer.close()

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
