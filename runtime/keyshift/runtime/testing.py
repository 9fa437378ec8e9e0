"""A test harness for job code: run a :class:`~keyshift.runtime.api.Job` over records in
memory, with event-time and processing-time timers, and assert on its outputs and state;
no store, no worker, no process (as Flink's operator test harnesses and Bytewax's
``run_main`` do)::

    from keyshift.runtime.testing import JobHarness

    h = JobHarness(job, out_of_orderness_ms=2_000)
    h.process(Event("apple", 250), timestamp=1_000)
    h.run([Event("apple", 100), Event("pear", 40)], timestamps=[61_500, 62_000])
    h.end_input()                         # the bounded input ended: every window fires
    assert h.output() == [...]            # the main output's values, in order
    assert h.output("late") == []         # a side output's
    assert h.state("windows", "apple") == {}

One harness is one key group, run the way a worker runs it (``keygroup.py``):

- **A record is atomic.** Its state writes, outputs and timer changes apply only if
  ``process`` returns; if it raises, the exception reaches the test and nothing of the
  record happened (its offset and the watermark stay where they were), as under
  ``errorPolicy: fail``.  A timer whose ``on_timer`` raises stays registered.
- **Event time** (only for a job with ``on_timer``, as in the worker: without one,
  ``ctx.timestamp`` and ``ctx.watermark`` are ``None``): ``job.timestamp(record)`` when the
  job has it, else the ``timestamp`` given with the record (the source's event time).  A
  record is processed with the watermark of the records before it; then the watermark
  becomes ``max(watermark, event time - out_of_orderness_ms)`` (it never goes back) and
  the event-time timers it passed fire at once, in (time, key) order, before the next
  record.  :meth:`JobHarness.advance_watermark` moves it without a record (as a worker's
  idle advance does); :meth:`JobHarness.end_input` moves it to ``END_OF_TIME``, as the
  end of a bounded input does.
- **Processing time** is the harness's own clock, which starts at the wall clock (or
  ``processing_time_ms``) and moves only with :meth:`JobHarness.advance_processing_time`;
  the processing-time timers it passes fire then.  A job that reads the wall clock itself
  (``time.time()``, as processing-time windows do) still reads the real one.
- **Timers** are those of the worker (:class:`~keyshift.runtime.timers.TimerTable`): one
  per key and time, registering it again replaces its payload; in ``on_timer`` the
  context's key is the timer's, ``ctx.timestamp`` its time and ``ctx.offset`` the
  offset of the next record.
- **State** is kept as the store keeps it (msgpack bytes per state and key), so every
  read decodes what was written; a state the job did not declare is refused, as the
  worker refuses it.

Checkpoints, replays, rescales, ``idleTimeout`` and sinks are the worker's and are not
simulated: outputs are collected in :attr:`JobHarness.outputs`.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable
from typing import Any, Generic, Literal, NamedTuple, TypeVar, cast

from keyshift.runtime.api import (
    BytesAccess,
    Job,
    ListState,
    MapState,
    StateSpec,
    ValueState,
    decode_key,
    encode_key,
)
from keyshift.runtime.timers import (
    END_OF_TIME,
    EVENT_TIME,
    PROCESSING_TIME,
    QUEUES,
    FiredTimer,
    TimerService,
    TimerTable,
    Watermark,
    decode_member,
)

__all__ = ["END_OF_TIME", "Emitted", "JobHarness", "PendingTimer"]

R = TypeVar("R")
H = TypeVar("H")
Domain = Literal["event", "processing"]

_FIRE_BATCH = 256
"""Timers fired per look at the table, as a key group does: a timer registered for a time
already due by one of them fires after the rest of those already found."""


class Emitted(NamedTuple):
    """One output: ``output`` is ``None`` for the job's sink, else the side output's name.
    A tuple, so it compares equal to ``(output, value)``."""

    output: str | None
    value: Any


class PendingTimer(NamedTuple):
    """A registered timer that has not fired."""

    domain: Domain
    time: int
    key: Any
    payload: Any


AnyState = ValueState[Any] | MapState[Any, Any] | ListState[Any]


class _Context(BytesAccess):
    """The ``ctx`` the job's functions get: the current key's state, outputs and timers,
    pending until the harness applies them (the function returned)."""

    def __init__(self, harness: JobHarness[Any]) -> None:
        self._harness = harness
        self._declared = frozenset(harness.job.state_names)
        self._handles: dict[Any, Any] = {}
        self._key: Any = None
        self._key_bytes = b""
        self._offset = 0
        self._timestamp: int | None = None
        self.pending: dict[str, bytes | None] = {}
        self.outputs: list[Emitted] = []
        self._timers = TimerService()

    def begin(self, key: Any, key_bytes: bytes, offset: int, timestamp: int | None) -> None:
        self._key, self._key_bytes = key, key_bytes
        self._offset, self._timestamp = offset, timestamp
        self.pending = {}
        self.outputs = []
        self._timers = TimerService()

    def apply(self) -> None:
        """The function returned: its writes, outputs and timer changes take effect."""
        h = self._harness
        if self.pending:
            stored = h._stored.setdefault(self._key_bytes, {})
            for state, raw in self.pending.items():
                if raw is None:
                    stored.pop(state, None)
                else:
                    stored[state] = raw
            if not stored:
                del h._stored[self._key_bytes]
        h.outputs.extend(self.outputs)
        self._timers.apply(h._table, self._key_bytes)
        h._table.committed()  # nothing to commit them to: forget the changes

    # -- Context ---------------------------------------------------------------------
    @property
    def key(self) -> Any:
        return self._key

    @property
    def key_group(self) -> int:
        return self._harness.key_group

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def timestamp(self) -> int | None:
        return self._timestamp

    @property
    def watermark(self) -> int | None:
        return self._harness.watermark if self._harness.job.on_timer is not None else None

    @property
    def timers(self) -> TimerService:
        return self._timers

    def state(self, spec: StateSpec[H]) -> H:
        handle = self._handles.get(spec)
        if handle is None:
            if spec.name not in self._declared:
                raise ValueError(f"state {spec.name!r} is not declared: add it to the Job's states")
            handle = self._handles[spec] = spec.bind(self)
        return cast(H, handle)

    def emit(self, value: Any, output: str | None = None) -> None:
        self.outputs.append(Emitted(output, value))

    # -- StateAccess -------------------------------------------------------------------
    def read(self, state: str) -> bytes | None:
        if state in self.pending:
            return self.pending[state]
        return self._harness._stored.get(self._key_bytes, {}).get(state)

    def write(self, state: str, value: bytes | None) -> None:
        self.pending[state] = value

    def names(self) -> Iterable[str]:
        return {*self._harness._stored.get(self._key_bytes, {}), *self.pending}


class _ReadOnly(BytesAccess):
    def __init__(self, stored: dict[str, bytes]) -> None:
        self._stored = stored

    def read(self, state: str) -> bytes | None:
        return self._stored.get(state)

    def names(self) -> Iterable[str]:
        return self._stored

    def write(self, state: str, value: bytes | None) -> None:
        raise TypeError("JobHarness.state only reads: the job writes state")


class JobHarness(Generic[R]):
    """Runs ``job`` as one key group (number ``key_group``) in memory; see the module.

    ``out_of_orderness_ms``: the watermark trails the largest event time seen by this much
    (the manifest's ``spec.time.outOfOrderness``).  ``processing_time_ms``: where the
    processing-time clock starts (default: now).
    """

    def __init__(
        self,
        job: Job[R],
        *,
        out_of_orderness_ms: int = 0,
        key_group: int = 0,
        processing_time_ms: int | None = None,
    ) -> None:
        if out_of_orderness_ms < 0:
            raise ValueError(f"out_of_orderness_ms must be >= 0, got {out_of_orderness_ms}")
        self.job = job
        self.key_group = key_group
        self.outputs: list[Emitted] = []
        """Every output so far, in the order emitted: ``(output, value)`` pairs, ``output``
        ``None`` for the main output (the sink), else the side output's name."""
        self._stored: dict[bytes, dict[str, bytes]] = {}
        self._table = TimerTable()
        self._watermark = Watermark(out_of_orderness=out_of_orderness_ms / 1000)
        self._now = int(time.time() * 1000) if processing_time_ms is None else processing_time_ms
        self._offset = 0
        self._ctx = _Context(self)

    # -- the clocks --------------------------------------------------------------------
    @property
    def watermark(self) -> int | None:
        """The key group's watermark (ms), ``None`` before the first event time."""
        return self._watermark.value

    @property
    def processing_time(self) -> int:
        """The harness's processing-time clock (ms)."""
        return self._now

    @property
    def offset(self) -> int:
        """The offset of the next record (records are numbered from 0)."""
        return self._offset

    # -- driving -----------------------------------------------------------------------
    def process(self, record: R, timestamp: int | None = None) -> list[Emitted]:
        """Process one record, then fire the event-time timers its event time made due.
        ``timestamp``: its event time (ms), used when the job has no ``timestamp``
        extractor.  Returns the outputs of the record and of those timers."""
        start = len(self.outputs)
        job = self.job
        key: Hashable = job.key_by(record)
        key_bytes = encode_key(key)
        event_time: int | None = None
        if job.on_timer is not None:  # as in the worker: event time only for a timed job
            event_time = job.timestamp(record) if job.timestamp is not None else timestamp
        ctx = self._ctx
        ctx.begin(key, key_bytes, self._offset, event_time)
        job.process(record, ctx)
        ctx.apply()
        self._offset += 1
        if event_time is not None:
            self._watermark.observe(event_time, time.time())
            self._fire(EVENT_TIME)
        return self.outputs[start:]

    def run(
        self,
        records: Iterable[R],
        *,
        timestamps: Iterable[int | None] | None = None,
        end_input: bool = False,
    ) -> list[Emitted]:
        """:meth:`process` each record (with its event time from ``timestamps``, in the
        same order); with ``end_input``, then :meth:`end_input`.  Returns the outputs."""
        start = len(self.outputs)
        items = list(records)
        times: list[int | None] = [None] * len(items) if timestamps is None else list(timestamps)
        if len(times) != len(items):
            raise ValueError(f"{len(items)} records but {len(times)} timestamps")
        for record, ts in zip(items, times, strict=True):
            self.process(record, ts)
        if end_input:
            self.end_input()
        return self.outputs[start:]

    def advance_watermark(self, to_ms: int) -> list[Emitted]:
        """Move the watermark to ``to_ms`` (never back) and fire the event-time timers it
        passed; returns their outputs."""
        start = len(self.outputs)
        if self._watermark.value is None or to_ms > self._watermark.value:
            self._watermark.value = to_ms
        self._fire(EVENT_TIME)
        return self.outputs[start:]

    def end_input(self) -> list[Emitted]:
        """The bounded input ended: the watermark jumps to ``END_OF_TIME`` and every
        event-time timer fires (processing-time ones wait for their time, as in a worker)."""
        return self.advance_watermark(END_OF_TIME)

    def advance_processing_time(self, to_ms: int) -> list[Emitted]:
        """Move the processing-time clock to ``to_ms`` (never back) and fire the
        processing-time timers due by then; returns their outputs."""
        start = len(self.outputs)
        self._now = max(self._now, to_ms)
        self._fire(PROCESSING_TIME)
        return self.outputs[start:]

    def _fire(self, queue: Domain) -> None:
        """Fire ``queue``'s due timers in (time, key) order, as a key group does."""
        on_timer = self.job.on_timer
        until = self._now if queue == PROCESSING_TIME else self._watermark.value
        if on_timer is None or until is None:
            return
        ctx = self._ctx
        table = self._table
        while due := table.peek_due(queue, until, _FIRE_BATCH):
            for time_ms, key_bytes, member in due:
                _, _, payload = decode_member(member)
                key = decode_key(key_bytes)
                ctx.begin(key, key_bytes, self._offset, time_ms)
                on_timer(FiredTimer(queue, time_ms, key, payload, member), ctx)
                table.pop_fired(queue, key_bytes, time_ms, member)
                ctx.apply()

    # -- what the job left ---------------------------------------------------------------
    def output(self, name: str | None = None) -> list[Any]:
        """The values emitted so far to the output ``name`` (``None``: the main output)."""
        return [e.value for e in self.outputs if e.output == name]

    def _spec(self, state: AnyState | str) -> AnyState:
        if not isinstance(state, str):
            return state
        for spec in self.job.states:
            if spec.name == state:
                return spec
        raise KeyError(f"job {self.job.name!r} declares no state {state!r}")

    def state(self, state: AnyState | str, key: Hashable) -> Any:
        """The state ``state`` (its declaration or name) of ``key``, decoded: a
        ``ValueState``'s value (its default when never written), a ``MapState``'s
        ``dict``, a ``ListState``'s ``list`` (empty when never written)."""
        spec = self._spec(state)
        access = _ReadOnly(self._stored.get(encode_key(key), {}))
        if isinstance(spec, ValueState):
            return spec.bind(access).value()
        if isinstance(spec, MapState):
            return dict(spec.bind(access).items())
        return spec.bind(access).get()

    def keys(self, state: AnyState | str | None = None) -> list[Any]:
        """The keys with a stored value of ``state`` (``None``: of any state); sorted
        when they can be."""
        name = None if state is None else self._spec(state).name
        found = [
            decode_key(kb) for kb, held in self._stored.items() if name is None or name in held
        ]
        try:
            return sorted(found)
        except TypeError:
            return found

    def timers(self, domain: Domain | None = None) -> list[PendingTimer]:
        """The registered timers that have not fired (of ``domain``, or all), by domain
        (event time first), time and key."""
        out: list[PendingTimer] = []
        for queue in QUEUES if domain is None else (domain,):
            for time_ms, key_bytes, member in self._table.peek_due(queue, 2**63, len(self._table)):
                _, _, payload = decode_member(member)
                key = decode_key(key_bytes)
                out.append(PendingTimer(cast(Domain, queue), time_ms, key, payload))
        return out
