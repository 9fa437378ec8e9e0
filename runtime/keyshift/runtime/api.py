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

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec

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


def _decode(state: str, decoder: msgspec.msgpack.Decoder[Any], raw: bytes) -> Any:
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:  # ValidationError too: a value of another type
        raise CorruptState(state, raw, exc) from None


IMMUTABLE_TYPES: frozenset[type] = frozenset({int, float, str, bytes, bool, type(None)})
"""Values of these types cannot change in place: the runtime may hand one decoded value
to several reads (of one batch) instead of decoding each time."""


class StateAccess(Protocol):
    """What a state handle needs from the runtime: reads and writes of the current key."""

    def read(self, state: str) -> bytes | None: ...
    def write(self, state: str, value: bytes | None) -> None: ...
    def read_value(self, state: str, decode: Callable[[bytes], Any], default: Any) -> Any:
        """The decoded value (``default`` when absent); ``decode`` turns stored bytes
        into it."""
        ...

    def write_value(self, state: str, raw: bytes | None, value: Any, shareable: bool) -> None:
        """Write ``raw`` (``None``: delete), the encoding of ``value``; ``shareable``: later
        reads may return ``value`` itself instead of decoding ``raw`` (it is immutable and
        of the type decoding gives)."""
        ...


class BytesAccess:
    """A :class:`StateAccess` over stored bytes alone (``read``/``write``), decoding on
    every read: for tools and tests that hold state in a dict; the runtime shares
    decoded values within a batch instead."""

    def read(self, state: str) -> bytes | None:
        raise NotImplementedError

    def write(self, state: str, value: bytes | None) -> None:
        raise NotImplementedError

    def read_value(self, state: str, decode: Callable[[bytes], Any], default: Any) -> Any:
        raw = self.read(state)
        return default if raw is None else decode(raw)

    def write_value(self, state: str, raw: bytes | None, value: Any, shareable: bool) -> None:
        self.write(state, raw)


class StateSpec(Protocol[H]):
    """A state declaration; ``bind`` makes the handle ``ctx.state`` returns."""

    @property
    def name(self) -> str: ...

    def bind(self, access: StateAccess) -> H: ...


@dataclass(frozen=True, eq=False)
class ValueState(Generic[V]):
    """One value per key; ``value()`` is ``default`` until updated."""

    name: str
    type: type[V]
    default: V | None = None
    _decoder: msgspec.msgpack.Decoder[Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_state_name(self.name)
        object.__setattr__(self, "_decoder", msgspec.msgpack.Decoder(self.type))

    def _decode(self, raw: bytes) -> V:
        result: V = _decode(self.name, self._decoder, raw)
        return result

    def bind(self, access: StateAccess) -> ValueHandle[V]:
        return ValueHandle(self, access)


@dataclass(frozen=True, eq=False)
class MapState(Generic[MK, V]):
    """A map per key: ``get``/``put``/``remove``/``items``.

    A key's whole map is one stored value, so keep per-key maps moderate
    (thousands of entries, not millions).
    """

    name: str
    key_type: type[MK]
    value_type: type[V]
    _decoder: msgspec.msgpack.Decoder[Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_state_name(self.name)
        decoded: Any = dict[self.key_type, self.value_type]  # type: ignore[name-defined]
        object.__setattr__(self, "_decoder", msgspec.msgpack.Decoder(decoded))

    def bind(self, access: StateAccess) -> MapHandle[MK, V]:
        return MapHandle(self, access)


@dataclass(frozen=True, eq=False)
class ListState(Generic[V]):
    """An append-only list per key: ``append``/iterate/``clear``."""

    name: str
    element_type: type[V]
    _decoder: msgspec.msgpack.Decoder[Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_state_name(self.name)
        decoded: Any = list[self.element_type]  # type: ignore[name-defined]
        object.__setattr__(self, "_decoder", msgspec.msgpack.Decoder(decoded))

    def bind(self, access: StateAccess) -> ListHandle[V]:
        return ListHandle(self, access)


class ValueHandle(Generic[V]):
    __slots__ = ("_access", "_spec")

    def __init__(self, spec: ValueState[V], access: StateAccess) -> None:
        self._spec = spec
        self._access = access

    def value(self) -> V:
        spec = self._spec
        result: V = self._access.read_value(spec.name, spec._decode, spec.default)
        return result

    def update(self, value: V) -> None:
        spec = self._spec
        shareable = type(value) is spec.type and spec.type in IMMUTABLE_TYPES
        self._access.write_value(spec.name, _encoder.encode(value), value, shareable)

    def clear(self) -> None:
        default = self._spec.default
        self._access.write_value(self._spec.name, None, default, type(default) in IMMUTABLE_TYPES)


class MapHandle(Generic[MK, V]):
    __slots__ = ("_access", "_spec")

    def __init__(self, spec: MapState[MK, V], access: StateAccess) -> None:
        self._spec = spec
        self._access = access

    def _load(self) -> dict[MK, V]:
        raw = self._access.read(self._spec.name)
        if raw is None:
            return {}
        result: dict[MK, V] = _decode(self._spec.name, self._spec._decoder, raw)
        return result

    def _store(self, mapping: dict[MK, V]) -> None:
        self._access.write(self._spec.name, _encoder.encode(mapping) if mapping else None)

    def get(self, key: MK, default: V | None = None) -> V | None:
        return self._load().get(key, default)

    def __contains__(self, key: MK) -> bool:
        return key in self._load()

    def put(self, key: MK, value: V) -> None:
        mapping = self._load()
        mapping[key] = value
        self._store(mapping)

    def remove(self, key: MK) -> None:
        mapping = self._load()
        if key in mapping:
            del mapping[key]
            self._store(mapping)

    def items(self) -> Iterator[tuple[MK, V]]:
        return iter(list(self._load().items()))

    def keys(self) -> Iterator[MK]:
        return iter(list(self._load()))

    def __iter__(self) -> Iterator[MK]:
        return self.keys()

    def __len__(self) -> int:
        return len(self._load())

    def clear(self) -> None:
        self._access.write(self._spec.name, None)


class ListHandle(Generic[V]):
    __slots__ = ("_access", "_spec")

    def __init__(self, spec: ListState[V], access: StateAccess) -> None:
        self._spec = spec
        self._access = access

    def get(self) -> list[V]:
        raw = self._access.read(self._spec.name)
        if raw is None:
            return []
        result: list[V] = _decode(self._spec.name, self._spec._decoder, raw)
        return result

    def append(self, value: V) -> None:
        items = self.get()
        items.append(value)
        self._access.write(self._spec.name, _encoder.encode(items))

    def extend(self, values: Sequence[V]) -> None:
        items = self.get()
        items.extend(values)
        self._access.write(self._spec.name, _encoder.encode(items))

    def __iter__(self) -> Iterator[V]:
        return iter(self.get())

    def __len__(self) -> int:
        return len(self.get())

    def clear(self) -> None:
        self._access.write(self._spec.name, None)


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


class JobLoadError(Exception):
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
        raise ValueError(f"job entrypoint {entrypoint!r}: expected 'module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise JobLoadError(f"job entrypoint {entrypoint!r} cannot be loaded: {exc}") from exc
    if not isinstance(obj, Job):
        raise JobLoadError(f"job entrypoint {entrypoint!r} is a {type(obj).__name__}, not a Job")
    return obj
