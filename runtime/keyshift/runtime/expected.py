"""The exact expected state of the example jobs, computed from the generator alone.

The generator makes record ``(kg, offset)`` a pure function of the seed, so the
state after a key group has processed offsets ``[0, n)`` is known without
running anything; fault tests compare the store against it for equality.
"""

from __future__ import annotations

from keyshift.runtime.api import encode_key
from keyshift.runtime.config import GeneratorSource
from keyshift.runtime.sources.generator import Generator

CHUNK = 10_000


def counter_state(
    source: GeneratorSource, key_groups: int, key_group: int, n: int
) -> dict[str, dict[str, int]]:
    """``examples/counter.py`` after offsets ``[0, n)`` of ``key_group``:
    ``{"count": {key: count}, "total": {key: sum of values}}``."""
    generator = Generator(source, key_groups, created_at=0.0)
    count: dict[str, int] = {}
    total: dict[str, int] = {}
    for start in range(0, n, CHUNK):
        for event in generator.read(key_group, start, min(n, start + CHUNK)):
            count[event.key] = count.get(event.key, 0) + 1
            total[event.key] = total.get(event.key, 0) + event.value
    return {"count": count, "total": total}


def counter_state_encoded(
    source: GeneratorSource, key_groups: int, key_group: int, n: int
) -> dict[str, dict[bytes, bytes]]:
    """The same, as the store holds it (msgpack keys and values)."""
    import msgspec

    encoder = msgspec.msgpack.Encoder()
    decoded = counter_state(source, key_groups, key_group, n)
    return {
        state: {encode_key(k): encoder.encode(v) for k, v in values.items()}
        for state, values in decoded.items()
    }
