"""The user API: a keyed process function over keyed state, in Python idiom.

A job is a plain function ``process(record, ctx)`` called once per record, with
the record's key current in ``ctx``.  Keyed state is declared up front, by name,
with :class:`ValueState`, :class:`MapState` and :class:`ListState`; inside the
function ``ctx.state(descriptor)`` gives the handle scoped to the current key.
Outputs go to ``ctx.emit(value)``, or to a named side output with
``ctx.emit(value, output="late")``.  Example (``examples/counter.py``)::

    count = ValueState("count", int, default=0)

    def process(event: Event, ctx: Context) -> None:
        c = ctx.state(count)
        c.update(c.value() + 1)
        ctx.emit({"key": event.key, "count": c.value()})

    job = Job(name="counter", process=process, key_by=lambda e: e.key, states=[count])

Values are serialised with msgpack (msgspec), decoded to the declared type.
A record's state changes and outputs are applied only if the function returns;
if it raises, none of them happen (see ``errorPolicy``).  To test a job in memory,
over a list of records with timers and watermarks: :mod:`keyshift.runtime.testing`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import msgspec

from keyshift.errors import KeyshiftError
from keyshift.runtime.timers import FiredTimer, TimerService
from keyshift.store.protocol import check_state_name

R = TypeVar("R")
V = TypeVar("V")
MK = TypeVar("MK")
H = TypeVar("H", covariant=True)

_encoder = msgspec.msgpack.Encoder()


def encode_key(key: Hashable) -> bytes:
    """The stored form of a record key (msgpack, so any msgpack-able key works)."""
    return _encoder.encode(key)


def decode_key(raw: bytes) -> Any:
    return msgspec.msgpack.decode(raw)


class CorruptState(BaseException):
    """A stored value of state ``state`` that its codec cannot decode: the store holds
    bytes this job never wrote (edited, or written by another job or version).  A store
    error, not the user's: a ``BaseException``, so that a user function's ``except
    Exception`` cannot swallow it; the runtime stops the key group whatever
    ``errorPolicy`` says."""

    def __init__(self, state: str, raw: bytes, error: Exception) -> None:
        self.state = state
        self.raw = raw
        self.error = error
        super().__init__(f"state {state!r}: {type(error).__name__}: {error}")


class StateTooLarge(KeyshiftError):
    """A map too large to iterate in the worker's state cache: its ``get``, ``put`` and
    ``remove`` work at any size, ``items``/``keys``/``len`` need it cached whole.  A
    user-function error (``errorPolicy`` applies)."""


def decode_stored(decoder: msgspec.msgpack.Decoder[Any], raw: bytes) -> Any:
    """A stored value decoded; raises ``msgspec.DecodeError`` if ``decoder`` cannot."""
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError:  # ValidationError too: a value of another type
        expires, inner = split_expiry(raw)
        if expires is not None:  # written with a ttl the state no longer has: it lives on
            return decode_stored(decoder, inner)
        raise


def _decode(state: str, decoder: msgspec.msgpack.Decoder[Any], raw: bytes) -> Any:
    try:
        return decode_stored(decoder, raw)
    except msgspec.DecodeError as exc:
        raise CorruptState(state, raw, exc) from None


TTL_EXT = 1
"""The msgpack extension code of a value that expires (a ``ValueState`` with ``ttl``): its
data is the expiry time (unix ms, 8 bytes big-endian), then the value's own msgpack.
Tools that read the store see an extension value, never a misleading plain one."""

_EXT_FIRST_BYTES = frozenset({0xC7, 0xC8, 0xC9, 0xD8})
"""The first byte of msgpack's ext 8/16/32 and fixext 16 (an expiring value's forms)."""
_ext_decoder = msgspec.msgpack.Decoder(msgspec.msgpack.Ext)


def ttl_in_ms(state: str, ttl: float | timedelta | None) -> int | None:
    """A state's ``ttl`` in milliseconds (None: its values never expire)."""
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if seconds is None:
        return None
    if not seconds > 0:
        raise ValueError(f"state {state!r}: ttl must be positive, got {ttl!r}")
    return max(1, round(seconds * 1000))


