"""Run one worker: ``python -m keyshift.runtime --manifest job.yaml --ordinal 0``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from keyshift.runtime.api import load_job
from keyshift.runtime.config import load_manifest, settings_from
from keyshift.runtime.httpserver import start_http
from keyshift.runtime.worker import Worker
from keyshift.store import open_store

log = logging.getLogger("keyshift.runtime")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m keyshift.runtime", description="Run one keyshift worker."
    )
    parser.add_argument("--manifest", required=True, help="StreamJob manifest (YAML)")
    parser.add_argument("--ordinal", type=int, help="worker ordinal (or KEYSHIFT_WORKER_ORDINAL)")
    parser.add_argument("--store-url", help="state store URL (or KEYSHIFT_STORE_URL)")
    parser.add_argument("--http-host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, help="serve /metrics, /healthz, /readyz here")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.manifest)
    settings = settings_from(
        manifest, ordinal=args.ordinal, store_url=args.store_url, http_port=args.http_port
    )
    job = load_job(settings.spec.job)
    store = open_store(settings.store_url, password=settings.store_password)
    worker = Worker(settings, job, store)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    http = None
    try:
        if settings.http_port is not None:
            http, port = await start_http(worker, args.http_host, settings.http_port)
            log.info("serving /metrics, /healthz, /readyz on %s:%d", args.http_host, port)
        await worker.run()
    finally:
        if http is not None:
            await http.cleanup()
        await store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
