"""The per-record context: writes reach the cache once per batch, decoded values are
shared only where nothing can change them in place."""

from __future__ import annotations

from typing import Any

import msgspec

from keyshift.runtime.api import ValueState, encode_key
from keyshift.runtime.cache import StateCache
from keyshift.runtime.keygroup import RecordContext

COUNT = ValueState("count", int, default=0)
RATIO = ValueState("ratio", float, default=0.0)
ITEMS = ValueState("items", list[int], default=None)
KEY = "k"
KB = encode_key(KEY)


def context(*states: ValueState[Any]) -> tuple[RecordContext, StateCache]:
    cache = StateCache(1 << 20)
    for spec in states:
        cache.fill(0, spec.name, [KB], {})
    return RecordContext(0, cache, [s.name for s in states]), cache


def record(ctx: RecordContext, offset: int) -> None:
    ctx.begin(KEY, KB, offset)


def test_writes_reach_the_cache_at_the_end_of_the_batch_and_reads_see_them_before() -> None:
    ctx, cache = context(COUNT)
    ctx.new_batch()
    for offset in range(3):
        record(ctx, offset)
        count = ctx.state(COUNT)
        count.update(count.value() + 1)
        ctx.apply()
    assert cache.get(0, "count", KB) is None  # not yet: one put per key and batch
    record(ctx, 3)
    assert ctx.state(COUNT).value() == 3
    ctx.flush()
    assert cache.get(0, "count", KB) == msgspec.msgpack.encode(3)
    assert cache.dirty_changes(0) == ({"count": {KB: msgspec.msgpack.encode(3)}}, {})


def test_a_failed_records_writes_are_forgotten() -> None:
    ctx, cache = context(COUNT)
    ctx.new_batch()
    record(ctx, 0)
    ctx.state(COUNT).update(5)
    ctx.apply()
    record(ctx, 1)
    ctx.state(COUNT).update(99)  # the record then fails: not applied
    record(ctx, 2)
    assert ctx.state(COUNT).value() == 5
    ctx.flush()
    assert cache.get(0, "count", KB) == msgspec.msgpack.encode(5)


def test_a_mutable_value_changed_in_place_without_update_changes_nothing() -> None:
    ctx, cache = context(ITEMS)
    ctx.new_batch()
    record(ctx, 0)
    ctx.state(ITEMS).update([1])
    ctx.apply()
    record(ctx, 1)
    items = ctx.state(ITEMS).value()
    assert items == [1]
    items.append(2)  # no update
    record(ctx, 2)
    assert ctx.state(ITEMS).value() == [1]
    ctx.flush()
    assert cache.get(0, "items", KB) == msgspec.msgpack.encode([1])


def test_a_value_of_another_type_reads_back_as_decoding_gives_it() -> None:
    """An int written to a float state reads 2.0 in the same batch, as after a reload:
    a replay from the store sees the same value, so outputs do not depend on batches."""
    ctx, _ = context(RATIO)
    ctx.new_batch()
    record(ctx, 0)
    ctx.state(RATIO).update(2)
    ctx.apply()
    record(ctx, 1)
    value = ctx.state(RATIO).value()
    assert value == 2.0 and type(value) is float


def test_a_cleared_value_reads_as_the_default_and_is_deleted() -> None:
    ctx, cache = context(COUNT)
    cache.fill(0, "count", [KB], {KB: msgspec.msgpack.encode(7)})
    ctx.new_batch()
    record(ctx, 0)
    assert ctx.state(COUNT).value() == 7
    ctx.state(COUNT).clear()
    ctx.apply()
    record(ctx, 1)
    assert ctx.state(COUNT).value() == 0
    ctx.flush()
    assert cache.dirty_changes(0) == ({}, {"count": [KB]})
