"""The worker's small HTTP server: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz`` answers 200 while the worker loop lives, with the key groups a
user-function error stopped listed in the body (status ``degraded``): a
restart would not cure them, so they must not make Kubernetes restart the pod.
``/readyz`` answers 200 once the worker is connected to the store and runs
the current assignment generation, 503 otherwise.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from keyshift.runtime.worker import Worker


def make_app(worker: Worker) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        worker.metrics.cache_counts(worker.cache.hits, worker.cache.misses)
        body = worker.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response(worker.health())

    async def readyz(_request: web.Request) -> web.Response:
        ready = worker.ready
        return web.json_response({"ready": ready, **worker.health()}, status=200 if ready else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_http(worker: Worker, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; return the runner (to clean up) and the bound port."""
    runner = web.AppRunner(make_app(worker), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    for address in runner.addresses:
        bound = int(address[1])
    return runner, bound
