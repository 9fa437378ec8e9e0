"""The worker's small HTTP server: ``/metrics``, ``/healthz``, ``/readyz``.

It runs in a thread of its own, not on the worker's event loop: a worker
saturated with records (its loop busy with one batch after another) must
still answer its probes and its scrapes at once, or an overloaded worker
would look dead exactly when the autoscaler needs its metrics and the
controller needs it ready to hand key groups off. The handlers only read the
worker's state.

``/healthz`` answers 200 while the worker loop makes progress (its heartbeat is
younger than ``STUCK_SECONDS``), with the key groups a user-function error
stopped listed in the body (status ``degraded``): a restart would not cure
them, so they must not make Kubernetes restart the pod. A loop stuck for
longer answers 503. ``/readyz`` answers 200 once the worker is connected to the
store and runs the current assignment generation, 503 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from keyshift.runtime.worker import Worker

STUCK_SECONDS = 60.0


class HttpServer:
    """A running server; ``port`` is the bound port, ``cleanup()`` stops it."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        self._thread.start()

    async def cleanup(self) -> None:
        await asyncio.to_thread(self._server.shutdown)
        self._server.server_close()


KEEP_ALIVE_SECONDS = 30.0


def make_handler(worker: Worker) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive: a client that probes often (the local controller, every 0.2 s)
        # reuses its connection and its thread instead of costing the worker a new
        # thread per request; a connection idle for KEEP_ALIVE_SECONDS is closed.
        protocol_version = "HTTP/1.1"
        timeout = KEEP_ALIVE_SECONDS

        def do_GET(self) -> None:
            if self.path == "/metrics":
                worker.metrics.cache_counts(worker.cache.hits, worker.cache.misses)
                worker.metrics.cache_size(worker.cache.total_bytes, worker.cache.max_bytes)
                worker.metrics.store_connected.set(1 if worker.connected else 0)
                worker.sync_failure_metrics()
                self._send(200, worker.metrics.exposition(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                health = worker.health()
                stuck = time.monotonic() - worker.heartbeat > STUCK_SECONDS
                self._json(503 if stuck else 200, {**health, "loop_stuck": stuck})
            elif self.path == "/readyz":
                ready = worker.ready
                self._json(200 if ready else 503, {"ready": ready, **worker.health()})
            else:
                self._send(404, b"not found\n", "text/plain")

        def _json(self, code: int, doc: dict[str, Any]) -> None:
            self._send(code, json.dumps(doc).encode(), "application/json")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no access log

    return Handler


async def start_http(worker: Worker, host: str, port: int) -> tuple[HttpServer, int]:
    """Start serving in a thread; return the server (to clean up) and the bound port."""
    try:
        server = ThreadingHTTPServer((host, port), make_handler(worker))
    except OSError as exc:
        raise OSError(
            exc.errno, f"cannot serve /metrics, /healthz, /readyz on {host}:{port}: {exc.strerror}"
        ) from None
    server.daemon_threads = True
    http = HttpServer(server)
    return http, http.port
