"""The worker's write-back state cache: bounded in bytes, shared by key groups.

One :class:`Entry` per ``(key_group, key)`` holds the values of all the key's states,
so a record finds every state of its key with one lookup. A value is the stored bytes,
``None`` (known absent in the store) or :data:`MISSING` (not loaded). States registered
with a codec (:meth:`StateCache.register`: a ``ValueState`` of a number, string, bytes
or bool) are kept *decoded*: reads return the value itself, writes store it, and it is
encoded once, when the key group commits (:meth:`dirty_changes`), however often it
changed in between.

Dirty values (written since the key group's last commit) make their entry dirty, and
dirty entries are never evicted: they stop being dirty only through a successful
commit (:meth:`committed`) or when the key group is dropped (:meth:`drop`). When the
dirty bytes pass ``dirty_limit`` the owner must checkpoint (:attr:`needs_checkpoint`).

The cache never loads anything itself: the runtime asks which keys are
:meth:`missing`, loads them (all states in one ``get_states`` round trip), and
:meth:`fill`\\ s them in.
Eviction is CLOCK (second chance), an approximation of least recently used that costs
a flag per hit instead of a move in a list: entries queue in the order they came, a hit
sets the entry's flag, and eviction takes the oldest entry whose flag is clear (clearing
the flags it passes). It runs after a fill and when a batch's writes are accounted
(:meth:`written`), sparing dirty entries and the entries of the load in progress (the
``stamp`` a batch's :meth:`missing` and :meth:`fill` share).

Collections (maps, lists) are cached per entry like values: entry ``e`` of key ``k`` is
the :class:`Entry` of slot key ``k + e`` (msgpack is self-delimiting, so no such slot is
another key's). To iterate a map the runtime also caches its *listing*, the entry keys
the key has (the store's plus the uncommitted writes), as the value of state
``LISTING + state`` of the key's own entry: derived, never dirty.

The bound: ``total_bytes <= max_bytes`` after every fill and every accounting, except
that dirty entries are never evicted and that entries of the load in progress are
spared. A runtime read of a value evicted meanwhile finds :data:`MISSING`: the runtime
loads it again.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Final

ENTRY_OVERHEAD = 250
"""Bytes charged per entry on top of its key and values: the entry object, the key's
bytes header, its slot in the key group's dict and in the eviction queue, the values
list (measured with tracemalloc on CPython 3.11: ``tests/runtime/test_cache.py`` checks
that what the cache charges is within a third of what it takes)."""

VALUE_OVERHEAD = 40
"""Bytes charged per loaded value on top of its length: its slot in the values list and
the object's header (a decoded number is about that alone)."""

LISTING_KEY_OVERHEAD = 72
"""Bytes charged per entry key of a listing on top of its length (the bytes header and
the set's slot)."""

LISTING = "#"
"""Prefix of a listing's state name (state names cannot hold it)."""


class _Missing(enum.Enum):
    """Not cached (as opposed to ``None``: cached as absent from the store)."""

    MISSING = enum.auto()


MISSING: Final = _Missing.MISSING


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


class Undecodable:
    """A stored value of a decoded state that its codec could not decode: kept as it is,
    so that the record that reads it fails with the key and offset (``CorruptState``)."""

    __slots__ = ("error", "raw")

    def __init__(self, raw: bytes, error: Exception) -> None:
        self.raw = raw
        self.error = error


def value_size(value: object) -> int:
    """Bytes charged for one loaded value on top of :data:`VALUE_OVERHEAD`."""
    if value is None or value is MISSING:
        return 0
    if isinstance(value, (bytes, str)):
        return len(value)
    if isinstance(value, Listing):
        return value.nbytes
    if isinstance(value, Undecodable):
        return len(value.raw)
    return 0  # a number or a bool: its object is the overhead


def entry_size(key: bytes, value: object) -> int:
    """The bytes of an entry of ``key`` holding one value."""
    return ENTRY_OVERHEAD + len(key) + VALUE_OVERHEAD + value_size(value)


class CacheMiss(Exception):
    """A state was read that the runtime did not load first (a runtime bug)."""


