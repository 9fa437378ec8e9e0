"""The StreamJob manifest: one validated model, for ``keyshift run`` and the operator.

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

The StreamJob CRD (``crds/streamjob.yaml``) is generated from :class:`StreamJobSpec`
by ``keyshift crd --write``: its docstrings are the CRD's field descriptions.  A
worker's own settings (the manifest plus its environment) are in
:mod:`keyshift.runtime.config`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel, to_snake

from keyshift.api.names import API_VERSION, GROUP, KIND
from keyshift.errors import KeyshiftError
from keyshift.store.client import parse_store_url
from keyshift.store.protocol import check_job_name

# ASCII digits only (``\d`` would take full-width and other Unicode digits), and at most
# twelve of them: longer is never a duration anyone means.
_DURATION = re.compile(r"^ *([0-9]{1,12}(?:\.[0-9]{1,9})?) *(ms|s|m|h)? *$", re.ASCII)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

HOUR: Final = 3600.0
DAY: Final = 24 * HOUR
YEAR: Final = 365 * DAY
MAX_RATE: Final = 1e9
"""Records per second: a bound no job of this kind reaches, that keeps rates finite."""
MAX_COUNT: Final = 2**53 - 1
"""The largest integer JSON (and so a Kubernetes manifest) carries exactly."""
MAX_KEY_GROUPS: Final = 65536


def parse_duration(value: Any) -> Any:
    """Seconds from a number or a string like ``500ms``, ``1s``, ``2m``."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            shown = repr(value) if len(value) <= 32 else f"of {len(value)} characters"
            raise ValueError(f"bad duration {shown}: use e.g. 500ms, 1s, 2m (ASCII digits)")
        return float(match.group(1)) * _UNITS[match.group(2)]
    return value


def _duration_schema(low: Literal["gt", "ge"], high: float) -> WithJsonSchema:
    """The CRD's schema of a duration: a number or a string like ``500ms``."""
    number: dict[str, Any] = {"type": "number", "maximum": high}
    number["exclusiveMinimum" if low == "gt" else "minimum"] = 0
    return WithJsonSchema({"anyOf": [number, {"type": "string", "pattern": _DURATION.pattern}]})


Seconds = Annotated[
    float, BeforeValidator(parse_duration), Field(gt=0, le=HOUR), _duration_schema("gt", HOUR)
]
"""A duration in seconds, up to an hour: a number, or a string like ``500ms``, ``2s``,
``1.5m``, ``1h``."""

LongSeconds = Annotated[
    float, BeforeValidator(parse_duration), Field(gt=0, le=7 * DAY), _duration_schema("gt", 7 * DAY)
]
"""A duration in seconds, up to a week."""

OptionalSeconds = Annotated[
    float, BeforeValidator(parse_duration), Field(ge=0, le=7 * DAY), _duration_schema("ge", 7 * DAY)
]
"""A duration in seconds that may be zero, up to a week."""

Rate = Annotated[float, Field(ge=0, le=MAX_RATE)]
"""Records per second."""

JobTime = Annotated[float, Field(ge=0, le=YEAR)]
"""Seconds of job time, up to a year."""


def _points_as_tuples(value: Any) -> Any:
    """``[[t, rate], ...]`` as YAML and JSON give it: lists, which strict mode takes as
    tuples only when told."""
    if isinstance(value, list):
        return [tuple(p) if isinstance(p, list) and len(p) == 2 else p for p in value]
    return value


# A Kubernetes resource quantity (``500m``, ``2``, ``1.5Gi``, ``1e3``), as the API server
# accepts it; integers are quantities too.
_QUANTITY: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = (
    Annotated[int, Field(ge=0, le=MAX_COUNT)]
    | Annotated[str, StringConstraints(pattern=_QUANTITY, max_length=64)]
)