def now_ms() -> int:
    """The clock of state expiry: the worker's wall clock (processing time), in ms."""
    return int(time.time() * 1000)


def with_expiry(raw: bytes, expires_ms: int) -> bytes:
    """``raw`` (a value's msgpack) as a value that expires at ``expires_ms``."""
    return _encoder.encode(msgspec.msgpack.Ext(TTL_EXT, expires_ms.to_bytes(8, "big") + raw))


def encode_stored(value: Any, ttl_ms: int | None) -> bytes:
    """A value as a state stores it: msgpack, expiring ``ttl_ms`` from now if given."""
    raw = _encoder.encode(value)
    return raw if ttl_ms is None else with_expiry(raw, now_ms() + ttl_ms)


def live(raw: bytes | None, ttl_ms: int | None) -> bytes | None:
    """Stored bytes as the value's msgpack, or None if absent or expired. Without a ttl
    they are returned as they are (a value written with a ttl the state has since lost
    is unwrapped by the decoding, :func:`_decode`)."""
    if raw is None or ttl_ms is None:
        return raw
    expires, inner = split_expiry(raw)
    if expires is None:
        return raw  # written before the state had a ttl: it does not expire
    return None if expires <= now_ms() else inner


def split_expiry(raw: bytes) -> tuple[int | None, bytes]:
    """``(expiry in unix ms, the value's msgpack)`` of a stored value; ``(None, raw)``
    for a value that does not expire."""
    if not raw or raw[0] not in _EXT_FIRST_BYTES:
        return None, raw
    try:
        ext = _ext_decoder.decode(raw)
    except msgspec.DecodeError:
        return None, raw
    data = bytes(ext.data)
    if ext.code != TTL_EXT or len(data) < 8:
        return None, raw
    return int.from_bytes(data[:8], "big"), data[8:]


IMMUTABLE_TYPES: frozenset[type] = frozenset({int, float, str, bytes, bool})
"""Values of these types cannot change in place: the runtime keeps a ``ValueState`` of one
of them decoded in its cache (one value handed to every read, encoded at commit) instead
of decoding on every read."""


class StateAccess(Protocol):
    """What a state handle needs from the runtime: reads and writes of the current key.

    A :class:`ValueState` is one value per key (``read_value``/``write_value``; ``read``
    and ``write`` are the same as stored bytes).  The collections (:class:`MapState`,
    :class:`ListState`) are stored per *entry*: the entry of the current key with entry
    key ``entry`` (msgpack bytes) is stored on its own, so that reading or writing one
    costs the same whatever the collection's size.
    """

    def read(self, state: str) -> bytes | None: ...
    def write(self, state: str, value: bytes | None) -> None: ...
    def read_value(self, spec: ValueState[Any]) -> Any:
        """The current key's value of ``spec`` (its default when absent)."""
        ...

    def write_value(self, spec: ValueState[Any], value: Any) -> None:
        """Set the current key's value of ``spec``."""
        ...

    def clear_value(self, spec: ValueState[Any]) -> None:
        """Delete the current key's value of ``spec``."""
        ...

    def read_entries(self, state: str, entries: Sequence[bytes]) -> list[bytes | None]:
        """The stored values of the current key's ``entries`` (``None``: absent)."""
        ...

    def write_entry(self, state: str, entry: bytes, value: bytes | None) -> None:
        """Write (``None``: delete) one entry of the current key."""
        ...

    def entry_keys(self, state: str) -> list[bytes]:
        """The entry keys the current key has in ``state``, in byte order."""
        ...


ENTRY_SEPARATOR = "\x00"
""":class:`BytesAccess` keeps entry ``e`` of state ``s`` as the value named
``s + ENTRY_SEPARATOR + e.hex()`` (state names cannot hold the separator)."""


