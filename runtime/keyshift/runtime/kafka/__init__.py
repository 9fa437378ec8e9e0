"""Kafka through confluent-kafka (librdkafka), imported only by jobs that use it:

| module | what |
|---|---|
| :mod:`.source` | the source: one key group per partition, positions kept with the state |
| :mod:`.sink` | the sink and the dead letters: an idempotent producer, flushed per key group |
| :mod:`.client` | what every client shares: librdkafka settings, one partition per key group |
| :mod:`.admin` | topics for tests and benchmarks: create one, fill it with generated records |

Secrets never come from the manifest: ``KEYSHIFT_KAFKA_SASL_PASSWORD`` in the
environment sets ``sasl.password``, and so on for any property (:func:`.client.client_config`).
"""