class Model(BaseModel):
    """Base of the manifest's models: camelCase names, unknown fields refused, immutable.

    Class and attribute docstrings are the descriptions of the JSON schema, hence of the
    CRD (``keyshift crd``): write them for the user of the manifest. The attributes'
    docstrings are read from this module's source when the CRD is made
    (``keyshift.controller.kubernetes.crd.spec_json_schema``), not at import.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        # the types the CRD's schema has: "4" is not an integer, true is not a number
        strict=True,
        allow_inf_nan=False,
        hide_input_in_errors=True,  # a rejected store URL may hold a password
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
    """How the rate changes over time (see the description of ``rate``)."""
    records_per_second: Rate | None = None
    """The base rate in records per second (at most 10^9); omitted with shape
    ``constant``: unlimited."""
    to: Rate = 0.0
    """The rate after ``at`` (``step``) or during the spike (``spike``)."""
    at: JobTime = 0.0
    """Seconds of job time when the step or the spike starts (at most a year)."""
    duration: JobTime = 0.0
    """Seconds the spike lasts."""
    amplitude: Rate = 0.0
    """Amplitude of the ``sine`` shape (at most ``recordsPerSecond``)."""
    period: float = Field(default=60.0, gt=0, le=YEAR)
    """Period of the ``sine`` shape in seconds."""
    points: Annotated[
        list[tuple[Rate, Rate]], BeforeValidator(_points_as_tuples), Field(max_length=10_000)
    ] = Field(default_factory=list)
    """``[[t, rate], ...]`` with increasing ``t`` (seconds) for the ``points`` shape (each
    at most 10^9)."""

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
    """The source type."""
    seed: int = Field(default=0, ge=0, le=MAX_COUNT)
    """Seed of the generated records."""
    keys: int = Field(default=10_000, ge=1, le=2**32)
    """Distinct keys over all key groups; key ``i`` belongs to key group ``i % keyGroups``."""
    distribution: Literal["uniform", "zipf"] = "uniform"
    """How keys are drawn inside a key group."""
    zipf_exponent: float = Field(default=1.1, gt=0, le=10)
    """Exponent of the ``zipf`` distribution (larger: more skew)."""
    max_value: int = Field(default=100, ge=1, le=MAX_COUNT)
    """Record values are drawn from ``[1, maxValue]``."""
    rate: RateSpec = Field(default_factory=RateSpec)
    """Input rate over time."""
    limit: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    """Records per key group, for bounded runs (tests); omitted: unbounded."""
    disorder: OptionalSeconds = 0.0
    """Records' event times are their scheduled times minus a deterministic jitter of up
    to this duration (out-of-order data)."""


class TimeSpec(Model):
    """Event time: the per-key-group watermarks that fire event-time timers."""

    out_of_orderness: OptionalSeconds = 0.0
    """How far behind the largest event time seen the watermark stays: records later
    than that are late."""
    idle_timeout: LongSeconds = 10.0
    """After this long without records a key group's watermark follows processing time
    (minus this timeout and ``outOfOrderness``), in steps of ``checkpointInterval`` or a
    second, whichever is longer: each step is committed before anything depends on it,
    so that a replay sees it at the same position."""


_SECRET_PROPERTY = re.compile(r"password|secret|private", re.IGNORECASE)


def _no_secret_properties(properties: dict[str, str]) -> dict[str, str]:
    secret = sorted(k for k in properties if _SECRET_PROPERTY.search(k))
    if secret:
        raise ValueError(
            f"Kafka properties {secret} hold secrets: put them in a Secret and give them to "
            "the workers as KEYSHIFT_KAFKA_<PROPERTY> environment variables (e.g. "
            "KEYSHIFT_KAFKA_SASL_PASSWORD for sasl.password) through spec.env"
        )
    return properties


class KafkaClient(Model):
    """How to reach a Kafka cluster."""

    bootstrap_servers: str = Field(min_length=1)
    """``host:port[,host:port...]`` of the Kafka brokers."""
    properties: dict[str, str] = Field(default_factory=dict)
    """Extra librdkafka client properties (``security.protocol``, ``sasl.mechanism``,
    ...), without secrets: those come from ``KEYSHIFT_KAFKA_<PROPERTY>`` variables."""

    _check_properties = field_validator("properties")(_no_secret_properties)


class KafkaSource(KafkaClient):
    """A Kafka topic: one key group per partition, read from the position committed
    with the state (never from Kafka's consumer-group offsets)."""

    type: Literal["kafka"] = "kafka"
    """The source type."""
    topic: str = Field(min_length=1, max_length=249)
    """The input topic; its partition count must equal ``keyGroups``."""
    format: Literal["json", "msgpack", "string", "bytes"] = "json"
    """How record values are decoded, unless the job has its own ``decode``."""
    max_record_bytes: int = Field(default=1024 * 1024, ge=1, le=1024 * 1024 * 1024)
    """A record whose key and value together are larger is poison."""
    on_poison: Literal["fail", "skip", "dead-letter"] = "fail"
    """What a record that cannot be decoded (or is too large) does: ``fail`` stops its
    key group, ``skip`` counts and skips it, ``dead-letter`` writes its original bytes
    and the error to ``deadLetterTopic`` and goes on."""
    dead_letter_topic: str | None = Field(default=None, min_length=1, max_length=249)
    """Where poison records go with ``onPoison: dead-letter``."""
    fetch_max_records: int = Field(default=10_000, ge=100, le=10_000_000)
    """Records a worker buffers per key group ahead of processing."""

    @model_validator(mode="after")
    def _check_dead_letter(self) -> KafkaSource:
        if self.on_poison == "dead-letter" and not self.dead_letter_topic:
            raise ValueError("source.onPoison dead-letter needs source.deadLetterTopic")
        return self


class KafkaSink(KafkaClient):
    """A Kafka topic; every output carries its origin in headers (``keyshift-key-group``,
    ``keyshift-offset``, ``keyshift-index``, and ``keyshift-timer`` on a timer's outputs),
    so a consumer can deduplicate."""

    type: Literal["kafka"] = "kafka"
    """The sink type."""
    topic: str = Field(min_length=1, max_length=249)
    """The output topic."""
    format: Literal["json", "msgpack"] = "json"
    """How output values are encoded."""
    flush_timeout: Seconds = 30.0
    """How long a checkpoint waits for the broker to acknowledge outputs before it
    retries (the state is not committed until it has)."""


class LogSink(Model):
    """Outputs as JSON lines, to a file or standard output."""

    type: Literal["log"] = "log"
    """The sink type."""
    path: str | None = Field(default=None, min_length=1, max_length=1024)
    """File to append JSON lines to, relative to the job's output directory (``keyshift
    run``: ``.keyshift/<job>/``; in a pod: the worker's working directory) and inside it;
    omitted: standard output."""

    @field_validator("path")
    @classmethod
    def _inside_the_output_directory(cls, path: str | None) -> str | None:
        if path is not None and (path.startswith(("/", "\\")) or ".." in re.split(r"[/\\]", path)):
            raise ValueError(
                f"log sink path {path!r} must stay inside the job's output directory: a "
                "relative path without '..'"
            )
        return path

    fsync: bool = False
    """Whether to fsync the file before each state commit."""


class NullSink(Model):
    """Outputs are dropped."""

    type: Literal["null"] = "null"
    """The sink type."""


SinkSpec = Annotated[LogSink | NullSink | KafkaSink, Field(discriminator="type")]


def _source_type(data: Any) -> str:
    """A source without ``type`` is the generator."""
    found = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return str(found or "generator")


SourceSpec = Annotated[
    Annotated[GeneratorSource, Tag("generator")] | Annotated[KafkaSource, Tag("kafka")],
    Discriminator(_source_type),
]
_OUTPUT_NAME = r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$"
_IDENTIFIERS = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_ENTRY_POINT = f"^{_IDENTIFIERS}:{_IDENTIFIERS}$"


class StateStoreSpec(Model):
    """Where the job's keyed state lives: a Valkey/Redis server or Redis Cluster."""

    url: str | None = Field(default=None, max_length=4096)
    """``redis://host:port[/db]``, ``rediss://...`` (TLS) or
    ``redis+cluster://host:port[,host:port...]``, without a password."""
    password_file: str | None = None
    """A file with the store's password, for local runs (on Kubernetes: ``secretRef``)."""
    secret_ref: str | None = None
    """Name of a Kubernetes Secret with the password under the key ``password``
    (the operator mounts it into the workers), labelled
    ``keyshift.dev/streamjob-secret=true``: the operator uses no other Secret."""
    cache_bytes: int = Field(default=64 * 1024 * 1024, gt=0, le=2**40)
    """Byte bound of each worker's state cache (at most 1 TiB)."""
    allow_eviction: bool = False
    """Run although the store's ``maxmemory-policy`` may evict keys.  A store that evicts
    loses state silently (an evicted metadata key would restart its key group from
    position 0 on top of its state: keyshift refuses that claim), so workers refuse to
    start unless the policy is ``noeviction`` or this is set (then they warn)."""

    @model_validator(mode="before")
    @classmethod
    def _no_inline_password(cls, data: Any) -> Any:
        if isinstance(data, dict) and "password" in data:
            raise ValueError(
                "stateStore.password is not a field: put the password in a Secret and "
                "name it in stateStore.secretRef"
            )
        return data

    @field_validator("url")
    @classmethod
    def _no_password_in_url(cls, url: str | None) -> str | None:
        if url and url_has_password(url):
            raise ValueError(STORE_URL_PASSWORD_MESSAGE)
        if url and "@" in urlsplit(url).netloc:
            raise ValueError(
                "stateStore.url must not contain a user name: the store's password comes "
                "from the Secret named in stateStore.secretRef"
            )
        if url and urlsplit(url).query:
            raise ValueError(
                "stateStore.url takes no query parameters (a password among them would "
                "be ignored and kept in the resource): put a password in a Secret and "
                "name it in stateStore.secretRef"
            )
        if url:
            parse_store_url(url)  # scheme, hosts, ports, database: as the workers open it
        return url


STORE_URL_PASSWORD_MESSAGE: Final = (
    "stateStore.url must not contain a password: put it in a Secret and name it in "
    "stateStore.secretRef"
)


def url_has_password(url: str) -> bool:
    """Whether a URL carries a password (``scheme://:pw@host`` or ``scheme://user:pw@host``)."""
    try:
        return bool(urlsplit(url).password)
    except ValueError:  # e.g. a bad port: not this check's business
        return False


class PrometheusSpec(Model):
    """The Prometheus server the autoscaler reads load metrics from."""

    url: str | None = None
    """Base URL of the Prometheus HTTP API, e.g. ``http://prometheus.monitoring:9090``;
    omitted: the operator's default."""
    secret_ref: str | None = None
    """Name of a Secret with a bearer ``token``, or ``username`` and ``password`` keys,
    labelled ``keyshift.dev/streamjob-secret=true``: the operator uses no other Secret."""
    insecure_skip_verify: bool = False
    """Skip TLS certificate verification (test setups only)."""


class QueriesSpec(Model):
    """PromQL overrides for the autoscaler's inputs; omitted: the built-in queries over
    keyshift's worker metrics.  ``$job``, ``$namespace`` and ``$window`` are replaced by
    the StreamJob's name and namespace (``local`` for ``keyshift run``) and the window;
    keyshift's series carry them as the labels ``streamjob`` and ``namespace``."""

    arrival_rate: str | None = None
    """Records per second arriving at the job's input, over all key groups."""
    lag: str | None = None
    """Records not yet processed, over all key groups."""
    processed_rate: str | None = None
    """Records per second processed, per worker."""
    busy_ratio: str | None = None
    """Fraction of time each worker is busy processing (0..1)."""


class AutoscalerSpec(Model):
    """The autoscaler: parallelism from input rate, lag and worker capacity (DS2 style)."""

    enabled: bool = False
    """Whether the autoscaler runs; when false, ``parallelism`` is only set by hand."""
    mode: Literal["scale", "recommend"] = "scale"
    """``scale``: apply decisions; ``recommend``: only report them (status, Events, metrics)."""
    min_parallelism: int = Field(default=1, ge=0, le=MAX_KEY_GROUPS)
    """Lower bound of the parallelism the autoscaler chooses. ``0``: the job scales to
    zero after ``scaleToZeroAfter`` without input (its state stays in the store, no
    worker runs), and wakes when input arrives or a timer is due."""
    scale_to_zero_after: LongSeconds = 300.0
    """With ``minParallelism: 0``: scale to zero once the input has been idle this long
    (nothing arriving, no lag)."""
    wake_check_seconds: Seconds = 1.0
    """With ``minParallelism: 0``, while no worker runs: how often the operator looks at
    the input (the Kafka topic's high-water marks against the positions committed in
    the store, or the generator's clock) and the earliest timer."""
    max_parallelism: int | None = Field(default=None, ge=1, le=MAX_KEY_GROUPS)
    """Upper bound of the parallelism the autoscaler chooses; omitted: ``keyGroups``."""
    target_utilization: float = Field(default=0.7, gt=0, le=1)
    """Busy ratio each worker should run at."""
    utilization_boundary: float = Field(default=0.2, ge=0, lt=1)
    """Dead band around the target: no decision while utilization stays within
    ``targetUtilization +/- utilizationBoundary``."""
    catch_up_seconds: float = Field(default=120.0, gt=0, le=DAY)
    """Seconds within which the current lag should be worked off."""
    metrics_window_seconds: float = Field(default=60.0, gt=0, le=DAY)
    """Length of the metrics window a decision is based on."""
    interval_seconds: float = Field(default=15.0, gt=0, le=HOUR)
    """Seconds between two evaluations."""
    cooldown_seconds: float = Field(default=30.0, ge=0, le=DAY)
    """No decision for this long after a rescale."""
    scale_down_stabilization_seconds: float = Field(default=300.0, ge=0, le=DAY)
    """Scale down only to the highest recommendation within this window."""
    max_scale_up_factor: float | None = Field(default=None, gt=1, le=1000)
    """At most this factor more workers per decision; omitted: unbounded."""
    max_scale_down_factor: float | None = Field(default=None, gt=0, lt=1)
    """At most this factor fewer workers per decision (e.g. 0.5: halve at most);
    omitted: unbounded."""
    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec)
    """Where the metrics come from."""
    queries: QueriesSpec = Field(default_factory=QueriesSpec)
    """PromQL overrides."""

    @model_validator(mode="after")
    def _check(self) -> AutoscalerSpec:
        high = self.max_parallelism
        if high is not None and self.min_parallelism > high:
            raise ValueError(
                f"autoscaler.minParallelism ({self.min_parallelism}) must not exceed "
                f"autoscaler.maxParallelism ({high})"
            )
        return self


