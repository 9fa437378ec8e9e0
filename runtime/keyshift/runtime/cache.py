"""The worker's write-back state cache: LRU, bounded in bytes, shared by key groups.

Entries are ``(key_group, state, key) -> value`` where ``value`` is the stored
bytes or ``None`` (known absent).  Clean entries sit in one LRU; dirty entries
(written since the key group's last commit) sit apart, per key group, and are
never evicted: they leave the dirty set only through a successful commit
(:meth:`committed`) or when the key group is dropped (:meth:`drop`).  When the
dirty bytes pass ``dirty_limit`` the owner must checkpoint
(:attr:`needs_checkpoint`).

The cache never loads anything itself: the runtime asks which keys are
:meth:`missing`, loads them in one ``get_many`` per state, and :meth:`fill`\\ s
them in.  Eviction runs after a fill (sparing the entries the current batch
just touched: they are the most recently used) and after a write.

The bound: ``total_bytes <= max_bytes`` after every operation, except that
dirty entries are never evicted (if they alone pass the bound, no clean entry
remains) and that a fill keeps the ``protect`` most recent entries it was told
to keep.  A runtime read of an entry evicted meanwhile is a :class:`CacheMiss`:
the runtime loads it again.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from typing import Final

ENTRY_OVERHEAD = 240
"""Bytes charged per entry on top of key and value: the slot tuple, the dict and LRU
nodes, the per-key-group index slot, the bytes headers (measured with tracemalloc on
CPython 3.11: ~230)."""

Slot = tuple[int, str, bytes]


def entry_size(key: bytes, value: bytes | None) -> int:
    return ENTRY_OVERHEAD + len(key) + (0 if value is None else len(value))


class CacheMiss(KeyError):
    """A state was read that the runtime did not load first (a runtime bug)."""


class StateCache:
    def __init__(self, max_bytes: int, *, dirty_fraction: float = 0.5) -> None:
        if max_bytes <= 0:
            raise ValueError("the cache needs a positive byte bound")
        self.max_bytes = max_bytes
        self.dirty_limit = max(1, int(max_bytes * dirty_fraction))
        self._clean: OrderedDict[Slot, bytes | None] = OrderedDict()
        self._clean_by_kg: dict[int, set[Slot]] = {}
        """The clean slots of each key group, so that :meth:`drop` costs what the key
        group has cached, not what the whole cache holds."""
        self._dirty: dict[int, dict[tuple[str, bytes], bytes | None]] = {}
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
        return len(self._clean) + sum(len(d) for d in self._dirty.values())

    # -- reads ------------------------------------------------------------------

    def get(self, key_group: int, state: str, key: bytes) -> bytes | None:
        """The cached value (``None``: absent in the store); raise :class:`CacheMiss`."""
        dirty = self._dirty.get(key_group)
        if dirty is not None:
            found = dirty.get((state, key), _MISSING)
            if found is not _MISSING:
                return found
        found = self._clean.get((key_group, state, key), _MISSING)
        if found is _MISSING:
            raise CacheMiss((key_group, state, key))
        return found

    def contains(self, key_group: int, state: str, key: bytes) -> bool:
        dirty = self._dirty.get(key_group)
        if dirty is not None and (state, key) in dirty:
            return True
        return (key_group, state, key) in self._clean

    def missing(self, key_group: int, state: str, keys: Iterable[bytes]) -> list[bytes]:
        """Keys not cached, in first-seen order; touches (and counts) the cached ones.

        Each key counts one hit or one miss per call.
        """
        dirty = self._dirty.get(key_group) or {}
        clean = self._clean
        out: list[bytes] = []
        seen: set[bytes] = set()
        hits = 0
        for key in keys:
            if (state, key) in dirty:
                hits += 1
                continue
            slot = (key_group, state, key)
            if slot in clean:
                clean.move_to_end(slot)
                hits += 1
            elif key in seen:
                hits += 1  # loaded by the same fetch
            else:
                seen.add(key)
                out.append(key)
        self.hits += hits
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
        dirty = self._dirty.get(key_group) or {}
        for key in requested:
            if (state, key) in dirty:
                continue  # written meanwhile: the dirty value is newer
            slot = (key_group, state, key)
            self._forget_clean(slot)
            self._remember_clean(slot, found.get(key))
        self.evict(protect=protect)

    def evict(self, *, protect: int = 0) -> None:
        """Drop least recently used clean entries until within the bound."""
        clean = self._clean
        while self.total_bytes > self.max_bytes and len(clean) > protect:
            slot, value = clean.popitem(last=False)
            self.clean_bytes -= entry_size(slot[2], value)
            self._unindex(slot)
            self.evictions += 1

    # -- writes -------------------------------------------------------------------

    def put(self, key_group: int, state: str, key: bytes, value: bytes | None) -> None:
        """Write (``None``: delete) a value; it stays dirty until committed."""
        # the hot path: one record's write; inlined _forget_clean and entry_size
        clean_value = self._clean.pop((key_group, state, key), _MISSING)
        if clean_value is not _MISSING:
            self.clean_bytes -= ENTRY_OVERHEAD + len(key) + len(clean_value or b"")
            self._unindex((key_group, state, key))
        dirty = self._dirty.get(key_group)
        if dirty is None:
            dirty = self._dirty[key_group] = {}
        slot = (state, key)
        previous = dirty.get(slot, _MISSING)
        size = len(value) if value is not None else 0
        if previous is _MISSING:
            size += ENTRY_OVERHEAD + len(key)
        else:
            size -= len(previous or b"")
        dirty[slot] = value
        if size:
            self.dirty_bytes += size
            by_kg = self._dirty_bytes_by_kg
            by_kg[key_group] = by_kg.get(key_group, 0) + size
            if size > 0 and self.clean_bytes + self.dirty_bytes > self.max_bytes:
                self.evict()

    def put_key(self, key_group: int, key: bytes, values: Mapping[str, bytes | None]) -> None:
        """:meth:`put` of one key's values of several states."""
        for state, value in values.items():
            self.put(key_group, state, key, value)

    def dirty_changes(
        self, key_group: int
    ) -> tuple[dict[str, dict[bytes, bytes]], dict[str, list[bytes]]]:
        """The key group's uncommitted ``(puts, deletes)`` per state name."""
        puts: dict[str, dict[bytes, bytes]] = {}
        deletes: dict[str, list[bytes]] = {}
        for (state, key), value in (self._dirty.get(key_group) or {}).items():
            if value is None:
                deletes.setdefault(state, []).append(key)
            else:
                puts.setdefault(state, {})[key] = value
        return puts, deletes

    def committed(self, key_group: int) -> None:
        """The dirty entries of ``key_group`` are durable now: make them clean."""
        dirty = self._dirty.pop(key_group, None)
        if not dirty:
            return
        self.dirty_bytes -= self._dirty_bytes_by_kg.pop(key_group, 0)
        for (state, key), value in dirty.items():
            self._remember_clean((key_group, state, key), value)
        self.evict()

    def drop(self, key_group: int) -> None:
        """Forget everything of ``key_group``, dirty entries included (fenced or released)."""
        self._dirty.pop(key_group, None)
        self.dirty_bytes -= self._dirty_bytes_by_kg.pop(key_group, 0)
        for slot in self._clean_by_kg.pop(key_group, ()):
            self.clean_bytes -= entry_size(slot[2], self._clean.pop(slot))

    # -- the clean LRU and its per-key-group index ----------------------------------

    def _remember_clean(self, slot: Slot, value: bytes | None) -> None:
        self._clean[slot] = value
        self.clean_bytes += entry_size(slot[2], value)
        self._clean_by_kg.setdefault(slot[0], set()).add(slot)

    def _forget_clean(self, slot: Slot) -> None:
        old = self._clean.pop(slot, _MISSING)
        if old is not _MISSING:
            self.clean_bytes -= entry_size(slot[2], old)
            self._unindex(slot)

    def _unindex(self, slot: Slot) -> None:
        slots = self._clean_by_kg.get(slot[0])
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._clean_by_kg[slot[0]]


class _Missing(enum.Enum):
    """Not cached (as opposed to ``None``: cached as absent from the store)."""

    MISSING = enum.auto()


_MISSING: Final = _Missing.MISSING
