"""The per-record context: writes go into the cache's entries and are undone if the
record fails; values of immutable types are kept decoded and encoded at commit; others
are decoded on every read, so nothing changes them in place."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

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
    ctx = RecordContext(0, cache, list(states))
    for spec in states:
        cache.fill(0, spec.name, [KB], {})
    return ctx, cache


def record(ctx: RecordContext, offset: int) -> None:
    ctx.begin(KEY, KB, offset)


def test_writes_are_read_by_the_next_records_and_encoded_once_at_commit() -> None:
    ctx, cache = context(COUNT)
    for offset in range(3):
        record(ctx, offset)
        count = ctx.state(COUNT)
        count.update(count.value() + 1)
    record(ctx, 3)
    assert ctx.state(COUNT).value() == 3
    assert cache.dirty_bytes == 0  # accounted at the end of the batch
    ctx.flush()
    assert cache.is_dirty(0, "count", KB) and cache.dirty_bytes > 0
    assert cache.get(0, "count", KB) == 3  # kept decoded
    assert cache.dirty_changes(0) == ({"count": {KB: msgspec.msgpack.encode(3)}}, {})
    cache.committed(0)
    assert cache.dirty_changes(0) == ({}, {}) and cache.dirty_bytes == 0


def test_a_failed_records_writes_are_undone() -> None:
    ctx, cache = context(COUNT)
    record(ctx, 0)
    ctx.state(COUNT).update(5)
    ctx.flush()
    cache.committed(0)  # 5 is durable: the entry is clean
    record(ctx, 1)
    ctx.state(COUNT).update(99)  # the record then fails
    ctx.rollback()
    ctx.flush()
    assert not cache.is_dirty(0, "count", KB) and cache.dirty_bytes == 0
    record(ctx, 2)
    assert ctx.state(COUNT).value() == 5
    assert cache.dirty_changes(0) == ({}, {})


def test_a_failed_record_keeps_the_batchs_earlier_writes() -> None:
    ctx, cache = context(COUNT)
    record(ctx, 0)
    ctx.state(COUNT).update(5)
    record(ctx, 1)
    ctx.state(COUNT).update(6)
    ctx.state(COUNT).update(7)
    ctx.rollback()
    ctx.flush()
    assert cache.dirty_changes(0) == ({"count": {KB: msgspec.msgpack.encode(5)}}, {})


def test_a_mutable_value_changed_in_place_without_update_changes_nothing() -> None:
    ctx, cache = context(ITEMS)
    record(ctx, 0)
    ctx.state(ITEMS).update([1])
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
    record(ctx, 0)
    ctx.state(RATIO).update(2)
    record(ctx, 1)
    value = ctx.state(RATIO).value()
    assert value == 2.0 and type(value) is float


def test_a_value_the_state_cannot_hold_fails_the_update_and_writes_nothing() -> None:
    ctx, cache = context(COUNT)
    record(ctx, 0)
    with pytest.raises(msgspec.ValidationError):
        ctx.state(COUNT).update("seven")
    ctx.flush()
    assert cache.dirty_changes(0) == ({}, {})


def test_a_cleared_value_reads_as_the_default_and_is_deleted() -> None:
    ctx, cache = context(COUNT)
    cache.fill(0, "count", [KB], {KB: msgspec.msgpack.encode(7)})
    record(ctx, 0)
    assert ctx.state(COUNT).value() == 7
    ctx.state(COUNT).clear()
    record(ctx, 1)
    assert ctx.state(COUNT).value() == 0
    ctx.flush()
    assert cache.dirty_changes(0) == ({}, {"count": [KB]})


def test_a_stored_value_the_state_cannot_decode_is_corrupt_state_when_read() -> None:
    from keyshift.runtime.api import CorruptState

    ctx, cache = context(COUNT)
    cache.fill(0, "count", [KB], {KB: msgspec.msgpack.encode("not a number")})
    record(ctx, 0)
    with pytest.raises(CorruptState) as raised:
        ctx.state(COUNT).value()
    assert raised.value.state == "count" and raised.value.raw == msgspec.msgpack.encode(
        "not a number"
    )