class ResourceRequirements(Model):
    """Compute resources of each worker container (Kubernetes ResourceRequirements)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Minimum resources, e.g. ``{cpu: 500m, memory: 512Mi}``."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Maximum resources, e.g. ``{memory: 1Gi}``."""


class EnvVar(Model):
    """An environment variable of the worker container (Kubernetes EnvVar)."""

    name: str = Field(min_length=1)
    """The variable's name."""
    value: str | None = None
    """The value; omitted: ``valueFrom`` or empty."""
    value_from: dict[str, Any] | None = None
    """A Kubernetes EnvVarSource (``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``, ...)."""

    @model_validator(mode="after")
    def _check(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: give value or valueFrom, not both")
        if self.value and _holds_a_secret(self.name, self.value):
            raise ValueError(
                f"env {self.name} holds a secret in clear (the worker StatefulSet would show "
                "it): take it from a Secret with valueFrom.secretKeyRef"
            )
        return self


_DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_RESERVED_VOLUMES: Final = ("config", "tmp", "store-secret")
"""The worker pod's own volumes (the job's manifest, a scratch ``/tmp``, the store's
Secret): a pod template's volumes take other names."""
_RESERVED_PATHS: Final = ("/etc/keyshift", "/tmp", "/var/run/secrets/keyshift")
"""Where the operator mounts its volumes in the worker container."""
_RESERVED_LABELS: Final = ("app.kubernetes.io/name", "apps.kubernetes.io/pod-index")
"""Labels the operator (the workers' selector) or the StatefulSet controller sets; so
are all of ``keyshift.dev/``."""
_VOLUME_SOURCES: Final = (
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
)  # fmt: skip
"""The volume types the restricted Pod Security Standard allows."""
_RESTRICTED: Final = (
    "the workers always run with the restricted security context (non-root, read-only "
    "root filesystem, no privilege escalation, all capabilities dropped, seccomp "
    "RuntimeDefault) and the pod template cannot relax it"
)


class ObjectName(Model):
    """A reference to an object of the job's namespace by name (Kubernetes
    LocalObjectReference)."""

    name: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    """The object's name."""


class KeyRef(Model):
    """A ConfigMap or Secret whose keys become environment variables."""

    name: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    """The ConfigMap's or Secret's name."""
    optional: bool | None = None
    """Whether the pod starts without it."""


class EnvFromSource(Model):
    """Environment variables of the worker container from all keys of a ConfigMap or a
    Secret (Kubernetes EnvFromSource): give exactly one of ``configMapRef`` and
    ``secretRef``. Variables of ``spec.env`` and the operator's own win over them."""

    prefix: str | None = Field(default=None, max_length=253)
    """Prepended to every key."""
    config_map_ref: KeyRef | None = None
    """The ConfigMap."""
    secret_ref: KeyRef | None = None
    """The Secret, labelled ``keyshift.dev/streamjob-secret=true``: the operator uses no
    other Secret."""

    @model_validator(mode="after")
    def _check(self) -> EnvFromSource:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("envFrom: give exactly one of configMapRef and secretRef")
        return self


class Volume(Model):
    """A volume of the worker pod (Kubernetes Volume), of one of the types the restricted
    Pod Security Standard allows; each source is the Kubernetes object of that name."""

    name: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL)
    """The volume's name (not ``config``, ``tmp`` or ``store-secret``: the operator's)."""
    config_map: dict[str, Any] | None = None
    """A ConfigMap (Kubernetes ConfigMapVolumeSource)."""
    csi: dict[str, Any] | None = None
    """A CSI driver's volume (Kubernetes CSIVolumeSource)."""
    downward_api: dict[str, Any] | None = Field(default=None, alias="downwardAPI")
    """The pod's own fields (Kubernetes DownwardAPIVolumeSource)."""
    empty_dir: dict[str, Any] | None = None
    """A scratch directory (Kubernetes EmptyDirVolumeSource)."""
    ephemeral: dict[str, Any] | None = None
    """A volume claimed for the pod's lifetime (Kubernetes EphemeralVolumeSource)."""
    persistent_volume_claim: dict[str, Any] | None = None
    """A PersistentVolumeClaim (Kubernetes PersistentVolumeClaimVolumeSource)."""
    projected: dict[str, Any] | None = None
    """Several sources in one directory (Kubernetes ProjectedVolumeSource)."""
    secret: dict[str, Any] | None = None
    """A Secret (Kubernetes SecretVolumeSource), labelled
    ``keyshift.dev/streamjob-secret=true``: the operator uses no other Secret."""

    @model_validator(mode="before")
    @classmethod
    def _allowed_type(cls, data: Any) -> Any:
        if isinstance(data, dict):
            other = sorted(k for k in data if k != "name" and k not in _VOLUME_SOURCES)
            if other:
                raise ValueError(
                    f"volume {data.get('name')!r}: {', '.join(other)} is not a volume type "
                    "the workers may use: they run under the restricted Pod Security "
                    f"Standard, which allows {', '.join(_VOLUME_SOURCES)}"
                )
        return data

    @model_validator(mode="after")
    def _check(self) -> Volume:
        given = [k for k in _VOLUME_SOURCES if self.source(k) is not None]
        if len(given) != 1:
            raise ValueError(f"volume {self.name!r}: give exactly one volume type")
        if self.name in _RESERVED_VOLUMES:
            raise ValueError(
                f"volume name {self.name!r} is the operator's: the worker pod has the "
                f"volumes {', '.join(_RESERVED_VOLUMES)}"
            )
        return self

    def source(self, kind: str) -> dict[str, Any] | None:
        """The volume's source of type ``kind`` (``secret``, ``projected``, ...), if any."""
        found: dict[str, Any] | None = getattr(self, to_snake(kind))
        return found


