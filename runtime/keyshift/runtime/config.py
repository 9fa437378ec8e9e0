"""A worker's settings: its StreamJob manifest (:mod:`keyshift.api.spec`) plus what its
pod knows: ``KEYSHIFT_WORKER_ORDINAL``, ``KEYSHIFT_STORE_URL`` (overrides
``spec.stateStore.url``), ``KEYSHIFT_STORE_PASSWORD_FILE`` (a mounted Secret) or
``KEYSHIFT_STORE_PASSWORD``, ``KEYSHIFT_STORE_CA_FILE``, ``KEYSHIFT_OUTPUT_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from pydantic import Field

from keyshift.api.names import worker_name
from keyshift.api.spec import Model, StreamJob, StreamJobSpec
from keyshift.errors import KeyshiftError

OUTPUT_DIR_ENV: Final = "KEYSHIFT_OUTPUT_DIR"


class InvalidWorkerSettings(KeyshiftError, ValueError):
    """A worker started without what it needs to know (its ordinal, the store's URL)."""


class WorkerSettings(Model):
    """Everything one worker process runs with."""

    manifest: StreamJob
    ordinal: int = Field(ge=0)
    store_url: str
    store_password: str | None = Field(default=None, repr=False)
    store_ca_file: str | None = None
    """The CA (PEM) that signed a TLS store's certificate (``KEYSHIFT_STORE_CA_FILE``)."""
    http_host: str = "127.0.0.1"
    http_port: int | None = Field(default=None, ge=0, le=65535)
    """``None``: no HTTP server; 0: any free port."""
    output_dir: str | None = None
    """Where log sinks' relative paths start (``KEYSHIFT_OUTPUT_DIR``; ``keyshift run``:
    the job's run directory); ``None``: the working directory."""

    @property
    def job(self) -> str:
        return self.manifest.name

    @property
    def spec(self) -> StreamJobSpec:
        return self.manifest.spec

    @property
    def worker_name(self) -> str:
        return worker_name(self.job, self.ordinal)


def settings_from(
    manifest: StreamJob,
    *,
    ordinal: int | None = None,
    store_url: str | None = None,
    http_port: int | None = None,
    output_dir: str | Path | None = None,
    environ: dict[str, str] | None = None,
) -> WorkerSettings:
    """Combine the manifest, explicit arguments and the environment (arguments win)."""
    env = dict(os.environ) if environ is None else environ
    if ordinal is None:
        raw = env.get("KEYSHIFT_WORKER_ORDINAL") or env.get("HOSTNAME", "").rpartition("-")[2]
        if not raw.isdigit():
            raise InvalidWorkerSettings(
                "worker ordinal unknown: pass --ordinal or KEYSHIFT_WORKER_ORDINAL"
            )
        ordinal = int(raw)
    url = store_url or env.get("KEYSHIFT_STORE_URL") or manifest.spec.state_store.url
    if not url:
        raise InvalidWorkerSettings(
            "state store URL unknown: set spec.stateStore.url or KEYSHIFT_STORE_URL"
        )
    password_file = (
        env.get("KEYSHIFT_STORE_PASSWORD_FILE") or manifest.spec.state_store.password_file
    )
    password = env.get("KEYSHIFT_STORE_PASSWORD")
    if password_file:
        password = Path(password_file).read_text().strip()
    # the operator points every worker with a store Secret at its `ca.crt`; a Secret
    # without one (a store whose certificate the system's CAs verify, or no TLS) is fine
    ca_file = env.get("KEYSHIFT_STORE_CA_FILE")
    return WorkerSettings(
        manifest=manifest,
        ordinal=ordinal,
        store_url=url,
        store_password=password or None,
        store_ca_file=ca_file if ca_file and Path(ca_file).is_file() else None,
        http_port=http_port,
        output_dir=str(output_dir or env.get(OUTPUT_DIR_ENV) or "") or None,
    )