class Entry:
    """The cached values of one slot key (a record key, or a key and a collection entry)
    of one key group. ``values[i]`` is the value of the state the cache numbers ``i``.

    The runtime's record context writes ``values`` and ``dirty`` in place and reports the
    entries it wrote to :meth:`StateCache.written` at the end of the batch."""

    __slots__ = ("dirty", "gone", "key", "key_group", "mark", "nbytes", "ref", "stamp", "values")

    def __init__(self, key_group: int, key: bytes, states: int) -> None:
        self.key_group = key_group
        self.key = key
        self.values: list[object] = [MISSING] * states
        self.dirty = 0
        """A bit per state with an uncommitted write (bit ``i``: state ``i``)."""
        self.nbytes = ENTRY_OVERHEAD + len(key)
        """The bytes charged for it, as of the last accounting."""
        self.ref = False
        """Used since eviction last passed it (CLOCK's flag)."""
        self.stamp = 0
        """The load that last touched it: eviction spares the load in progress."""
        self.mark = 0
        """The record context's: the batch that last wrote it (to list it once)."""
        self.gone = False
        """Dropped or evicted: its place in the eviction queue is stale."""

    def size(self) -> int:
        total = ENTRY_OVERHEAD + len(self.key)
        for value in self.values:
            if value is not MISSING:
                total += VALUE_OVERHEAD + value_size(value)
        return total


