"""Configuration: the StreamJob manifest (one validated model) plus the environment.

The manifest is the Kubernetes custom resource a user applies::

    apiVersion: keyshift.dev/v1alpha1
    kind: StreamJob
    metadata: {name: counter}
    spec:
      job: examples.counter:job
      keyGroups: 16
      parallelism: 2
      source: {type: generator, keys: 10000, rate: {recordsPerSecond: 5000}}
      sink: {type: log, path: out.jsonl}
      stateStore: {url: redis://127.0.0.1:6379}

A worker adds what its pod knows: ``KEYSHIFT_WORKER_ORDINAL``,
``KEYSHIFT_STORE_URL`` (overrides ``spec.stateStore.url``),
``KEYSHIFT_STORE_PASSWORD_FILE`` (a mounted Secret) or ``KEYSHIFT_STORE_PASSWORD``.
The operator reuses :class:`StreamJobSpec`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from keyshift.store.protocol import check_job_name

API_VERSION: Final = "keyshift.dev/v1alpha1"
KIND: Final = "StreamJob"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> Any:
    """Seconds from a number or a string like ``500ms``, ``1s``, ``2m``."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"bad duration {value!r}: use e.g. 500ms, 1s, 2m")
        return float(match.group(1)) * _UNITS[match.group(2)]
    return value


Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class RateSpec(Model):
    """Total records per second over all key groups, as a function of job time ``t``.

    - ``constant``: ``recordsPerSecond``; omitted means unlimited;
    - ``step``: ``recordsPerSecond`` until ``at``, then ``to``;
    - ``sine``: ``recordsPerSecond + amplitude * sin(2 pi t / period)``;
    - ``spike``: ``recordsPerSecond``, but ``to`` during ``[at, at + duration)``;
    - ``points``: ``[[t, rate], ...]`` linearly interpolated, flat outside.
    """

    shape: Literal["constant", "step", "sine", "spike", "points"] = "constant"
    records_per_second: float | None = Field(default=None, ge=0)
    to: float = Field(default=0.0, ge=0)
    at: float = Field(default=0.0, ge=0)
    duration: float = Field(default=0.0, ge=0)
    amplitude: float = Field(default=0.0, ge=0)
    period: float = Field(default=60.0, gt=0)
    points: list[tuple[float, float]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> RateSpec:
        if self.shape == "points":
            if not self.points:
                raise ValueError("rate shape 'points' needs points: [[t, rate], ...]")
            times = [t for t, _ in self.points]
            if times != sorted(times) or any(r < 0 for _, r in self.points):
                raise ValueError("rate points must have increasing times and rates >= 0")
        elif self.records_per_second is None and self.shape != "constant":
            raise ValueError(f"rate shape {self.shape!r} needs recordsPerSecond")
        rps = self.records_per_second
        if self.shape == "sine" and rps is not None and self.amplitude > rps:
            raise ValueError("sine amplitude must not exceed recordsPerSecond")
        return self


class GeneratorSource(Model):
    """The deterministic generator: record ``(kg, offset)`` depends on the seed only."""

    type: Literal["generator"] = "generator"
    seed: int = 0
    keys: int = Field(default=10_000, ge=1)
    """Distinct keys over all key groups; key ``i`` belongs to key group ``i % keyGroups``."""
    distribution: Literal["uniform", "zipf"] = "uniform"
    zipf_exponent: float = Field(default=1.1, gt=0)
    max_value: int = Field(default=100, ge=1)
    """Record values are drawn from ``[1, maxValue]``."""
    rate: RateSpec = Field(default_factory=RateSpec)
    limit: int | None = Field(default=None, ge=0)
    """Records per key group, for bounded runs (tests); omitted: unbounded."""


class LogSink(Model):
    type: Literal["log"] = "log"
    path: str | None = None
    """File to append JSON lines to; omitted: standard output."""
    fsync: bool = False


class NullSink(Model):
    type: Literal["null"] = "null"


class StateStoreSpec(Model):
    url: str | None = None
    password_file: str | None = None
    secret_ref: str | None = None
    """Name of a Kubernetes Secret with the password (the operator mounts it)."""
    cache_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """Byte bound of each worker's state cache."""


class StreamJobSpec(Model):
    job: str
    """The job's ``module:attribute``."""
    key_groups: int = Field(default=128, ge=1, le=65536)
    parallelism: int = Field(default=1, ge=1)
    source: GeneratorSource = Field(default_factory=GeneratorSource)
    sink: Annotated[LogSink | NullSink, Field(discriminator="type")] = Field(
        default_factory=NullSink
    )
    state_store: StateStoreSpec = Field(default_factory=StateStoreSpec)
    checkpoint_interval: Seconds = 1.0
    error_policy: Literal["fail", "skip"] = "fail"
    batch_size: int = Field(default=500, ge=1)
    failover_after: Seconds = 10.0


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    namespace: str | None = None


class StreamJob(Model):
    api_version: Literal["keyshift.dev/v1alpha1"] = API_VERSION
    kind: Literal["StreamJob"] = KIND
    metadata: Metadata
    spec: StreamJobSpec

    @model_validator(mode="after")
    def _check_name(self) -> StreamJob:
        check_job_name(self.metadata.name)
        return self

    @property
    def name(self) -> str:
        return self.metadata.name


def load_manifest(path: str | Path) -> StreamJob:
    data = yaml.safe_load(Path(path).read_text())
    return StreamJob.model_validate(data)


class WorkerSettings(Model):
    """Everything one worker process runs with."""

    manifest: StreamJob
    ordinal: int = Field(ge=0)
    store_url: str
    store_password: str | None = Field(default=None, repr=False)
    http_host: str = "127.0.0.1"
    http_port: int | None = Field(default=None, ge=0, le=65535)
    """``None``: no HTTP server; 0: any free port."""

    @property
    def job(self) -> str:
        return self.manifest.name

    @property
    def spec(self) -> StreamJobSpec:
        return self.manifest.spec

    @property
    def worker_name(self) -> str:
        return worker_name(self.job, self.ordinal)


def worker_name(job: str, ordinal: int) -> str:
    """A worker's name: its pod's name, ``<job>-worker-<i>``."""
    return f"{job}-worker-{ordinal}"


def settings_from(
    manifest: StreamJob,
    *,
    ordinal: int | None = None,
    store_url: str | None = None,
    http_port: int | None = None,
    environ: dict[str, str] | None = None,
) -> WorkerSettings:
    """Combine the manifest, explicit arguments and the environment (arguments win)."""
    env = dict(os.environ) if environ is None else environ
    if ordinal is None:
        raw = env.get("KEYSHIFT_WORKER_ORDINAL") or env.get("HOSTNAME", "").rpartition("-")[2]
        if not raw.isdigit():
            raise ValueError("worker ordinal unknown: pass --ordinal or KEYSHIFT_WORKER_ORDINAL")
        ordinal = int(raw)
    url = store_url or env.get("KEYSHIFT_STORE_URL") or manifest.spec.state_store.url
    if not url:
        raise ValueError("state store URL unknown: set spec.stateStore.url or KEYSHIFT_STORE_URL")
    password_file = (
        env.get("KEYSHIFT_STORE_PASSWORD_FILE") or manifest.spec.state_store.password_file
    )
    password = env.get("KEYSHIFT_STORE_PASSWORD")
    if password_file:
        password = Path(password_file).read_text().strip()
    return WorkerSettings(
        manifest=manifest,
        ordinal=ordinal,
        store_url=url,
        store_password=password or None,
        http_port=http_port,
    )