class BytesAccess:
    """A :class:`StateAccess` over stored bytes alone (``read``/``write``), decoding on
    every read: for tools and tests that hold state in a dict; the runtime keeps decoded
    values in its cache instead."""

    def read(self, state: str) -> bytes | None:
        raise NotImplementedError

    def write(self, state: str, value: bytes | None) -> None:
        raise NotImplementedError

    def read_value(self, spec: ValueState[Any]) -> Any:
        raw = self.read(spec.name)
        return spec.default if raw is None else spec._decode(raw)

    def write_value(self, spec: ValueState[Any], value: Any) -> None:
        self.write(spec.name, spec.encode(value))

    def clear_value(self, spec: ValueState[Any]) -> None:
        self.write(spec.name, None)

    def names(self) -> Iterable[str]:
        """The names of the current key's values (written or stored)."""
        raise NotImplementedError

    def read_entries(self, state: str, entries: Sequence[bytes]) -> list[bytes | None]:
        return [self.read(state + ENTRY_SEPARATOR + e.hex()) for e in entries]

    def write_entry(self, state: str, entry: bytes, value: bytes | None) -> None:
        self.write(state + ENTRY_SEPARATOR + entry.hex(), value)

    def entry_keys(self, state: str) -> list[bytes]:
        prefix = state + ENTRY_SEPARATOR
        found = [n for n in self.names() if n.startswith(prefix) and self.read(n) is not None]
        return sorted(bytes.fromhex(n[len(prefix) :]) for n in found)


class StateSpec(Protocol[H]):
    """A state declaration; ``bind`` makes the handle ``ctx.state`` returns."""

    @property
    def name(self) -> str: ...

    def bind(self, access: StateAccess) -> H: ...


@dataclass(frozen=True, eq=False)
class ValueState(Generic[V]):
    """One value per key; ``value()`` is ``default`` until updated.

    ``ttl`` (seconds, or a ``timedelta``): a value lives that long after it was last
    written (``update``; reading does not extend it, as Flink's default
    ``OnCreateAndWrite``). Then it reads as absent (``default``), and the worker that
    owns its key group removes it from the store in the background, within its fenced
    commits. Expiry follows the workers' wall clock (processing time), so a replay after
    a crash may find a value expired that the first run still read.
    """

    name: str
    type: type[V]
    default: V | None = None
    ttl: float | timedelta | None = None
    _decoder: msgspec.msgpack.Decoder[Any] = field(init=False, repr=False)
    ttl_ms: int | None = field(init=False, repr=False)
    """``ttl`` in milliseconds (None: values never expire)."""

    kept_decoded: bool = field(init=False, repr=False)
    """Whether the runtime keeps its values decoded (:data:`IMMUTABLE_TYPES`, no ttl)."""

    def __post_init__(self) -> None:
        check_state_name(self.name)
        object.__setattr__(self, "_decoder", msgspec.msgpack.Decoder(self.type))
        object.__setattr__(self, "ttl_ms", ttl_in_ms(self.name, self.ttl))
        kept = self.ttl_ms is None and self.type in IMMUTABLE_TYPES
        object.__setattr__(self, "kept_decoded", kept)

    def _decode(self, raw: bytes) -> V:
        value = live(raw, self.ttl_ms)
        if value is None:
            return self.default  # type: ignore[return-value]
        result: V = _decode(self.name, self._decoder, value)
        return result

    def decode_value(self, raw: bytes) -> Any:
        """A stored value (of a state without a ttl) decoded; raises
        ``msgspec.DecodeError`` where :meth:`_decode` raises :class:`CorruptState`."""
        return decode_stored(self._decoder, raw)

    def encode(self, value: V) -> bytes:
        """``value`` as stored: msgpack, expiring ``ttl`` from now if the state has one."""
        return encode_stored(value, self.ttl_ms)

    def coerce(self, value: Any) -> V:
        """``value`` as reading it back from the store gives it (an int written to a float
        state is a float); raises ``msgspec.ValidationError`` for a value of another type."""
        if type(value) is self.type:
            return value
        result: V = self._decoder.decode(_encoder.encode(value))
        return result

    def bind(self, access: StateAccess) -> ValueHandle[V]:
        return ValueHandle(self, access)


