"""The write-back cache: LRU within a byte bound; dirty entries are never evicted."""

from __future__ import annotations

import tracemalloc

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from keyshift.runtime.api import ValueState, encode_key
from keyshift.runtime.cache import CacheMiss, Entry, StateCache, entry_size


def test_loaded_entries_are_hits_and_absent_keys_are_remembered() -> None:
    cache = StateCache(10_000)
    assert cache.missing(0, "count", [b"a", b"b", b"a"]) == [b"a", b"b"]
    cache.fill(0, "count", [b"a", b"b"], {b"a": b"1"})
    assert cache.get(0, "count", b"a") == b"1"
    assert cache.get(0, "count", b"b") is None  # known absent: no second load
    assert cache.missing(0, "count", [b"a", b"b"]) == []
    assert (cache.hits, cache.misses) == (3, 2)
    try:
        cache.get(1, "count", b"a")
    except CacheMiss:
        pass
    else:
        raise AssertionError("another key group's entry must not be visible")


def test_a_batchs_keys_are_looked_up_once_each_with_their_entries_in_order() -> None:
    """A batch's keys, repeats included: each missing value listed once per state, each
    key's entry found in its place, and one hit or miss per key and state (a repeat of a
    missing key is a hit: the same fetch loads it)."""
    cache = StateCache(10_000)
    cache.fill(0, "a", [b"both", b"only-a"], {b"both": b"1", b"only-a": b"2"})
    cache.fill(0, "b", [b"both"], {b"both": b"3"})
    both, only_a = cache.entry(0, b"both"), cache.entry(0, b"only-a")
    found: list[Entry | None] = []
    keys = [b"both", b"only-a", b"new", b"both", b"only-a", b"new"]
    missing = cache.missing_states(0, ["a", "b"], keys, found=found)
    assert missing == [[b"new"], [b"only-a", b"new"]]
    assert found == [both, only_a, None, both, only_a, None]
    assert (cache.hits, cache.misses) == (2 + 1 + 0 + 2 + 2 + 2, 0 + 1 + 2 + 0 + 0 + 0)


def test_least_recently_used_clean_entries_go_first() -> None:
    size = entry_size(b"k0", b"v")
    cache = StateCache(3 * size)
    for key in (b"k0", b"k1", b"k2"):
        cache.fill(0, "s", [key], {key: b"v"})
    cache.missing(0, "s", [b"k0"])  # touch k0: k1 is now the oldest
    cache.fill(0, "s", [b"k3"], {b"k3": b"v"})
    assert not cache.contains(0, "s", b"k1")
    assert all(cache.contains(0, "s", k) for k in (b"k0", b"k2", b"k3"))
    assert cache.total_bytes <= cache.max_bytes


def test_dirty_entries_survive_eviction_until_committed() -> None:
    size = entry_size(b"k0", b"v")
    cache = StateCache(4 * size, dirty_fraction=0.5)
    cache.put(0, "s", b"d0", b"v")
    cache.put(0, "s", b"d1", b"v")
    assert cache.needs_checkpoint
    for i in range(10):  # plenty of clean traffic
        key = f"k{i}".encode()
        cache.fill(0, "s", [key], {key: b"v"})
    assert cache.get(0, "s", b"d0") == b"v"
    assert cache.get(0, "s", b"d1") == b"v"
    puts, deletes = cache.dirty_changes(0)
    assert puts == {"s": {b"d0": b"v", b"d1": b"v"}} and deletes == {}
    cache.committed(0)
    assert cache.dirty_bytes == 0 and not cache.needs_checkpoint
    assert cache.total_bytes <= cache.max_bytes


