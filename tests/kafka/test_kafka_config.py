"""Kafka settings in the manifest: what is refused, and how secrets reach the client."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from keyshift.api.spec import KafkaSource, StreamJobSpec
from keyshift.runtime.kafka.client import client_config
from keyshift.runtime.kafka.sink import key_bytes
from keyshift.runtime.kafka.source import partition_change


def spec(**source: Any) -> StreamJobSpec:
    return StreamJobSpec.model_validate({
        "job": "examples.counter:job",
        "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "in", **source},
    })  # fmt: skip


def test_a_kafka_source_is_chosen_by_type_and_a_source_without_type_is_the_generator() -> None:
    assert isinstance(spec().source, KafkaSource)
    plain = StreamJobSpec.model_validate({"job": "a:b", "source": {"keys": 5}})
    assert plain.generator.keys == 5
    with pytest.raises(ValueError, match="source is 'kafka', not the generator"):
        _ = spec().generator


def test_dead_letter_needs_a_topic() -> None:
    with pytest.raises(
        ValidationError, match=r"onPoison dead-letter needs source\.deadLetterTopic"
    ):
        spec(onPoison="dead-letter")
    source = spec(onPoison="dead-letter", deadLetterTopic="dlq").source
    assert isinstance(source, KafkaSource) and source.dead_letter_topic == "dlq"


def test_secrets_in_kafka_properties_are_refused_with_where_to_put_them() -> None:
    with pytest.raises(ValidationError, match=r"\['sasl.password'\] hold secrets.*KEYSHIFT_KAFKA_"):
        spec(properties={"sasl.password": "hunter2", "sasl.mechanism": "PLAIN"})


def test_secrets_come_from_the_environment() -> None:
    source = spec(properties={"security.protocol": "SASL_SSL"}).source
    assert isinstance(source, KafkaSource)
    config = client_config(source, {"KEYSHIFT_KAFKA_SASL_PASSWORD": "pw", "HOME": "/x"})
    assert config == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "SASL_SSL",
        "sasl.password": "pw",
    }


def test_side_output_names_are_checked() -> None:
    with pytest.raises(ValidationError, match=r"side output names \['Late!'\] are not valid"):
        StreamJobSpec.model_validate({"job": "a:b", "sideOutputs": {"Late!": {"type": "null"}}})


def test_message_keys_from_record_keys() -> None:
    assert key_bytes("user-1") == b"user-1"
    assert key_bytes(b"\x00") == b"\x00"
    assert key_bytes(None) is None
    assert key_bytes(7) == b"\x07"  # msgpack of anything else


def test_a_changed_partition_count_is_reported_not_followed() -> None:
    # the test broker cannot add partitions (no CreatePartitions): the decision is pure
    assert partition_change("orders", 8, 8) is None
    assert partition_change("orders", 12, 8) == (
        "topic 'orders' now has 12 partitions; the job keeps reading the 8 it started with "
        "(the count is fixed for the life of the job)"
    )