@dataclass(frozen=True, eq=False)
class MapState(Generic[MK, V]):
    """A map per key: ``get``/``put``/``remove``/``items``.

    Stored per entry: ``get``, ``put`` and ``remove`` cost the same whatever the map's
    size (a million entries per key is fine).  Iterating (``items``, ``keys``, ``len``)
    reads the whole map, in the byte order of the encoded map keys (not insertion
    order); it needs the map to fit in the worker's state cache.

    ``ttl``: per entry, as :class:`ValueState`'s per value: an entry is absent ``ttl``
    after its last ``put`` (for ``get``, ``in``, the iterations and ``len``), and the
    worker removes it from the store in the background.
    """

    name: str
    key_type: type[MK]
    value_type: type[V]
    ttl: float | timedelta | None = None
    _key_decoder: msgspec.msgpack.Decoder[Any] = field(init=False, repr=False)
    _value_decoder: msgspec.msgpack.Decoder[Any] = field(init=False, repr=False)
    ttl_ms: int | None = field(init=False, repr=False)
    """``ttl`` in milliseconds (None: entries never expire)."""

    entries: ClassVar[bool] = True
    """Stored per entry (:meth:`StateAccess.read_entries`)."""

    def __post_init__(self) -> None:
        check_state_name(self.name)
        object.__setattr__(self, "_key_decoder", msgspec.msgpack.Decoder(self.key_type))
        object.__setattr__(self, "_value_decoder", msgspec.msgpack.Decoder(self.value_type))
        object.__setattr__(self, "ttl_ms", ttl_in_ms(self.name, self.ttl))

    def _live(self, raw: bytes | None) -> bytes | None:
        """An entry's value msgpack, or None if it is absent or has expired."""
        return live(raw, self.ttl_ms)

    def bind(self, access: StateAccess) -> MapHandle[MK, V]:
        return MapHandle(self, access)


@dataclass(frozen=True, eq=False)
class ListState(Generic[V]):
    """An append-only list per key: ``append``/iterate/``clear``.

    Stored per element, with the length on its own: ``append`` costs the same whatever
    the list's length; iterating reads the whole list.

    ``ttl``: per element, ``ttl`` after its ``append``; iteration and ``len`` skip the
    expired ones. The stored length expires with the last append, so a key whose every
    element has expired leaves nothing in the store once the sweep has passed.
    """

    name: str
    element_type: type[V]
    ttl: float | timedelta | None = None
    _decoder: msgspec.msgpack.Decoder[Any] = field(init=False, repr=False)
    ttl_ms: int | None = field(init=False, repr=False)
    """``ttl`` in milliseconds (None: elements never expire)."""

    entries: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_state_name(self.name)
        object.__setattr__(self, "_decoder", msgspec.msgpack.Decoder(self.element_type))
        object.__setattr__(self, "ttl_ms", ttl_in_ms(self.name, self.ttl))

    def bind(self, access: StateAccess) -> ListHandle[V]:
        return ListHandle(self, access)

    def _length(self, raw: bytes) -> int:
        """The stored length: the slots appended so far (0 once the last append expired)."""
        value = live(raw, self.ttl_ms)
        if value is None:
            return 0
        length: int = _decode(self.name, _length_decoder, value)
        return length

    def _live(self, raw: bytes | None) -> bytes | None:
        """An element's value msgpack, or None if it is absent or has expired."""
        return live(raw, self.ttl_ms)


_length_decoder = msgspec.msgpack.Decoder(int)


class ValueHandle(Generic[V]):
    __slots__ = ("_access", "_spec")

    def __init__(self, spec: ValueState[V], access: StateAccess) -> None:
        self._spec = spec
        self._access = access

    def value(self) -> V:
        result: V = self._access.read_value(self._spec)
        return result

    def update(self, value: V) -> None:
        self._access.write_value(self._spec, value)

    def clear(self) -> None:
        self._access.clear_value(self._spec)