class StateCache:
    def __init__(self, max_bytes: int, *, dirty_fraction: float = 0.5) -> None:
        if max_bytes <= 0:
            raise ValueError("the cache needs a positive byte bound")
        self.max_bytes = max_bytes
        self.dirty_limit = max(1, int(max_bytes * dirty_fraction))
        self._ids: dict[str, int] = {}
        self._names: list[str] = []
        self._encoders: list[Callable[[Any], bytes] | None] = []
        self._decoders: list[Callable[[bytes], Any] | None] = []
        self._kgs: dict[int, dict[bytes, Entry]] = {}
        """Each key group's entries by slot key."""
        self._clock: deque[Entry] = deque()
        """Every entry, in CLOCK order (the next to look at first); dropped ones are stale
        until eviction or a compaction passes them."""
        self._stale = 0
        self._dirty: dict[int, dict[bytes, Entry]] = {}
        """The dirty entries of each key group, in the order they became dirty."""
        self._dirty_bytes_by_kg: dict[int, int] = {}
        self._stamps = 0
        self.clean_bytes = 0
        self.dirty_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    # -- states -------------------------------------------------------------------

    def register(
        self,
        state: str,
        *,
        encode: Callable[[Any], bytes] | None = None,
        decode: Callable[[bytes], Any] | None = None,
    ) -> int:
        """The number of ``state`` in every entry's ``values``; with ``encode`` and
        ``decode`` its values are kept decoded (registered the same way every time)."""
        found = self._ids.get(state)
        if found is not None:
            return found
        sid = len(self._names)
        self._ids[state] = sid
        self._names.append(state)
        self._encoders.append(encode)
        self._decoders.append(decode)
        return sid

    @property
    def state_names(self) -> list[str]:
        """The states registered, by number (do not modify)."""
        return self._names

    def state_id(self, state: str) -> int:
        found = self._ids.get(state)
        return self.register(state) if found is None else found

    def decoded(self, state: str) -> bool:
        """Whether ``state``'s values are kept decoded."""
        return self._decoders[self.state_id(state)] is not None

    # -- sizes ----------------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.dirty_bytes

    @property
    def needs_checkpoint(self) -> bool:
        return self.dirty_bytes >= self.dirty_limit

    def dirty_bytes_of(self, key_group: int) -> int:
        return self._dirty_bytes_by_kg.get(key_group, 0)

    def __len__(self) -> int:
        return len(self._clock) - self._stale

    def new_stamp(self) -> int:
        """A stamp for one load: what it touches, eviction spares while it lasts."""
        self._stamps += 1
        return self._stamps

    # -- entries ----------------------------------------------------------------------

    def entry(self, key_group: int, key: bytes) -> Entry | None:
        kg = self._kgs.get(key_group)
        return None if kg is None else kg.get(key)

    def entry_for_write(self, key_group: int, key: bytes) -> Entry:
        """The entry of ``key``, created empty if it is not cached."""
        kg = self._kgs.get(key_group)
        if kg is None:
            kg = self._kgs[key_group] = {}
        found = kg.get(key)
        if found is None:
            found = kg[key] = Entry(key_group, key, len(self._names))
            self._clock.append(found)
            self.clean_bytes += found.nbytes
        return found

    def entries(self, key_group: int, keys: list[bytes]) -> list[Entry | None]:
        """The entries of ``keys``, in order (None: not cached)."""
        kg = self._kgs.get(key_group)
        if kg is None:
            return [None] * len(keys)
        get = kg.get
        return [get(key) for key in keys]

    def _value(self, key_group: int, state: str, key: bytes) -> object:
        found = self.entry(key_group, key)
        if found is None:
            return MISSING
        sid = self.state_id(state)
        values = found.values
        return values[sid] if sid < len(values) else MISSING

    # -- reads ------------------------------------------------------------------------

    def get(self, key_group: int, state: str, key: bytes) -> Any:
        """The cached value (``None``: absent in the store); raise :class:`CacheMiss`."""
        found = self._value(key_group, state, key)
        if found is MISSING:
            raise CacheMiss((key_group, state, key))
        return found

    def find(self, key_group: int, state: str, key: bytes) -> Any:
        """:meth:`get`, answering :data:`MISSING` instead of raising."""
        return self._value(key_group, state, key)

    def is_dirty(self, key_group: int, state: str, key: bytes) -> bool:
        """Whether the cache holds an uncommitted write of this value."""
        found = self.entry(key_group, key)
        return found is not None and bool(found.dirty >> self.state_id(state) & 1)

    def contains(self, key_group: int, state: str, key: bytes) -> bool:
        return self._value(key_group, state, key) is not MISSING

    def missing(
        self,
        key_group: int,
        state: str,
        keys: Collection[bytes],
        *,
        count: bool = True,
        stamp: int = 0,
    ) -> list[bytes]:
        """Keys whose value of ``state`` is not cached, in first-seen order; touches the
        entries of the others. See :meth:`missing_states`."""
        return self.missing_states(key_group, [state], list(keys), count=count, stamp=stamp)[0]

    def missing_states(
        self,
        key_group: int,
        states: list[str],
        keys: list[bytes],
        *,
        count: bool = True,
        stamp: int = 0,
        found: list[Entry | None] | None = None,
    ) -> list[list[bytes]]:
        """Per state of ``states``, the keys whose value is not cached, each once, in
        first-seen order; touches the entries found (one lookup per key for all the
        states).

        Each key of ``keys`` (a key may repeat: a batch's keys) counts one hit or one
        miss per state: a miss the first time a value is missing, a hit after (the same
        fetch loads it). ``count=False``: a second look that counts nothing. ``stamp``:
        the load's (:meth:`new_stamp`). ``found``: a list to which the entry of each key
        is appended, in order (None: not cached), so that the batch need not look its
        keys up again."""
        sids = [self.state_id(s) for s in states]
        out: list[list[bytes]] = [[] for _ in sids]
        kg = self._kgs.get(key_group)
        get = kg.get if kg is not None else None
        seen: set[bytes] = set()
        """The keys listed as missing something (the only ones a repeat must check)."""
        hits = 0
        lost = 0
        for key in keys:
            entry = get(key) if get is not None else None
            if found is not None:
                found.append(entry)
            if entry is None:
                if key in seen:
                    hits += len(sids)  # loaded by the same fetch
                    continue
                seen.add(key)
                for wanted in out:
                    wanted.append(key)
                lost += len(sids)
                continue
            entry.ref = True
            entry.stamp = stamp
            values = entry.values
            n = len(values)
            listed = False
            for i, sid in enumerate(sids):
                if (sid < n and values[sid] is not MISSING) or key in seen:
                    hits += 1
                else:
                    out[i].append(key)
                    lost += 1
                    listed = True
            if listed:
                seen.add(key)
        if count:
            self.hits += hits
            self.misses += lost
        return out

    def fill(
        self,
        key_group: int,
        state: str,
        requested: Iterable[bytes],
        found: Mapping[bytes, bytes],
        *,
        protect: int = 0,
    ) -> None:
        """Insert loaded values (absent ones as ``None``; decoded if the state is), then
        evict down to the bound, sparing the entries of load ``protect`` (its stamp)."""
        sid = self.state_id(state)
        decode = self._decoders[sid]
        states = len(self._names)
        for key in requested:
            target = self.entry_for_write(key_group, key)
            target.stamp = protect
            values = target.values
            if sid >= len(values):
                values.extend([MISSING] * (states - len(values)))
            if target.dirty >> sid & 1:
                continue  # written meanwhile: the dirty value is newer
            raw = found.get(key)
            value: object = raw
            if raw is not None and decode is not None:
                try:
                    value = decode(raw)
                except Exception as exc:
                    value = Undecodable(raw, exc)
            old = values[sid]
            values[sid] = value
            change = VALUE_OVERHEAD + value_size(value)
            if old is not MISSING:
                change -= VALUE_OVERHEAD + value_size(old)
            self._charge(target, change)
        self.evict(protect=protect)

    def _charge(self, target: Entry, change: int) -> None:
        """``target`` grew by ``change`` bytes (outside :meth:`written`)."""
        target.nbytes += change
        dirty = self._dirty.get(target.key_group)
        if dirty is not None and target.key in dirty:
            self.dirty_bytes += change
            self._dirty_bytes_by_kg[target.key_group] += change
        else:
            self.clean_bytes += change

    def evict(self, *, protect: int = 0) -> None:
        """Evict clean entries in CLOCK order until within the bound, sparing the entries
        of load ``protect`` (0: none)."""
        clock = self._clock
        spins = 2 * len(clock)  # a pass to clear the flags, a pass to evict
        while self.clean_bytes + self.dirty_bytes > self.max_bytes and spins > 0:
            spins -= 1
            entry = clock.popleft()
            if entry.gone:
                self._stale -= 1
                continue
            if entry.dirty or (protect and entry.stamp == protect) or entry.ref:
                entry.ref = False
                clock.append(entry)
                continue
            entry.gone = True
            self.clean_bytes -= entry.nbytes
            kg = self._kgs[entry.key_group]
            del kg[entry.key]
            if not kg:
                del self._kgs[entry.key_group]
            self.evictions += 1

    # -- writes -----------------------------------------------------------------------

    def put(self, key_group: int, state: str, key: bytes, value: Any) -> None:
        """Write (``None``: delete) a value; it stays dirty until committed."""
        self.put_key(key_group, key, {state: value})

    def put_key(self, key_group: int, key: bytes, values: Mapping[str, Any]) -> None:
        """:meth:`put` of one key's values of several states."""
        target = self.entry_for_write(key_group, key)
        for state, value in values.items():
            sid = self.state_id(state)
            slots = target.values
            if sid >= len(slots):
                slots.extend([MISSING] * (len(self._names) - len(slots)))
            slots[sid] = value
            target.dirty |= 1 << sid
        self.written(key_group, [target])

    def written(self, key_group: int, entries: Iterable[Entry], *, protect: int = 0) -> None:
        """Account the entries of ``key_group`` the runtime wrote in place: their sizes,
        and the dirty ones as dirty; then evict down to the bound, sparing the entries of
        load ``protect``."""
        dirty = self._dirty.get(key_group)
        by_kg = self._dirty_bytes_by_kg
        clean_change = dirty_change = 0
        for target in entries:
            if target.gone:
                continue  # its key group was dropped meanwhile
            old = target.nbytes
            size = target.nbytes = target.size()
            if dirty is not None and target.key in dirty:
                if target.dirty:
                    dirty_change += size - old
                else:  # its writes were undone: clean again
                    del dirty[target.key]
                    dirty_change -= old
                    clean_change += size
            elif target.dirty:
                if dirty is None:
                    dirty = self._dirty[key_group] = {}
                dirty[target.key] = target
                clean_change -= old
                dirty_change += size
            else:
                clean_change += size - old
        self.clean_bytes += clean_change
        if dirty_change:
            self.dirty_bytes += dirty_change
            by_kg[key_group] = by_kg.get(key_group, 0) + dirty_change
        if self.clean_bytes + self.dirty_bytes > self.max_bytes:
            self.evict(protect=protect)

    def dirty_changes(
        self, key_group: int
    ) -> tuple[dict[str, dict[bytes, bytes]], dict[str, list[bytes]]]:
        """The key group's uncommitted ``(puts, deletes)`` per state name, encoded."""
        puts: dict[str, dict[bytes, bytes]] = {}
        deletes: dict[str, list[bytes]] = {}
        names = self._names
        encoders = self._encoders
        for target in (self._dirty.get(key_group) or {}).values():
            mask = target.dirty
            values = target.values
            sid = 0
            while mask:
                if mask & 1:
                    value = values[sid]
                    state = names[sid]
                    if value is None:
                        deletes.setdefault(state, []).append(target.key)
                    else:
                        encode = encoders[sid]
                        raw: Any = value if encode is None else encode(value)
                        puts.setdefault(state, {})[target.key] = raw
                mask >>= 1
                sid += 1
        return puts, deletes

    def committed(self, key_group: int) -> None:
        """The dirty entries of ``key_group`` are durable now: make them clean."""
        dirty = self._dirty.pop(key_group, None)
        if not dirty:
            return
        for target in dirty.values():
            target.dirty = 0
        moved = self._dirty_bytes_by_kg.pop(key_group, 0)
        self.dirty_bytes -= moved
        self.clean_bytes += moved
        self.evict()

    def drop(self, key_group: int) -> None:
        """Forget everything of ``key_group``, dirty entries included (fenced or released)."""
        dirty = self._dirty.pop(key_group, None) or {}
        self.dirty_bytes -= self._dirty_bytes_by_kg.pop(key_group, 0)
        kg = self._kgs.pop(key_group, None) or {}
        for target in kg.values():
            target.gone = True
            if target.key not in dirty:
                self.clean_bytes -= target.nbytes
        self._stale += len(kg)
        if self._stale > 1024 and self._stale * 2 > len(self._clock):
            self._clock = deque(e for e in self._clock if not e.gone)
            self._stale = 0

    # -- listings -----------------------------------------------------------------------

    def listing(self, key_group: int, state: str, key: bytes) -> Listing | None:
        """The cached listing of ``key``'s entries in ``state`` (touched), or None."""
        found = self.entry(key_group, key)
        if found is None:
            return None
        sid = self.state_id(LISTING + state)
        values = found.values
        listing = values[sid] if sid < len(values) else None
        if not isinstance(listing, Listing):
            return None
        found.ref = True
        return listing

    def put_listing(
        self, key_group: int, state: str, key: bytes, entries: set[bytes], *, protect: int = 0
    ) -> None:
        """Cache a listing (clean), then evict down to the bound, sparing the entries of
        load ``protect``."""
        sid = self.state_id(LISTING + state)
        target = self.entry_for_write(key_group, key)
        target.stamp = protect
        target.ref = True
        values = target.values
        if sid >= len(values):
            values.extend([MISSING] * (len(self._names) - len(values)))
        values[sid] = Listing(entries)
        self.written(key_group, [target], protect=protect)

    def listing_write(
        self, key_group: int, state: str, key: bytes, entry: bytes, present: bool
    ) -> None:
        """Entry ``entry`` of ``key`` was written (``present``) or deleted: keep a cached
        listing of the key true."""
        found = self.entry(key_group, key)
        if found is None:
            return
        sid = self.state_id(LISTING + state)
        values = found.values
        listing = values[sid] if sid < len(values) else None
        if isinstance(listing, Listing):
            self._charge(found, listing.change(entry, present))

    def dirty_entries(self, key_group: int, state: str, key: bytes) -> list[tuple[bytes, Any]]:
        """The uncommitted entries of ``key`` in ``state``: ``(entry key, value)`` pairs
        (a scan of the key group's dirty entries: when a listing is built)."""
        start = len(key)
        sid = self.state_id(state)
        return [
            (target.key[start:], target.values[sid])
            for target in (self._dirty.get(key_group) or {}).values()
            if target.dirty >> sid & 1 and len(target.key) > start and target.key.startswith(key)
        ]