def test_deletes_are_dirty_until_committed_and_drop_forgets_a_key_group() -> None:
    cache = StateCache(100_000)
    cache.fill(3, "s", [b"a"], {b"a": b"1"})
    cache.put(3, "s", b"a", None)
    assert cache.get(3, "s", b"a") is None
    assert cache.dirty_changes(3) == ({}, {"s": [b"a"]})
    cache.put(4, "s", b"x", b"2")
    cache.drop(3)
    assert not cache.contains(3, "s", b"a")
    assert cache.dirty_changes(3) == ({}, {})
    assert cache.get(4, "s", b"x") == b"2"
    assert cache.dirty_bytes == cache.dirty_bytes_of(4) == entry_size(b"x", b"2")


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["load", "put", "delete", "commit", "drop"]),
            st.integers(0, 2),
            st.integers(0, 30),
            st.binary(max_size=40),
        ),
        max_size=200,
    ),
    bound=st.integers(200, 3000),
)
def test_model_never_loses_a_dirty_write_and_keeps_the_bound(
    ops: list[tuple[str, int, int, bytes]], bound: int
) -> None:
    """Against a model: every uncommitted write stays readable, clean bytes stay bounded."""
    cache = StateCache(bound, dirty_fraction=1.0)
    dirty: dict[tuple[int, bytes], bytes | None] = {}
    durable: dict[tuple[int, bytes], bytes] = {}  # what a store would hold
    seen: set[tuple[int, bytes]] = set()
    for op, kg, n, value in ops:
        key = b"k%d" % n
        seen.add((kg, key))
        if op == "load":
            for k in cache.missing(kg, "s", [key]):
                found = {k: durable[(kg, k)]} if (kg, k) in durable else {}
                cache.fill(kg, "s", [k], found)
            # loaded, or dirty: readable either way
            expected = dirty.get((kg, key), durable.get((kg, key)))
            if cache.contains(kg, "s", key):
                assert cache.get(kg, "s", key) == expected
        elif op in ("put", "delete"):
            v = value if op == "put" else None
            cache.put(kg, "s", key, v)
            dirty[(kg, key)] = v
        elif op == "commit":
            puts, deletes = cache.dirty_changes(kg)
            for k, v in puts.get("s", {}).items():
                durable[(kg, k)] = v
            for k in deletes.get("s", []):
                durable.pop((kg, k), None)
            cache.committed(kg)
            dirty = {dk: dv for dk, dv in dirty.items() if dk[0] != kg}
        else:
            cache.drop(kg)
            dirty = {dk: dv for dk, dv in dirty.items() if dk[0] != kg}
            assert not any(cache.contains(skg, "s", k) for skg, k in seen if skg == kg)
        for (dkg, dkey), dvalue in dirty.items():
            assert cache.get(dkg, "s", dkey) == dvalue
        assert cache.clean_bytes <= max(0, bound - cache.dirty_bytes) or cache.clean_bytes == 0
        assert cache.dirty_bytes == sum(entry_size(k, v) for (_, k), v in dirty.items())


def test_the_bytes_charged_are_what_the_entries_take() -> None:
    """``cacheBytes`` bounds the worker's memory only if what the cache charges is what its
    entries take: within a third, measured with tracemalloc, for a key with two decoded
    numbers (the counter) and for a key with one stored value."""
    count = ValueState("count", int, default=0)
    total = ValueState("total", int, default=0)
    n = 20_000
    for states in ([count, total], [ValueState("raw", list[int])]):
        cache = StateCache(1 << 34)
        for spec in states:
            decoded = spec.kept_decoded
            cache.register(
                spec.name,
                encode=msgspec.msgpack.encode if decoded else None,
                decode=spec.decode_value if decoded else None,
            )
        values = [msgspec.msgpack.encode(i * 1000 if spec.kept_decoded else [i]) for i in range(n)]
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for spec in states:
                keys = [encode_key(f"key-{i}") for i in range(n)]  # held by the cache alone
                cache.fill(0, spec.name, keys, dict(zip(keys, values, strict=True)))
                del keys
            taken = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert 0.75 <= taken / cache.total_bytes <= 1.33, (states, taken / n, cache.total_bytes / n)