class VolumeMount(Model):
    """Where the worker container mounts a volume of the pod template (Kubernetes
    VolumeMount)."""

    name: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL)
    """The name of a volume of ``podTemplate.spec.volumes``."""
    mount_path: str = Field(min_length=2, max_length=4096, pattern=r"^/")
    """An absolute path, not at or below the operator's mounts (``/etc/keyshift``,
    ``/tmp``, ``/var/run/secrets/keyshift``)."""
    read_only: bool = False
    """Mount it read-only."""
    sub_path: str | None = Field(default=None, max_length=4096)
    """A path inside the volume to mount instead of its root."""

    @field_validator("mount_path")
    @classmethod
    def _not_the_operators(cls, path: str) -> str:
        clean = path.rstrip("/")
        for reserved in _RESERVED_PATHS:
            if (
                clean == reserved
                or clean.startswith(f"{reserved}/")
                or (reserved.startswith(f"{clean}/"))
            ):
                raise ValueError(
                    f"mountPath {path!r} overlaps {reserved}, where the operator mounts "
                    "the worker's own volumes"
                )
        if ".." in path.split("/"):
            raise ValueError(f"mountPath {path!r} must not contain '..'")
        return path


class WorkerContainerTemplate(Model):
    """Settings of the worker container (the pod's only container, named ``worker``);
    its command, image, ports, probes and security context are the operator's."""

    name: Literal["worker"] = "worker"
    """The container's name: ``worker``."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=64)
    """Mounts of the pod template's volumes."""
    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=64)
    """Environment variables from ConfigMaps and Secrets."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """Compute resources of each worker (``spec.resources`` wins per resource name)."""


class PodTemplateMetadata(Model):
    """Labels and annotations of the worker pods."""

    labels: dict[str, Annotated[str, StringConstraints(max_length=63)]] = Field(
        default_factory=dict
    )
    """Extra labels (``spec.podLabels`` wins; the operator's selector labels and
    ``keyshift.dev/`` ones cannot be set)."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations (``spec.podAnnotations`` wins; ``keyshift.dev/`` ones cannot
    be set)."""

    @field_validator("labels", "annotations")
    @classmethod
    def _not_the_operators(cls, values: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in values if k in _RESERVED_LABELS or k.startswith(f"{GROUP}/"))
        if reserved:
            raise ValueError(
                f"{reserved} are the operator's (the workers' selector and bookkeeping): "
                "use other keys"
            )
        return values


class PodTemplateSpec(Model):
    """The part of the worker pod's spec a user sets; every other field is the
    operator's (see ``podTemplate``)."""

    image_pull_secrets: list[ObjectName] = Field(default_factory=list, max_length=64)
    """Secrets with registry credentials for the job's image (the kubelet uses them to
    pull; they need no label: they never reach the workers)."""
    service_account_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN
    )
    """The workers' ServiceAccount; omitted: the namespace's ``default``."""
    automount_service_account_token: bool | None = None
    """``true`` mounts the ServiceAccount's API token into the workers. Omitted or
    ``false``: no token (the workers never call the Kubernetes API, and the job's code
    should not hold credentials it does not need)."""
    affinity: dict[str, Any] | None = None
    """Kubernetes Affinity of the worker pods."""
    topology_spread_constraints: list[dict[str, Any]] = Field(default_factory=list, max_length=32)
    """Kubernetes TopologySpreadConstraints; one without ``labelSelector`` spreads the
    job's workers (their selector labels)."""
    priority_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN
    )
    """The workers' PriorityClass."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    """Kubernetes tolerations (``spec.tolerations`` are added)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels (``spec.nodeSelector`` wins per key)."""
    volumes: list[Volume] = Field(default_factory=list, max_length=64)
    """Extra volumes, mounted by ``containers[0].volumeMounts``."""
    containers: list[WorkerContainerTemplate] = Field(default_factory=list, max_length=1)
    """At most one: the worker container's settings (``name: worker``)."""

    @model_validator(mode="before")
    @classmethod
    def _no_security_context(cls, data: Any) -> Any:
        if isinstance(data, dict) and "securityContext" in data:
            raise ValueError(f"podTemplate.spec.securityContext cannot be set: {_RESTRICTED}")
        if isinstance(data, dict):
            for container in data.get("containers") or []:
                if isinstance(container, dict) and "securityContext" in container:
                    raise ValueError(
                        f"podTemplate.spec.containers[].securityContext cannot be set: "
                        f"{_RESTRICTED}"
                    )
        return data

    @model_validator(mode="after")
    def _check(self) -> PodTemplateSpec:
        names = [v.name for v in self.volumes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"volumes {twice} are given twice")
        for container in self.containers:
            unknown = sorted({m.name for m in container.volume_mounts} - set(names))
            if unknown:
                raise ValueError(
                    f"volumeMounts name volumes {unknown} that podTemplate.spec.volumes "
                    "does not have"
                )
            paths = [m.mount_path.rstrip("/") for m in container.volume_mounts]
            twice = sorted({p for p in paths if paths.count(p) > 1})
            if twice:
                raise ValueError(f"volumeMounts mount {twice} twice")
        return self

    @property
    def worker(self) -> WorkerContainerTemplate:
        """The worker container's settings (empty when not given)."""
        return self.containers[0] if self.containers else WorkerContainerTemplate()


