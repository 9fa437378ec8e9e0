"""Run one worker: ``python -m keyshift.runtime --manifest job.yaml --ordinal 0``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from pydantic import ValidationError

from keyshift.api.spec import load_manifest
from keyshift.errors import KeyshiftError
from keyshift.runtime.api import JOB_PATH_ENV, load_job
from keyshift.runtime.collector import settle_garbage_collector
from keyshift.runtime.config import settings_from
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
    parser.add_argument(
        "--http-host", default=os.environ.get("KEYSHIFT_HTTP_HOST", "127.0.0.1"),
        help="address of the HTTP server (or KEYSHIFT_HTTP_HOST; default 127.0.0.1)",
    )  # fmt: skip
    env_port = os.environ.get("KEYSHIFT_HTTP_PORT")
    parser.add_argument(
        "--http-port", type=int, default=int(env_port) if env_port else None,
        help="serve /metrics, /healthz, /readyz here (or KEYSHIFT_HTTP_PORT)",
    )  # fmt: skip
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.manifest)
    settings = settings_from(
        manifest, ordinal=args.ordinal, store_url=args.store_url, http_port=args.http_port
    )
    job = load_job(settings.spec.job, os.environ.get(JOB_PATH_ENV, "").split(os.pathsep))
    store = open_store(
        settings.store_url,
        password=settings.store_password,
        ca_file=settings.store_ca_file,
        retry_seconds=store_retry_seconds(),
    )
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


STORE_RETRY_ENV = "KEYSHIFT_STORE_RETRY_SECONDS"
"""How long one store call is retried before the key group reports the store unavailable
(and tries again a second later); 30 by default."""


def store_retry_seconds() -> float:
    raw = os.environ.get(STORE_RETRY_ENV, "30")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0.1 <= seconds <= 3600:
        raise SystemExit(f"{STORE_RETRY_ENV}={raw!r}: give seconds from 0.1 to 3600")
    return seconds


TERMINATION_LOG = "/dev/termination-log"
"""Where Kubernetes reads a container's last words (``terminationMessagePath``)."""


def report_fatal(message: str) -> None:
    """Log why the worker cannot run and leave it as the pod's termination message."""
    log.error("%s", message)
    path = os.environ.get("KEYSHIFT_TERMINATION_LOG", TERMINATION_LOG)
    try:
        with open(path, "w") as out:
            out.write(message[:4096])
    except OSError:
        pass  # not on Kubernetes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settle_garbage_collector()  # after the imports: see keyshift.runtime.collector
    try:
        return asyncio.run(run(args))
    except (KeyshiftError, ValidationError, OSError) as exc:  # not a bug: why, no traceback
        report_fatal(f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