class MapHandle(Generic[MK, V]):
    __slots__ = ("_access", "_spec")

    def __init__(self, spec: MapState[MK, V], access: StateAccess) -> None:
        self._spec = spec
        self._access = access

    def _value(self, raw: bytes) -> V:
        result: V = _decode(self._spec.name, self._spec._value_decoder, raw)
        return result

    def _read(self, key: MK) -> bytes | None:
        spec = self._spec
        return spec._live(self._access.read_entries(spec.name, [_encoder.encode(key)])[0])

    def get(self, key: MK, default: V | None = None) -> V | None:
        raw = self._read(key)
        return default if raw is None else self._value(raw)

    def __contains__(self, key: MK) -> bool:
        return self._read(key) is not None

    def put(self, key: MK, value: V) -> None:
        spec = self._spec
        self._access.write_entry(spec.name, _encoder.encode(key), encode_stored(value, spec.ttl_ms))

    def remove(self, key: MK) -> None:
        self._access.write_entry(self._spec.name, _encoder.encode(key), None)

    def items(self) -> Iterator[tuple[MK, V]]:
        """The entries as they are now (later writes do not change the iteration),
        decoded one by one as the iteration goes."""
        spec = self._spec
        live = self._live_entries()
        return ((_decode(spec.name, spec._key_decoder, k), self._value(v)) for k, v in live)

    def _live_entries(self) -> list[tuple[bytes, bytes]]:
        """The entries present now: ``(entry key, value msgpack)``."""
        spec = self._spec
        entries = self._access.entry_keys(spec.name)
        values = self._access.read_entries(spec.name, entries)
        return [
            (k, raw)
            for k, v in zip(entries, values, strict=True)
            if (raw := spec._live(v)) is not None
        ]

    def keys(self) -> Iterator[MK]:
        spec = self._spec
        if spec.ttl_ms is None:  # the listing alone: no value read
            entries = self._access.entry_keys(spec.name)
        else:  # an entry listed may have expired: its value says
            entries = [k for k, _ in self._live_entries()]
        return (_decode(spec.name, spec._key_decoder, k) for k in entries)

    def __iter__(self) -> Iterator[MK]:
        return self.keys()

    def __len__(self) -> int:
        if self._spec.ttl_ms is None:
            return len(self._access.entry_keys(self._spec.name))
        return len(self._live_entries())

    def clear(self) -> None:
        name = self._spec.name
        for entry in self._access.entry_keys(name):
            self._access.write_entry(name, entry, None)


class ListHandle(Generic[V]):
    """Element ``i`` of the current key's list is entry ``i``; the length is the key's
    own value (a ``ValueState`` of the same name, in effect)."""

    __slots__ = ("_access", "_spec")

    def __init__(self, spec: ListState[V], access: StateAccess) -> None:
        self._spec = spec
        self._access = access

    def _slots(self) -> int:
        """Elements appended since the list was last empty (expired ones included)."""
        spec = self._spec
        raw = self._access.read(spec.name)
        return 0 if raw is None else spec._length(raw)

    def __len__(self) -> int:
        if self._spec.ttl_ms is None:
            return self._slots()
        return len(self._live())

    def _live(self) -> list[bytes]:
        """The elements' value msgpack, in order, the expired ones left out."""
        spec = self._spec
        raws = self._access.read_entries(
            spec.name, [_encoder.encode(i) for i in range(self._slots())]
        )
        live = [spec._live(raw) for raw in raws]
        if spec.ttl_ms is None and None in live:  # only an expired element may be missing
            raise CorruptState(spec.name, b"", ValueError("the list lacks an element"))
        return [raw for raw in live if raw is not None]

    def get(self) -> list[V]:
        return list(self)

    def __iter__(self) -> Iterator[V]:
        """The elements as they are now, decoded one by one as the iteration goes."""
        spec = self._spec
        return (_decode(spec.name, spec._decoder, raw) for raw in self._live())

    def append(self, value: V) -> None:
        self.extend((value,))

    def extend(self, values: Iterable[V]) -> None:
        spec = self._spec
        name = spec.name
        count = start = self._slots()
        access = self._access
        for value in values:
            access.write_entry(name, _encoder.encode(count), encode_stored(value, spec.ttl_ms))
            count += 1
        if count != start:  # with a ttl, the length expires with this, the last append
            access.write(name, encode_stored(count, spec.ttl_ms))

    def clear(self) -> None:
        name = self._spec.name
        for i in range(self._slots()):
            self._access.write_entry(name, _encoder.encode(i), None)
        self._access.write(name, None)