class PodTemplate(Model):
    """The worker pods' template (like a FlinkDeployment's ``podTemplate``), merged under
    the operator's own settings.

    Precedence: the operator's settings, then the shorthand fields of the spec
    (``nodeSelector``, ``tolerations``, ``podLabels``, ``podAnnotations``, ``env``,
    ``resources``), then this template. The restricted security context is always the
    operator's, and there is no API token unless ``automountServiceAccountToken: true``."""

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata)
    """Labels and annotations of the worker pods."""
    spec: PodTemplateSpec = Field(default_factory=PodTemplateSpec)
    """Scheduling, registry credentials, ServiceAccount, volumes and the worker
    container's mounts, envFrom and resources."""


_SECRET_VARIABLE = re.compile(r"PASSWORD|SECRET|TOKEN|PRIVATE", re.IGNORECASE)


def _holds_a_secret(name: str, value: str) -> bool:
    """Whether a worker variable given as a plain value carries a secret: a password,
    token or secret by its name, or a URL with a password (``KEYSHIFT_STORE_URL``)."""
    by_name = _SECRET_VARIABLE.search(name) and not name.upper().endswith("_FILE")
    return bool(by_name) or (
        "://" in value and (url_has_password(value) or "password=" in value.lower())
    )


class StreamJobSpec(Model):
    """A stateful stream job: its code, key groups, parallelism, input, output and store."""

    job: str = Field(min_length=1, json_schema_extra={"pattern": _ENTRY_POINT})
    """The job's ``module:attribute``. Immutable."""
    key_groups: int = Field(default=128, ge=1, le=MAX_KEY_GROUPS)
    """Number of key groups (input partitions), the unit of state ownership and the upper
    bound of parallelism. Immutable."""
    parallelism: int = Field(default=1, ge=1, le=MAX_KEY_GROUPS)
    """Number of workers (at most ``keyGroups``); ``kubectl scale`` sets it, and so does
    the autoscaler when enabled."""
    source: SourceSpec = Field(default_factory=GeneratorSource)
    """Where records come from (``type``: ``generator`` or ``kafka``)."""
    sink: SinkSpec = Field(default_factory=NullSink)
    """Where outputs go (``type``: ``log``, ``kafka`` or ``null``)."""
    side_outputs: dict[str, SinkSpec] = Field(default_factory=dict)
    """Sinks of named side outputs (``ctx.emit(value, output="late")``); outputs to a name
    not configured here are counted (``keyshift_side_output_records_total``) and dropped."""
    state_store: StateStoreSpec = Field(default_factory=StateStoreSpec)
    """The remote state store."""
    standby_workers: int = Field(default=0, ge=0, le=64)
    """Workers started and ready beyond ``parallelism`` that own no key group: a scale-up
    takes them first, so its new workers need no process or pod start, and the standby is
    refilled after it. Each costs what an idle worker does (its memory and requests)."""
    checkpoint_interval: Seconds = 1.0
    """How often each key group commits its state and input position: a number of seconds
    or a duration such as ``500ms``, ``2s``, ``1m`` (on Kubernetes, fractions of a second
    need the string form)."""
    error_policy: Literal["fail", "skip"] = "fail"
    """What a failing record does: ``fail`` the worker, or ``skip`` the record."""
    time: TimeSpec = Field(default_factory=TimeSpec)
    """Event time: watermarks and timers."""
    batch_size: int = Field(default=500, ge=1, le=1_000_000)
    """Records fetched and processed per key group and batch."""
    failover_after: Seconds = 10.0
    """A worker not ready for this long loses its key groups to the others: a number of
    seconds or a duration such as ``3s`` or ``1m``."""
    handoff_timeout: Seconds = 15.0
    """In a rescale, the old owner of a moving key group must release it within this; after
    it the new owner claims it by force, and the late owner's commits are fenced."""
    autoscaler: AutoscalerSpec = Field(default_factory=AutoscalerSpec)
    """Automatic choice of ``parallelism``."""
    image: str = Field(default="keyshift/keyshift:0.1.0", min_length=1)
    """Container image of the workers; it must contain the job's code."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """The workers' image pull policy."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """Compute resources of each worker."""
    env: list[EnvVar] = Field(default_factory=list)
    """Extra environment variables of the workers."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the worker pods must be scheduled on."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    """Kubernetes tolerations of the worker pods."""
    pod_labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels of the worker pods."""
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations of the worker pods."""
    pod_template: PodTemplate = Field(default_factory=PodTemplate)
    """The worker pods' template: scheduling (affinity, topology spread, priority class),
    registry credentials, ServiceAccount, volumes and the worker container's mounts,
    envFrom and resources. The fields above (``nodeSelector``, ``tolerations``,
    ``podLabels``, ``podAnnotations``, ``env``, ``resources``) are shorthands merged over
    it; the operator's own settings win over both."""

    @property
    def generator(self) -> GeneratorSource:
        """The source, which must be the generator (tests and tools that compute results)."""
        if not isinstance(self.source, GeneratorSource):
            raise ValueError(f"the job's source is {self.source.type!r}, not the generator")
        return self.source

    @field_validator("job")
    @classmethod
    def _check_entry_point(cls, job: str) -> str:
        if not re.match(_ENTRY_POINT, job):
            raise ValueError(f"job {job!r} is not 'module:attribute' (e.g. examples.counter:job)")
        return job

    @field_validator("side_outputs")
    @classmethod
    def _check_output_names(cls, outputs: dict[str, Any]) -> dict[str, Any]:
        bad = sorted(name for name in outputs if not re.match(_OUTPUT_NAME, name))
        if bad:
            raise ValueError(
                f"side output names {bad} are not valid: use lowercase letters, digits, '-' "
                "and '_' (at most 63 characters, starting and ending with a letter or digit)"
            )
        return outputs

    @model_validator(mode="after")
    def _check(self) -> StreamJobSpec:
        groups = self.key_groups
        if self.parallelism > groups:
            raise ValueError(
                f"parallelism ({self.parallelism}) must not exceed keyGroups ({groups}): "
                "each worker owns at least one key group"
            )
        scaler = self.autoscaler
        for name, value in [
            ("minParallelism", scaler.min_parallelism),
            ("maxParallelism", scaler.max_parallelism),
        ]:
            if value is not None and value > groups:
                raise ValueError(
                    f"autoscaler.{name} ({value}) must not exceed keyGroups ({groups})"
                )
        return self


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


