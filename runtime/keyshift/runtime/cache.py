"""The worker's write-back state cache: LRU, bounded in bytes, shared by key groups.

Entries are ``(key_group, state, key) -> value`` where ``value`` is the stored
bytes or ``None`` (known absent), all in one LRU.  Dirty entries (written since
the key group's last commit) are also listed per key group and are never
evicted: they stop being dirty only through a successful commit
(:meth:`committed`) or when the key group is dropped (:meth:`drop`).  When the
dirty bytes pass ``dirty_limit`` the owner must checkpoint
(:attr:`needs_checkpoint`).

The cache never loads anything itself: the runtime asks which keys are
:meth:`missing`, loads them in one ``get_many`` per state, and :meth:`fill`\\ s
them in.  Eviction runs after a fill (sparing the entries the current batch
just touched: they are the most recently used) and after a write.

Collections (maps, lists) are cached per entry like values: the slot of
entry ``e`` of key ``k`` is ``(key_group, state, k + e)``.  To iterate a map
the runtime also caches its *listing*, the entry keys the key has (the store's
plus the uncommitted writes), under ``(key_group, LISTING + state, k)``: derived,
never dirty, kept up to date by :meth:`listing_write`, evicted like an entry.

The bound: ``total_bytes <= max_bytes`` after every operation, except that
dirty entries are never evicted (if they alone pass the bound, no clean entry
remains) and that a fill keeps the ``protect`` most recent entries it was told
to keep.  A runtime read of an entry evicted meanwhile is a :class:`CacheMiss`:
the runtime loads it again.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Final

ENTRY_OVERHEAD = 240
"""Bytes charged per entry on top of key and value: the slot tuple, the dict and LRU
nodes, the per-key-group index slot, the bytes headers (measured with tracemalloc on
CPython 3.11: ~230)."""

LISTING_KEY_OVERHEAD = 72
"""Bytes charged per entry key of a listing on top of its length (the bytes header and
the set's slot)."""

LISTING = "#"
"""Prefix of a listing's state name in its slot (state names cannot hold it)."""

Slot = tuple[int, str, bytes]


class Listing:
    """The entry keys one key has in one collection state, as this worker knows them."""

    __slots__ = ("_sorted", "keys", "nbytes")

    def __init__(self, keys: set[bytes]) -> None:
        self.keys = keys
        self.nbytes = sum(len(k) for k in keys) + LISTING_KEY_OVERHEAD * len(keys)
        self._sorted: list[bytes] | None = None

    def sorted(self) -> list[bytes]:
        """The keys in byte order (kept until the listing changes; do not modify it)."""
        if self._sorted is None:
            self._sorted = sorted(self.keys)
        return self._sorted

    def change(self, entry: bytes, present: bool) -> int:
        """Add or remove ``entry``; the change in :attr:`nbytes`."""
        keys = self.keys
        if present == (entry in keys):
            return 0
        self._sorted = None
        size = len(entry) + LISTING_KEY_OVERHEAD
        if present:
            keys.add(entry)
        else:
            keys.discard(entry)
            size = -size
        self.nbytes += size
        return size


Value = bytes | None | Listing


def entry_size(key: bytes, value: Value) -> int:
    if value is None:
        return ENTRY_OVERHEAD + len(key)
    if type(value) is Listing:
        return ENTRY_OVERHEAD + len(key) + value.nbytes
    return ENTRY_OVERHEAD + len(key) + len(value)  # type: ignore[arg-type]


class CacheMiss(Exception):
    """A state was read that the runtime did not load first (a runtime bug)."""


class StateCache:
    def __init__(self, max_bytes: int, *, dirty_fraction: float = 0.5) -> None:
        if max_bytes <= 0:
            raise ValueError("the cache needs a positive byte bound")
        self.max_bytes = max_bytes
        self.dirty_limit = max(1, int(max_bytes * dirty_fraction))
        self._entries: OrderedDict[Slot, Value] = OrderedDict()
        """Every entry, clean or dirty, least recently used first: one lookup finds any,
        and a write or a commit moves nothing between structures."""
        self._by_kg: dict[int, set[Slot]] = {}
        """The slots of each key group, so that :meth:`drop` costs what the key group has
        cached, not what the whole cache holds."""
        self._dirty: dict[int, dict[Slot, None]] = {}
        """The dirty slots of each key group (an ordered set)."""
        self._dirty_count = 0
        self.clean_bytes = 0
        self.dirty_bytes = 0
        self._dirty_bytes_by_kg: dict[int, int] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    # -- sizes ----------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.dirty_bytes

    @property
    def needs_checkpoint(self) -> bool:
        return self.dirty_bytes >= self.dirty_limit

    def dirty_bytes_of(self, key_group: int) -> int:
        return self._dirty_bytes_by_kg.get(key_group, 0)

    def __len__(self) -> int:
        return len(self._entries)

    # -- reads ------------------------------------------------------------------

    def get(self, key_group: int, state: str, key: bytes) -> bytes | None:
        """The cached value (``None``: absent in the store); raise :class:`CacheMiss`."""
        found = self._entries.get((key_group, state, key), MISSING)
        if found is MISSING:
            raise CacheMiss((key_group, state, key))
        return found  # type: ignore[return-value]  # a listing's slot is never asked

    def find(self, key_group: int, state: str, key: bytes) -> bytes | _Missing | None:
        """:meth:`get`, answering :data:`MISSING` instead of raising."""
        return self._entries.get((key_group, state, key), MISSING)  # type: ignore[return-value]

    def is_dirty(self, key_group: int, state: str, key: bytes) -> bool:
        """Whether the cache holds an uncommitted write of this slot."""
        dirty = self._dirty.get(key_group)
        return dirty is not None and (key_group, state, key) in dirty

    def contains(self, key_group: int, state: str, key: bytes) -> bool:
        return (key_group, state, key) in self._entries

    def missing(
        self,
        key_group: int,
        state: str,
        keys: Collection[bytes],
        *,
        repeats: int = 0,
        count: bool = True,
    ) -> list[bytes]:
        """Keys not cached, in first-seen order; touches (and counts) the cached ones.

        Each key counts one hit or one miss per call. ``repeats``: how many reads the
        (distinct) ``keys`` stand for, when more than one each: the others count as
        hits (they find what the first loaded).  ``count=False``: a second look that
        counts nothing.
        """
        entries = self._entries
        touch = entries.move_to_end
        out: list[bytes] = []
        seen: set[bytes] = set()
        hits = 0
        for key in keys:
            slot = (key_group, state, key)
            if slot in entries:
                touch(slot)
                hits += 1
            elif key in seen:
                hits += 1  # loaded by the same fetch
            else:
                seen.add(key)
                out.append(key)
        if count:
            self.hits += hits + max(0, repeats - len(keys))
            self.misses += len(out)
        return out

    def fill(
        self,
        key_group: int,
        state: str,
        requested: Collection[bytes],
        found: Mapping[bytes, bytes],
        *,
        protect: int = 0,
    ) -> None:
        """Insert loaded entries (absent ones as ``None``), then evict down to the bound.

        ``protect``: how many most recently used clean entries eviction must spare
        (the current batch's working set).
        """
        entries = self._entries
        dirty = self._dirty.get(key_group) or {}
        index = self._by_kg.setdefault(key_group, set())
        added = 0
        for key in requested:
            slot = (key_group, state, key)
            if slot in dirty:
                continue  # written meanwhile: the dirty value is newer
            value = found.get(key)
            old = entries.pop(slot, MISSING)
            if old is MISSING:
                index.add(slot)
            else:
                added -= entry_size(key, old)
            entries[slot] = value
            added += entry_size(key, value)
        self.clean_bytes += added
        self.evict(protect=protect)

    def evict(self, *, protect: int = 0) -> None:
        """Drop least recently used clean entries until within the bound (dirty ones met
        on the way become the most recent: they cannot go)."""
        entries = self._entries
        dirty = self._dirty
        while self.clean_bytes + self.dirty_bytes > self.max_bytes and (
            len(entries) - self._dirty_count > protect
        ):
            slot, value = entries.popitem(last=False)
            kg_dirty = dirty.get(slot[0])
            if kg_dirty is not None and slot in kg_dirty:
                entries[slot] = value
                continue
            self.clean_bytes -= entry_size(slot[2], value)
            self._unindex(slot)
            self.evictions += 1

    # -- writes -------------------------------------------------------------------

    def put(self, key_group: int, state: str, key: bytes, value: bytes | None) -> None:
        """Write (``None``: delete) a value; it stays dirty until committed."""
        self.put_key(key_group, key, {state: value})

    def put_key(self, key_group: int, key: bytes, values: Mapping[str, bytes | None]) -> None:
        """:meth:`put` of one key's values of several states (the end of a batch; the hot
        path: :func:`entry_size` inlined)."""
        entries = self._entries
        dirty = self._dirty.get(key_group)
        if dirty is None:
            dirty = self._dirty[key_group] = {}
        key_cost = ENTRY_OVERHEAD + len(key)
        size = clean_freed = 0
        for state, value in values.items():
            slot = (key_group, state, key)
            old = entries.get(slot, MISSING)
            entries[slot] = value
            entries.move_to_end(slot)
            size += len(value) if value is not None else 0
            if slot in dirty:
                size -= len(old or b"") if old is not MISSING else 0  # type: ignore[arg-type]
            else:
                dirty[slot] = None
                self._dirty_count += 1
                size += key_cost
                if old is MISSING:
                    self._by_kg.setdefault(key_group, set()).add(slot)
                else:
                    clean_freed += key_cost + len(old or b"")  # type: ignore[arg-type]
        self.clean_bytes -= clean_freed
        if size:
            self.dirty_bytes += size
            by_kg = self._dirty_bytes_by_kg
            by_kg[key_group] = by_kg.get(key_group, 0) + size
        if self.clean_bytes + self.dirty_bytes > self.max_bytes:
            self.evict()

    def dirty_changes(
        self, key_group: int
    ) -> tuple[dict[str, dict[bytes, bytes]], dict[str, list[bytes]]]:
        """The key group's uncommitted ``(puts, deletes)`` per state name."""
        puts: dict[str, dict[bytes, bytes]] = {}
        deletes: dict[str, list[bytes]] = {}
        entries = self._entries
        for slot in self._dirty.get(key_group) or ():
            _, state, key = slot
            value = entries[slot]
            if value is None:
                deletes.setdefault(state, []).append(key)
            else:
                puts.setdefault(state, {})[key] = value  # type: ignore[assignment]
        return puts, deletes

    def committed(self, key_group: int) -> None:
        """The dirty entries of ``key_group`` are durable now: make them clean."""
        dirty = self._dirty.pop(key_group, None)
        if not dirty:
            return
        moved = self._dirty_bytes_by_kg.pop(key_group, 0)
        self.dirty_bytes -= moved
        self.clean_bytes += moved
        self._dirty_count -= len(dirty)
        self.evict()

    def drop(self, key_group: int) -> None:
        """Forget everything of ``key_group``, dirty entries included (fenced or released)."""
        dirty = self._dirty.pop(key_group, None) or {}
        self._dirty_count -= len(dirty)
        self.dirty_bytes -= self._dirty_bytes_by_kg.pop(key_group, 0)
        entries = self._entries
        for slot in self._by_kg.pop(key_group, ()):
            value = entries.pop(slot)
            if slot not in dirty:
                self.clean_bytes -= entry_size(slot[2], value)

    # -- listings --------------------------------------------------------------------

    def listing(self, key_group: int, state: str, key: bytes) -> Listing | None:
        """The cached listing of ``key``'s entries in ``state`` (touched), or None."""
        slot = (key_group, LISTING + state, key)
        found = self._entries.get(slot)
        if found is None:
            return None
        self._entries.move_to_end(slot)
        return found  # type: ignore[return-value]

    def put_listing(
        self, key_group: int, state: str, key: bytes, entries: set[bytes], *, protect: int = 0
    ) -> None:
        """Cache a listing (clean), then evict down to the bound, sparing it and the
        ``protect`` most recent entries before it."""
        slot = (key_group, LISTING + state, key)
        listing = Listing(entries)
        old = self._entries.pop(slot, MISSING)
        if old is MISSING:
            self._by_kg.setdefault(key_group, set()).add(slot)
        else:
            self.clean_bytes -= entry_size(key, old)
        self._entries[slot] = listing
        self.clean_bytes += entry_size(key, listing)
        self.evict(protect=protect + 1)

    def listing_write(
        self, key_group: int, state: str, key: bytes, entry: bytes, present: bool
    ) -> None:
        """Entry ``entry`` of ``key`` was written (``present``) or deleted: keep a cached
        listing of the key true."""
        listing = self._entries.get((key_group, LISTING + state, key))
        if listing is not None:
            self.clean_bytes += listing.change(entry, present)  # type: ignore[union-attr]

    def dirty_entries(
        self, key_group: int, state: str, key: bytes
    ) -> list[tuple[bytes, bytes | None]]:
        """The uncommitted entries of ``key`` in ``state``: ``(entry key, value)`` pairs
        (a scan of the key group's dirty entries: when a listing is built)."""
        start = len(key)
        entries = self._entries
        return [
            (slot[2][start:], entries[slot])  # type: ignore[misc]
            for slot in self._dirty.get(key_group) or ()
            if slot[1] == state and len(slot[2]) > start and slot[2].startswith(key)
        ]

    # -- the per-key-group index ----------------------------------------------------

    def _unindex(self, slot: Slot) -> None:
        slots = self._by_kg.get(slot[0])
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._by_kg[slot[0]]


class _Missing(enum.Enum):
    """Not cached (as opposed to ``None``: cached as absent from the store)."""

    MISSING = enum.auto()


MISSING: Final = _Missing.MISSING