class Context(Protocol):
    """What a process function sees: the current key, its origin, state, output."""

    @property
    def key(self) -> Any: ...
    @property
    def key_group(self) -> int: ...
    @property
    def offset(self) -> int: ...
    def state(self, spec: StateSpec[H]) -> H: ...
    def emit(self, value: Any, output: str | None = None) -> None:
        """Send ``value`` to the sink, or to the side output named ``output``."""
        ...

    @property
    def timestamp(self) -> int | None:
        """The current record's event time (ms); in ``on_timer``, the timer's time."""
        ...

    @property
    def watermark(self) -> int | None:
        """The key group's watermark (ms), ``None`` before the first record."""
        ...

    @property
    def timers(self) -> TimerService:
        """Timers of the current key (``register_event_time(ts, payload)`` and so on)."""
        ...


ProcessFunction = Callable[[R, Context], None]


@dataclass(frozen=True)
class Job(Generic[R]):
    """A keyed job: how to key records, what state to keep, what to do per record."""

    name: str
    process: Callable[[R, Context], None]
    key_by: Callable[[R], Hashable]
    states: Sequence[ValueState[Any] | MapState[Any, Any] | ListState[Any]] = ()
    on_timer: Callable[[FiredTimer, Context], None] | None = None
    """Called when a timer of the current key fires (``ctx.key`` is the timer's key);
    its state changes, outputs and timer changes are committed like a record's."""
    timestamp: Callable[[R], int] | None = None
    """The event time (unix ms) of a record; omitted: the source's own event time."""
    decode: Callable[[bytes], R] | None = None
    """Turns a Kafka record's value into the record ``process`` gets (omitted: the
    source's ``format``); if it raises, the record is poison (``onPoison``)."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.states]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"job {self.name!r}: state names declared twice: {duplicates}")

    @property
    def state_names(self) -> list[str]:
        return [s.name for s in self.states]

    @property
    def entry_states(self) -> frozenset[str]:
        """The states stored per entry (maps and lists)."""
        return frozenset(s.name for s in self.states if getattr(s, "entries", False))


class JobLoadError(KeyshiftError):
    """The job's ``module:attribute`` does not name an importable Job."""


JOB_PATH_ENV = "KEYSHIFT_JOB_PATH"
"""Folders (``os.pathsep``-separated) a worker also looks in for the job's module."""


def find_job_module(entrypoint: str, search: Sequence[str] = ()) -> None:
    """Check that the module of ``module:attribute`` exists, where :func:`load_job` would
    import it from, without running any of its code (nor its packages' ``__init__``);
    raise :class:`JobLoadError` if it does not.  Checking a manifest uses this: only
    running the job imports it."""
    import importlib.machinery
    import importlib.util
    import sys

    module_name = entrypoint.partition(":")[0]
    top, *rest = module_name.split(".")
    saved = list(sys.path)
    sys.path.extend(p for p in search if p and p not in sys.path)
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    name = top
    for part in rest:
        locations = spec.submodule_search_locations if spec is not None else None
        name = f"{name}.{part}"
        spec = importlib.machinery.PathFinder.find_spec(name, list(locations or []))
        if locations is None:
            spec = None
    if spec is None:
        raise JobLoadError(
            f"job entrypoint {entrypoint!r} cannot be loaded: No module named {module_name!r}"
        )


def load_job(entrypoint: str, search: Sequence[str] = ()) -> Job[Any]:
    """Import ``module:attribute`` and check that it is a :class:`Job`.  ``search``: more
    folders to look in, after the standard library and the installed packages (so that a
    folder of the user's cannot hide one of them)."""
    import importlib
    import sys

    sys.path.extend(p for p in search if p and p not in sys.path)

    module_name, sep, attribute = entrypoint.partition(":")
    if not sep or not module_name or not attribute:
        raise JobLoadError(f"job entrypoint {entrypoint!r}: expected 'module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise JobLoadError(f"job entrypoint {entrypoint!r} cannot be loaded: {exc}") from exc
    except Exception as exc:  # the module's own code failed as it was imported
        raise JobLoadError(
            f"job entrypoint {entrypoint!r}: its module raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(obj, Job):
        raise JobLoadError(f"job entrypoint {entrypoint!r} is a {type(obj).__name__}, not a Job")
    return obj