_UNION_TAGS: Final = {"generator", "kafka", "log", "null"}


def _field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the manifest spells it: without the union tags
    (``source.generator.rate`` is ``source.rate`` in the manifest)."""
    parts = [
        str(p) for i, p in enumerate(loc)
        if not (p in _UNION_TAGS and i > 0 and (
            loc[i - 1] in ("source", "sink") or (i > 1 and loc[i - 2] == "sideOutputs")
        ))
    ]  # fmt: skip
    return ".".join(parts)


def validation_message(exc: ValidationError, prefix: str = "spec.") -> str:
    """One line per problem, naming the field as the manifest spells it: the message of
    the operator's ``InvalidSpec`` condition and of ``keyshift run``."""
    parts = []
    for err in exc.errors():
        where = _field_path(err["loc"])
        parts.append(f"{prefix}{where}: {err['msg']}" if where else err["msg"])
    return "; ".join(parts)


class InvalidSpec(KeyshiftError, ValueError):
    """A StreamJob spec that cannot run; the message says why, field by field."""


def validate_spec(raw: Any) -> StreamJobSpec:
    """The parsed spec; :class:`InvalidSpec` saying why it is invalid
    (:func:`validation_message`)."""
    try:
        return StreamJobSpec.model_validate(dict(raw))
    except ValidationError as exc:
        raise InvalidSpec(validation_message(exc)) from None


class DuplicateKeyError(KeyshiftError, yaml.YAMLError):
    """A mapping of the manifest gives a key twice."""


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (as kubectl does)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise DuplicateKeyError(f"key {key!r} is given twice (again on line {line})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """A manifest's YAML, as ``yaml.safe_load`` reads it but refusing duplicate keys."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader


def load_manifest(path: str | Path) -> StreamJob:
    return StreamJob.model_validate(parse_yaml(Path(path).read_text()))
