"""What every Kafka client of keyshift shares: its librdkafka settings and the rule of one
partition per key group."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from keyshift.api.spec import InvalidSpec, KafkaClient

if TYPE_CHECKING:
    pass


ENV_PREFIX = "KEYSHIFT_KAFKA_"
POLL_SECONDS = 0.05
"""How long the consumer thread waits for records in one poll."""


def client_config(spec: KafkaClient, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """librdkafka settings: the spec's properties plus secrets from the environment
    (``KEYSHIFT_KAFKA_SASL_PASSWORD`` -> ``sasl.password``)."""
    env = os.environ if environ is None else environ
    config: dict[str, Any] = {"bootstrap.servers": spec.bootstrap_servers, **spec.properties}
    for name, value in env.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            config[name[len(ENV_PREFIX) :].lower().replace("_", ".")] = value
    return config


def check_partitions(topic: str, partitions: int, key_groups: int) -> None:
    """:class:`InvalidSpec` unless the topic has one partition per key group."""
    if partitions != key_groups:
        raise InvalidSpec(
            f"Kafka topic {topic!r} has {partitions} partitions but the job has {key_groups} "
            "key groups: a Kafka job reads one partition per key group, so keyGroups must "
            "equal the partition count (fixed for the life of the job)"
        )
