"""Processing of one key group: read a batch, load its state, run the user
function per record, checkpoint (flush the sink, then commit), release.

A :class:`KeyGroupRunner` holds a claim (epoch, token) and the commit sequence.
Its task ends with a :class:`RunnerOutcome`: released (handoff), fenced (the store
rejected a commit: the cache of the key group is dropped), or stopped (worker
shutdown).  A user-function error under ``errorPolicy: fail`` checkpoints the
records before the failing one and parks the key group, still owned, until the
assignment moves it; ``skip`` counts and logs the record and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from keyshift.errors import KeyshiftError
from keyshift.runtime.aio import Wakeup
from keyshift.runtime.api import (
    CorruptState,
    Job,
    ListState,
    MapState,
    StateTooLarge,
    ValueState,
    decode_key,
    encode_key,
    now_ms,
    split_expiry,
)
from keyshift.runtime.cache import LISTING, MISSING, Entry, StateCache, Undecodable, entry_size
from keyshift.runtime.faults import crash_point
from keyshift.runtime.metrics import WorkerMetrics
from keyshift.runtime.sinks import Outputs, SinkUnavailable, TimerOrigin
from keyshift.runtime.sources import Poison, Source, SourceBatch
from keyshift.runtime.store import WorkerStore
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
from keyshift.runtime.turns import Turns
from keyshift.store.protocol import Claim, Fenced, StoreError, StoreUnavailable

log = logging.getLogger("keyshift.runtime")

_value_encoder = msgspec.msgpack.Encoder()
"""Encodes the values the cache keeps decoded, when their key group commits."""

BATCH_SECONDS = 0.02
"""Longest stretch one key group processes before yielding the event loop: with slow
user functions, a batch of ``batchSize`` records could hold the loop for seconds, and
the other key groups, the assignment watcher and handoffs would wait behind it."""


LOAD_ROUNDS = 3
"""How often a batch's load looks again for what other key groups evicted meanwhile."""

LIST_PAGE = 1000
"""Entries per store read when a map is listed for iteration."""

IDLE_SECONDS = 1.0
"""How long an idle key group (caught up, all committed) sleeps at most when nothing wakes
it: new records (the source's ``on_data``), a control request or a due timer do."""

SWEEP_SECONDS = 1.0
"""How often a key group with expiring state (``ValueState(ttl=...)``) looks for expired
values in the store, one page of each such state at a time."""

SWEEP_PAGE = 1000
"""Values per state a sweep looks at (a hint to the store's HSCAN)."""

FENCE_CHECK_SECONDS = 2.0
"""How often a key group with nothing to commit asks the store whether it still holds its
fence and sequence (and at once after the worker reconnects): a store that lost its claim
or acknowledged commits (an older AOF, a failover to a lagging replica) is noticed within
this time even when no commit would be fenced."""


class RunnerOutcome(enum.Enum):
    RELEASED = "released"
    FENCED = "fenced"
    STOPPED = "stopped"


@dataclass(frozen=True)
class RunnerResult:
    key_group: int
    outcome: RunnerOutcome
    fenced: Fenced | None = None

    @property
    def store_lost_commit(self) -> bool:
        """Fenced because the store lost data (not because someone else claimed)."""
        f = self.fenced
        return f is not None and (f.reason == "sequence" or f.stored_epoch < f.expected_epoch)


@dataclass(frozen=True)
class RuntimeDeps:
    """What every runner of a worker shares."""

    job_name: str
    job: Job[Any]
    store: WorkerStore
    cache: StateCache
    outputs: Outputs
    source: Source
    metrics: WorkerMetrics
    checkpoint_interval: float
    batch_size: int
    error_policy: Literal["fail", "skip"]
    on_poison: Literal["fail", "skip", "dead-letter"] = "fail"
    out_of_orderness: float = 0.0
    idle_timeout: float = 10.0
    turns: Turns = field(default_factory=Turns)


class _NotLoaded(BaseException):
    """A declared state of the current key was evicted before use: reload, retry the record.

    A ``BaseException`` so that a user function's ``except Exception`` cannot
    swallow it.
    """


class RecordContext:
    """The ``ctx`` of a process function; reused for every record of a key group.

    A record's writes go straight into the cache's entries (:class:`Entry`), so a read
    is one list index; what a record changes is saved first (its entry's values as they
    were), and undone if the record does not succeed (:meth:`rollback`), so that a
    failed record changes nothing. The entries a batch wrote are accounted in the cache
    once, at the end of the batch (:meth:`flush`). A ``ValueState`` of an immutable type
    is kept decoded in the cache; any other value is stored encoded at ``update`` and
    decoded on every read, so that a value changed in place but not updated changes
    nothing.
    """

    __slots__ = (
        "_bits",
        "_cache",
        "_declared",
        "_entry",
        "_entry_writes",
        "_handles",
        "_kept",
        "_key",
        "_key_bytes",
        "_kg",
        "_mark",
        "_more_saved",
        "_offset",
        "_outputs",
        "_saved_dirty",
        "_saved_entry",
        "_saved_values",
        "_sids",
        "_timers",
        "_timestamp",
        "_touched",
        "_watermark",
        "stamp",
        "too_large",
        "wanted_entries",
        "wanted_listings",
    )

    def __init__(
        self,
        key_group: int,
        cache: StateCache,
        states: Sequence[ValueState[Any] | MapState[Any, Any] | ListState[Any]],
        watermark: Watermark | None = None,
    ) -> None:
        self._kg = key_group
        self._cache = cache
        self._declared = frozenset(s.name for s in states)
        self._sids: dict[str, int] = {}
        for spec in states:
            if isinstance(spec, ValueState) and spec.kept_decoded:
                sid = cache.register(
                    spec.name, encode=_value_encoder.encode, decode=spec.decode_value
                )
            else:
                sid = cache.register(spec.name)
            self._sids[spec.name] = sid
            if isinstance(spec, MapState):
                cache.register(LISTING + spec.name)
        count = max(self._sids.values(), default=-1) + 1
        self._kept = [cache.decoded(name) for name in cache.state_names[:count]]
        self._bits = [1 << sid for sid in range(count)]
        self._handles: dict[Any, Any] = {}
        self._key: Any = None
        self._key_bytes = b""
        self._offset = 0
        self._entry: Entry | None = None
        """The current key's entry (None: not looked up yet)."""
        self._saved_entry: Entry | None = None
        """The entry the current record wrote first, and its values and dirty bits as
        they were before (what :meth:`rollback` puts back)."""
        self._saved_values: list[object] = []
        self._saved_dirty = 0
        self._more_saved: list[tuple[Entry, list[object], int]] = []
        """The same for the other entries the record wrote (map entries)."""
        self._entry_writes: list[tuple[str, bytes, bool]] = []
        """The record's writes of entries of the current key: (state, entry, present),
        for the listings (:meth:`apply`)."""
        self._touched: list[Entry] = []
        """The entries the batch wrote, once each, for :meth:`flush`."""
        self._mark = cache.new_stamp()
        self.stamp = 0
        """The stamp of the batch's load: its entries are spared by evictions until the
        next load."""
        self._outputs: list[Any] = []
        self._timers = TimerService()
        self._timestamp: int | None = None
        self._watermark = watermark or Watermark()
        self.wanted_entries: dict[str, list[bytes]] = {}
        """Entries read but not cached (state -> slot keys): the runner loads them and runs
        the record again."""
        self.wanted_listings: set[tuple[str, bytes]] = set()
        """Maps iterated but not listed in the cache: (state, key)."""
        self.too_large: dict[tuple[str, bytes], str] = {}
        """Maps too large to iterate in the cache: (state, key) -> why."""

    def begin(
        self,
        key: Hashable,
        key_bytes: bytes,
        offset: int,
        timestamp: int | None = None,
        entry: Entry | None = None,
    ) -> None:
        """The next record (or timer) of key ``key``; ``entry``: its entry if known."""
        self._key = key
        self._key_bytes = key_bytes
        self._offset = offset
        self._timestamp = timestamp
        self._entry = entry
        self._saved_entry = None
        if self._more_saved:
            self._more_saved = []
        if self._entry_writes:
            self._entry_writes = []
        if self._timers.ops:
            self._timers.ops = []
        if self._outputs:
            self._outputs = []

    # -- Context ---------------------------------------------------------------
    @property
    def key(self) -> Any:
        return self._key

    @property
    def key_group(self) -> int:
        return self._kg

    @property
    def offset(self) -> int:
        return self._offset

    def state(self, spec: Any) -> Any:
        handle = self._handles.get(spec)
        if handle is None:
            if spec.name not in self._declared:
                raise ValueError(f"state {spec.name!r} is not declared: add it to the Job's states")
            handle = self._handles[spec] = spec.bind(self)
        return handle

    def emit(self, value: Any, output: str | None = None) -> None:
        self._outputs.append((output, value))

    @property
    def timestamp(self) -> int | None:
        return self._timestamp

    @property
    def watermark(self) -> int | None:
        return self._watermark.value

    @property
    def timers(self) -> TimerService:
        return self._timers

    # -- StateAccess -------------------------------------------------------------
    def _stored(self, sid: int) -> object:
        """The current key's cached value of state ``sid``; raise :class:`_NotLoaded`."""
        entry = self._entry
        if entry is None:
            entry = self._cache.entry(self._kg, self._key_bytes)
            if entry is None:
                raise _NotLoaded
            self._entry = entry
        values = entry.values
        if sid >= len(values):
            raise _NotLoaded
        value = values[sid]
        if value is MISSING:
            raise _NotLoaded
        return value

    def _writable(self, key: bytes, current: bool) -> Entry:
        """The entry of slot key ``key`` (``current``: the current key's), saved for
        :meth:`rollback` before the record's first write of it."""
        entry = self._entry if current else None
        if entry is None or entry.gone:
            entry = self._cache.entry_for_write(self._kg, key)
            if current:
                self._entry = entry
        if entry is not self._saved_entry:
            self._save(entry)
        return entry

    def _save(self, entry: Entry) -> None:
        if self._saved_entry is None:
            self._saved_entry = entry
            self._saved_values = list(entry.values)
            self._saved_dirty = entry.dirty
        elif all(saved is not entry for saved, _, _ in self._more_saved):
            self._more_saved.append((entry, list(entry.values), entry.dirty))
        if entry.mark != self._mark:
            entry.mark = self._mark
            self._touched.append(entry)

    def _set(self, entry: Entry, sid: int, value: object) -> None:
        values = entry.values
        if sid >= len(values):
            values.extend([MISSING] * (sid + 1 - len(values)))
        values[sid] = value
        entry.dirty |= 1 << sid

    def read(self, state: str) -> bytes | None:
        value = self._stored(self._sids[state])
        return value  # type: ignore[return-value]  # a state read as bytes is stored so

    def write(self, state: str, value: bytes | None) -> None:
        self._set(self._writable(self._key_bytes, True), self._sids[state], value)

    def read_value(self, spec: ValueState[Any]) -> Any:
        sid = self._sids[spec.name]
        value = self._stored(sid)
        if value is None:
            return spec.default
        if self._kept[sid]:
            if isinstance(value, Undecodable):
                raise CorruptState(spec.name, value.raw, value.error)
            return value
        return spec._decode(value)  # type: ignore[arg-type]

    def write_value(self, spec: ValueState[Any], value: Any) -> None:
        sid = self._sids[spec.name]
        stored: object = spec.coerce(value) if self._kept[sid] else spec.encode(value)
        entry = self._entry
        if entry is None or entry.gone or entry is not self._saved_entry:
            entry = self._writable(self._key_bytes, True)
        values = entry.values
        if sid < len(values):
            values[sid] = stored
            entry.dirty |= self._bits[sid]
        else:
            self._set(entry, sid, stored)

    def clear_value(self, spec: ValueState[Any]) -> None:
        self._set(self._writable(self._key_bytes, True), self._sids[spec.name], None)

    def read_entries(self, state: str, entries: Sequence[bytes]) -> list[bytes | None]:
        kb = self._key_bytes
        cache = self._cache
        sid = self._sids[state]
        kg = self._kg
        stamp = self.stamp
        out: list[bytes | None] = []
        missing: list[bytes] | None = None
        for entry in entries:
            slot_key = kb + entry
            found = cache.entry(kg, slot_key)
            value: object = MISSING
            if found is not None:
                found.stamp = stamp  # needed by this batch: spared by its next load too
                if sid < len(found.values):
                    value = found.values[sid]
            if value is MISSING:
                if missing is None:
                    missing = []
                missing.append(slot_key)
            else:
                out.append(value)  # type: ignore[arg-type]
        if missing:
            self.wanted_entries.setdefault(state, []).extend(missing)
            raise _NotLoaded
        cache.hits += len(out)  # a miss is counted where it is loaded
        return out

    def write_entry(self, state: str, entry: bytes, value: bytes | None) -> None:
        self._set(self._writable(self._key_bytes + entry, False), self._sids[state], value)
        self._entry_writes.append((state, entry, value is not None))

    def entry_keys(self, state: str) -> list[bytes]:
        kb = self._key_bytes
        listing = self._cache.listing(self._kg, state, kb)
        if listing is None:
            why = self.too_large.pop((state, kb), None)
            if why is not None:
                raise StateTooLarge(why)
            self.wanted_listings.add((state, kb))
            raise _NotLoaded
        keys = listing.sorted()
        written = [(e, present) for s, e, present in self._entry_writes if s == state]
        if written:  # this record's own writes (the batch's are in the listing)
            changed = set(keys)
            for entry, present in written:
                if present:
                    changed.add(entry)
                else:
                    changed.discard(entry)
            keys = sorted(changed)
        return keys

    # -- the runner's side ----------------------------------------------------------
    def apply(self) -> None:
        """The current record (or timer) succeeded and wrote entries of collections: keep
        the cached listings of its key true."""
        listing_write = self._cache.listing_write
        kg = self._kg
        kb = self._key_bytes
        for state, entry, present in self._entry_writes:
            listing_write(kg, state, kb, entry, present)
        self._entry_writes = []

    def rollback(self) -> None:
        """The current record did not succeed: put back what it wrote."""
        for entry, values, dirty in reversed(self._more_saved):
            entry.values[:] = values
            entry.dirty = dirty
        self._more_saved = []
        saved = self._saved_entry
        if saved is not None:
            saved.values[:] = self._saved_values
            saved.dirty = self._saved_dirty
            self._saved_entry = None
        self._entry_writes = []

    def flush(self) -> None:
        """Account the batch's writes in the cache (dirty until the next commit)."""
        if self._touched:
            self._cache.written(self._kg, self._touched, protect=self.stamp)
            self._touched = []
        self._mark = self._cache.new_stamp()
        self._saved_entry = None  # a record after this one saves anew

    def discard(self) -> None:
        """Forget the batch's writes and wants (the cache was dropped)."""
        self._touched = []
        self._saved_entry = None
        self._more_saved = []
        self._entry_writes = []
        self.wanted_entries = {}
        self.wanted_listings = set()
        self.too_large = {}


class UserFunctionError(KeyshiftError):
    def __init__(self, key_group: int, offset: int, cause: BaseException) -> None:
        self.key_group = key_group
        self.offset = offset
        self.cause = cause
        super().__init__(
            f"user function failed on key group {key_group} offset {offset}: "
            f"{type(cause).__name__}: {cause}"
        )


class PoisonRecordError(KeyshiftError):
    """A record that cannot be decoded stopped its key group (``onPoison: fail``)."""

    def __init__(self, poison: Poison) -> None:
        self.key_group = poison.key_group
        self.offset = poison.offset
        super().__init__(
            f"poison record at key group {poison.key_group} offset {poison.offset}: {poison.error}"
        )


class CorruptStateError(KeyshiftError):
    """A state value in the store that its codec cannot decode stopped the key group:
    a store error, whatever ``errorPolicy`` says; nothing is committed past the key
    group's last commit."""

    def __init__(self, key_group: int, offset: int, key: Any, cause: CorruptState) -> None:
        self.key_group = key_group
        self.offset = offset
        self.state = cause.state
        self.key = key
        self.cause = cause
        error = cause.error
        super().__init__(
            f"corrupt state in the store: key group {key_group}, state {cause.state!r}, key "
            f"{key!r}: {len(cause.raw)} bytes the state cannot decode "
            f"({type(error).__name__}: {error}), read at offset {offset}"
        )


class StateLayoutError(KeyshiftError):
    """The store holds a map or list state of this job in another layout (one value per
    key, from a keyshift before per-entry collections): the key group stops rather than
    misread it, until the state is migrated (``keyshift store migrate-entries``)."""

    def __init__(self, key_group: int, offset: int, states: dict[str, str]) -> None:
        self.key_group = key_group
        self.offset = offset
        self.states = states
        names = ", ".join(repr(s) for s in states)
        options = " ".join(f"--{kind} {name}" for name, kind in states.items())
        super().__init__(
            f"key group {key_group}: state {names} is stored one value per key, the layout of "
            "keyshift before maps and lists were stored per entry; stop the job, run "
            f"'keyshift store migrate-entries <job> {options}' (docs/install.md, \"Upgrade\"), and "
            "start it again"
        )


def stale_layout(job: Job[Any], claim: Claim) -> dict[str, str] | None:
    """The job's map and list states (name -> ``map`` or ``list``) that the store holds in
    the per-key layout, if any."""
    stale = {
        spec.name: "map" if isinstance(spec, MapState) else "list"
        for spec in job.states
        if spec.name in job.entry_states
        and spec.name in claim.states
        and spec.name not in claim.entry_states
    }
    return stale or None


Failure = UserFunctionError | PoisonRecordError | CorruptStateError | StateLayoutError


class KeyGroupRunner:
    def __init__(
        self, deps: RuntimeDeps, claim: Claim, *, learned: float | None = None, via: str = ""
    ) -> None:
        self.deps = deps
        self.key_group = claim.key_group
        self.epoch = claim.epoch
        self.token = claim.token
        self.seq = claim.seq
        self.position = claim.position
        self.committed_position = claim.position
        self.failed: Failure | None = None
        self.release_generation: int | None = None
        self.stopping = False
        self._wake = Wakeup()
        self._loop = asyncio.get_running_loop()
        # spread the key groups' checkpoints over the interval, so that their
        # commits do not all queue at the store at once
        phase = (self.key_group * 0.618034) % 1.0
        self._last_checkpoint = time.monotonic() - phase * deps.checkpoint_interval
        self.timed = deps.job.on_timer is not None
        self.watermark = Watermark(
            out_of_orderness=deps.out_of_orderness,
            idle_timeout=deps.idle_timeout,
            value=claim.watermark,
        )
        self.committed_watermark = claim.watermark
        self._fence_checked = time.monotonic()
        self._check_fence_now = False
        self._commit_in_doubt = False
        """A commit failed with the store unreachable: it may have been applied."""
        self.confirmed = False
        """Whether the store has accepted a commit or confirmed the fence since the claim."""
        self.timers = TimerTable()
        self._timers_loaded = not self.timed
        self._timer_queues = [q for q in QUEUES if q in claim.timer_queues]
        """The queues with stored timers: the others are empty, no need to read them."""
        self.timers_fired = 0
        self._fired_at_commit = 0
        self._ctx = RecordContext(self.key_group, deps.cache, deps.job.states, self.watermark)
        self._load_again = False
        """The last batch (or timer) stopped at its first record for state not loaded: the
        next load keeps the stamp of the last, so that what both load stays in the cache
        together (a batch whose state is larger than the cache still progresses)."""
        self._loaded_entries: dict[str, list[bytes]] = {}
        self._loaded_listings: set[tuple[str, bytes]] = set()
        """The entries and map listings the last load was asked for.  When its batch did
        nothing (``_load_again``), other key groups ran before the next load and may have
        evicted them: the next load asks for them again with what is newly wanted, so that
        the first record's whole state comes in one load (two key groups sharing a cache
        too small for both could otherwise evict each other's forever)."""
        self._entry_states = deps.job.entry_states
        self._keyed_states = [s.name for s in deps.job.states if not isinstance(s, MapState)]
        """The states with a value per key (a map has entries only; a list, its length)."""
        self._expiring = [
            s.name
            for s in deps.job.states
            if isinstance(s, (ValueState, MapState, ListState)) and s.ttl_ms is not None
        ]
        """The states whose values (map entries, list elements and lengths) expire: swept
        every :data:`SWEEP_SECONDS`. An entry's field in the store is its cache slot's key."""
        self._sweep_cursors: dict[str, int] = {}
        self._last_sweep = time.monotonic()
        layout = stale_layout(deps.job, claim)
        if layout is not None:
            self.failed = StateLayoutError(self.key_group, claim.position, layout)
            log.error("%s", self.failed)
        self.records_processed = 0
        self.handoff_marks: dict[str, float] = {} if learned is None else {"learned": learned}
        """This owner's handoff timeline (unix times): after the claim ``learned`` (of the
        release), ``loaded``, ``first_batch`` (recorded in the store after the first batch);
        when releasing ``release_requested``, ``batch_ended``, ``flushed``, ``committed``
        (sent with the release)."""
        self._via = via
        self._handoff_recorded = False

    # -- control (called by the worker) -----------------------------------------

    def request_release(self, generation: int) -> None:
        """Finish the batch, flush, commit, mark released at ``generation``, drop the cache."""
        if self.release_generation is None:
            self.handoff_marks = {"release_requested": time.time()}
            self.deps.turns.handoff_started(self.key_group)
        self.release_generation = generation
        self._wake.set()

    def request_stop(self) -> None:
        """Checkpoint and stop without releasing (worker shutdown)."""
        self.stopping = True
        self._wake.set()

    def request_fence_check(self) -> None:
        """Ask the store soon whether it still holds this fence (after a reconnect)."""
        self._check_fence_now = True
        self._wake.set()

    def data_arrived(self) -> None:
        """Records arrived for this key group: wake it if it waits for some.  Thread-safe
        (the Kafka source calls it from its poll thread)."""
        self._loop.call_soon_threadsafe(self._wake.set)

    @property
    def releasing(self) -> bool:
        return self.release_generation is not None

    @property
    def finished(self) -> bool:
        """Its bounded input ended, every record and timer is processed, all committed."""
        return (
            self.failed is None
            and self._timers_loaded
            and self.deps.source.exhausted(self.key_group, self.position)
            and not self._uncommitted()
            and all(self.timers.next_time(q) is None for q in QUEUES)
        )

    # -- the loop -----------------------------------------------------------------

    async def run(self) -> RunnerResult:
        deps = self.deps
        kg = self.key_group
        try:
            while True:
                try:
                    if self.release_generation is not None:
                        if "batch_ended" not in self.handoff_marks:
                            # a checkpoint during the batch flushed and committed before
                            self.handoff_marks.pop("flushed", None)
                            self.handoff_marks.pop("committed", None)
                            self.handoff_marks["batch_ended"] = time.time()
                        await self._release(self.release_generation)
                        return RunnerResult(kg, RunnerOutcome.RELEASED)
                    if self.stopping:
                        if self.failed is None:
                            await self.checkpoint()
                        return RunnerResult(kg, RunnerOutcome.STOPPED)
                    if self.failed is not None:  # parked: its lag still shows
                        deps.turns.leave(kg)
                        now = time.time()
                        deps.metrics.source(kg, deps.source.end_offset(kg, now), self.position)
                        await self._wait(IDLE_SECONDS)
                        continue
                    await self._step()
                except (StoreUnavailable, SinkUnavailable) as exc:
                    log.warning("key group %d: %s; retrying", kg, exc)
                    await self._wait(1.0)
        except Fenced as fenced:
            deps.metrics.commits_fenced.inc()
            deps.cache.drop(kg)
            result = RunnerResult(kg, RunnerOutcome.FENCED, fenced)
            if self._commit_in_doubt and fenced.stored_seq == fenced.expected_seq + 1:
                log.warning(
                    "key group %d: its commit %d was applied although its reply was lost; "
                    "replaying from the store's position", kg, fenced.expected_seq,
                )  # fmt: skip
            elif result.store_lost_commit:
                deps.metrics.commits_lost.inc()
                log.warning("key group %d: the store lost its acknowledged commits or claim "
                            "(%s); replaying from what the store holds", kg, fenced)  # fmt: skip
            else:
                log.warning("key group %d fenced: %s", kg, fenced)
            return result
        except asyncio.CancelledError:
            deps.cache.drop(kg)
            raise
        finally:
            deps.turns.leave(kg)
            deps.turns.handoff_finished(kg)  # released, or stopped trying
            deps.source.unassign(kg)
            deps.metrics.forget_key_group(kg)

    async def _step(self) -> None:
        deps = self.deps
        kg = self.key_group
        now = time.time()
        if not self._timers_loaded:
            for queue in self._timer_queues:
                found = await deps.store.due_timers(
                    deps.job_name, kg, queue, END_OF_TIME, limit=1 << 30
                )
                self.timers.load(queue, found)
            self._timers_loaded = True
        end = deps.source.available(kg, now)
        deps.metrics.source(kg, deps.source.end_offset(kg, now), self.position)
        due = time.monotonic() - self._last_checkpoint >= deps.checkpoint_interval
        if self.position >= end:
            exhausted = deps.source.exhausted(kg, self.position)
            if self.timed:
                if exhausted:
                    self.watermark.end()
                elif due:
                    await self._advance_idle(now)
                await self._fire_due(now)
                if self.failed is not None:
                    await self._checkpoint_failed()
                    return
            if due or exhausted:  # a bounded source that ended: commit its tail now
                await self.checkpoint()
            await self._check_fence()
            if not self._handoff_recorded:
                await self._record_handoff(time.time(), None)
            deps.turns.leave(kg)
            now = time.time()  # after the awaits: idle key groups wake at the same instant
            if exhausted:
                until_data = IDLE_SECONDS  # a bounded source: nothing more will come
            else:
                until_data = deps.source.when_available(kg, self.position, now) - now
            if self.timed:
                next_processing = self.timers.next_time(PROCESSING_TIME)
                if next_processing is not None:
                    until_data = min(until_data, next_processing / 1000 - now)
            if self._uncommitted():
                until_checkpoint = max(
                    0.01, self._last_checkpoint + deps.checkpoint_interval - time.monotonic()
                )
            else:
                until_checkpoint = IDLE_SECONDS
            await self._wait(max(0.001, min(until_data, until_checkpoint)))
            return
        if not deps.turns.may_work(kg, urgent=not self._handoff_recorded):
            await asyncio.sleep(0)  # the others' turn, and the sockets'
            return
        # busy: the time spent on this batch on the event loop, store round trips excluded
        started = time.perf_counter()
        stop = min(end, self.position + deps.batch_size)
        if self.timed:
            waited_timers = await self._fire_due(now)
            if self.failed is not None:
                await self._checkpoint_failed()
                return
        else:
            waited_timers = 0.0
        batch = deps.source.read_batch(kg, self.position, stop)
        key_by = deps.job.key_by
        if batch.has_poison:
            keys = [None if isinstance(r, Poison) else key_by(r) for r in batch.records]
        else:
            keys = [key_by(r) for r in batch.records]
        key_bytes = [encode_key(k) for k in keys]
        waited, entries = await self._load(key_bytes)
        loaded = 0.0 if self._handoff_recorded else time.time()
        try:
            done = self._process(batch, keys, key_bytes, entries)
        finally:
            busy = time.perf_counter() - started - waited - waited_timers
            deps.metrics.busy_seconds.inc(max(0.0, busy))
            deps.turns.worked(kg, busy)
        deps.metrics.records_processed.inc(done)
        if not self._handoff_recorded:
            await self._record_handoff(loaded, time.time())
        if self.failed is not None:
            await self._checkpoint_failed()
        elif due or deps.cache.needs_checkpoint:
            await self.checkpoint()
        await asyncio.sleep(0)  # let the other key groups and the watcher run

    async def _record_handoff(self, loaded: float, first_batch: float | None) -> None:
        """Record in the store, once after the claim, when this owner learned of the
        release, loaded the first batch's state and processed it (a diagnostic: the
        controller's rescale record shows it; a failure to record changes nothing)."""
        self._handoff_recorded = True
        self.deps.turns.handoff_finished(self.key_group)  # claimed, loaded, processed
        marks = {**self.handoff_marks, "loaded": loaded}
        if first_batch is not None:
            marks["first_batch"] = first_batch
        deps = self.deps
        try:
            await deps.store.record_handoff(
                deps.job_name, self.key_group, epoch=self.epoch, token=self.token,
                marks=marks, via=self._via,
            )  # fmt: skip
        except StoreError as exc:
            log.debug("key group %d: handoff marks not recorded: %s", self.key_group, exc)

    async def _load(self, key_bytes: list[bytes]) -> tuple[float, list[Entry | None] | None]:
        """Load what the batch needs and the cache lacks: the keyed states of its keys,
        and the entries and map listings its records asked for when they last ran; return
        the seconds spent waiting for the store and the entries of ``key_bytes``, in
        order (None: not cached; or None for all: look them up).

        Everything is fetched first and put in the cache after the last fetch, with no
        wait between that and the batch's processing: while this key group waits for the
        store the others run and fill the shared cache, and could evict what it loaded.
        What they evicted meanwhile of what was cached before is fetched again (at most
        ``LOAD_ROUNDS`` times; a record that still misses something loads it next step).
        """
        deps = self.deps
        cache = deps.cache
        kg = self.key_group
        ctx = self._ctx
        keyed = self._keyed_states
        entries: dict[str, list[bytes]] = ctx.wanted_entries
        wanted_listings = ctx.wanted_listings
        ctx.wanted_entries, ctx.wanted_listings = {}, set()
        if self._load_again:  # nothing done since the last load: spare what it loaded too
            self._load_again = False
            for state, again in self._loaded_entries.items():
                entries[state] = list(dict.fromkeys([*again, *entries.get(state, ())]))
            wanted_listings |= self._loaded_listings
        else:
            ctx.stamp = cache.new_stamp()
        # the lists are replaced below, never changed in place: the dict's copy is enough
        self._loaded_entries = dict(entries)
        self._loaded_listings = wanted_listings
        listings = sorted(wanted_listings)
        stamp = ctx.stamp
        waited = 0.0
        looked: list[Entry | None] | None = None
        filled = False
        for round_ in range(LOAD_ROUNDS):
            wanted: dict[str, list[bytes]] = {}
            if keyed and key_bytes:
                looked = []
                missing = cache.missing_states(
                    kg, keyed, key_bytes, count=not round_, stamp=stamp, found=looked
                )
                wanted = {state: keys for state, keys in zip(keyed, missing, strict=True) if keys}
            for state, slot_keys in entries.items():
                missing_entries = cache.missing(kg, state, slot_keys, count=not round_, stamp=stamp)
                if missing_entries:
                    wanted[state] = [*wanted.get(state, ()), *missing_entries]
            unlisted = [
                (state, key)
                for state, key in listings
                if cache.listing(kg, state, key) is None and (state, key) not in ctx.too_large
            ]
            if not wanted and not unlisted:
                break
            evictions = cache.evictions
            before = time.perf_counter()
            found = await deps.store.get_states(deps.job_name, kg, wanted)
            listed = [(state, key, await self._list_entries(state, key)) for state, key in unlisted]
            waited += time.perf_counter() - before
            # no wait from here to the batch's processing
            evicted_meanwhile = cache.evictions != evictions
            if evicted_meanwhile:
                looked = None  # it may hold entries evicted meanwhile: look again
            for state, keys in wanted.items():
                cache.fill(kg, state, keys, found[state], protect=stamp)
                filled = True
            for state, key, stored in listed:
                if stored is not None:
                    self._put_listing(state, key, stored, stamp)
                    entries[state] = [*entries.get(state, ()), *stored]
            if not evicted_meanwhile and not listed:
                break  # what was cached before is still there: all is loaded
        deps.metrics.cache_counts(cache.hits, cache.misses)
        if looked is not None and filled:  # the entries found spared by the stamp: add the new
            for i, entry in enumerate(looked):
                if entry is None:
                    looked[i] = cache.entry(kg, key_bytes[i])
        return waited, looked

    def _put_listing(
        self, state: str, key: bytes, stored: dict[bytes, bytes], protect: int
    ) -> None:
        """Cache the stored entries of ``key`` in the map ``state`` and its listing: their
        entry keys, with the uncommitted writes (they are in the cache, dirty)."""
        cache = self.deps.cache
        kg = self.key_group
        slot_keys = list(stored)
        cache.fill(kg, state, slot_keys, stored, protect=protect)
        start = len(key)
        entries = {k[start:] for k in slot_keys}
        for entry, value in cache.dirty_entries(kg, state, key):
            if value is None:
                entries.discard(entry)
            else:
                entries.add(entry)
        cache.put_listing(kg, state, key, entries, protect=protect)

    async def _list_entries(self, state: str, key: bytes) -> dict[bytes, bytes] | None:
        """The stored entries of ``key`` in the map ``state``, page by page; None (and a
        reason in the context) when they would take more than half the cache."""
        deps = self.deps
        limit = deps.cache.max_bytes // 2
        found: dict[bytes, bytes] = {}
        size = 0
        after: bytes | None = None
        while True:
            page = await deps.store.entries(
                deps.job_name, self.key_group, state, key, after=after, count=LIST_PAGE
            )
            for slot_key, value in page:
                found[slot_key] = value
                size += entry_size(slot_key, value)
            if size > limit:
                self._ctx.too_large[(state, key)] = (
                    f"map state {state!r} of key {decode_key(key)!r} has more than "
                    f"{len(found)} entries ({size} bytes): too large to iterate in the "
                    f"worker's state cache ({deps.cache.max_bytes} bytes, half of which it "
                    "may take); raise the cache size or keep the maps you iterate smaller "
                    "(get, put and remove work at any size)"
                )
                return None
            if len(page) < LIST_PAGE:
                return found
            after = page[-1][0]

    def _process(
        self,
        batch: SourceBatch,
        keys: Sequence[Hashable],
        key_bytes: list[bytes],
        entries: list[Entry | None] | None,
    ) -> int:
        """Run the user function over the batch's records; the number processed.
        ``entries``: those of ``key_bytes`` if the load found them (None: look up)."""
        if entries is None:
            entries = self.deps.cache.entries(self.key_group, key_bytes)
        try:
            return self._process_records(batch, keys, key_bytes, entries)
        finally:
            self._ctx.flush()

    def _process_records(
        self,
        batch: SourceBatch,
        keys: Sequence[Hashable],
        key_bytes: list[bytes],
        entries: list[Entry | None],
    ) -> int:
        deps = self.deps
        kg = self.key_group
        ctx = self._ctx
        process = deps.job.process
        outputs = deps.outputs
        offset = self.position
        done = 0
        deadline = time.perf_counter() + deps.turns.batch_seconds(BATCH_SECONDS)
        timed = self.timed
        timestamp = deps.job.timestamp
        watermark = self.watermark
        timers = self.timers
        event_time: int | None = None
        records = batch.records
        offsets = batch.offsets
        timestamps = batch.timestamps
        for i, record in enumerate(records):
            if i and not i % 16 and time.perf_counter() > deadline:
                break  # the rest next step: other key groups and the watcher get the loop
            if offsets is not None:
                offset = offsets[i]
            if batch.has_poison and isinstance(record, Poison):
                if not self._poison(record):
                    break
                offset += 1
                done += 1
                continue
            if timed:
                if timestamp is not None:
                    event_time = timestamp(record)
                elif timestamps is not None:
                    event_time = timestamps[i]
                else:
                    event_time = deps.source.event_time(kg, offset)
            ctx.begin(keys[i], key_bytes[i], offset, event_time, entries[i])
            try:
                process(record, ctx)
            except _NotLoaded:
                ctx.rollback()
                self._load_again = done == 0
                if ctx.wanted_entries or ctx.wanted_listings:
                    self._probe(batch, keys, key_bytes, i + 1, deadline)
                break  # the next step loads it
            except CorruptState as exc:
                self._corrupt(offset, ctx._key, exc)
                break
            except Exception as exc:
                ctx.rollback()
                if deps.error_policy == "fail":
                    self.failed = UserFunctionError(kg, offset, exc)
                    log.error("%s; key group %d stopped (errorPolicy fail)", self.failed, kg)
                    break
                deps.metrics.records_skipped.inc()
                log.warning(
                    "skipped record (key group %d, offset %d): %s: %s",
                    kg, offset, type(exc).__name__, exc,
                )  # fmt: skip
                offset += 1
                done += 1
                if event_time is not None:
                    watermark.observe(event_time, time.time())
                if timed and not self._fire_passed(offset):
                    break
                continue
            if ctx._entry_writes:
                ctx.apply()
            if ctx._outputs:
                outputs.emit_all(kg, offset, ctx._key, ctx._outputs)
            if ctx._timers.ops:
                ctx._timers.apply(timers, key_bytes[i])
            offset += 1
            done += 1
            if event_time is not None:
                watermark.observe(event_time, time.time())
            if timed and not self._fire_passed(offset):
                break
        if done == len(records):
            offset = max(offset, batch.next_position)
        self.position = offset
        self.records_processed += done
        return done

    def _probe(
        self,
        batch: SourceBatch,
        keys: Sequence[Hashable],
        key_bytes: list[bytes],
        start: int,
        deadline: float,
    ) -> None:
        """A record read entries that are not loaded: run the batch's next records
        without any effect (writes, outputs and timers dropped) only to learn which
        entries they read, so that one load serves the batch instead of one per record.
        They run again, for real, once loaded."""
        deps = self.deps
        ctx = self._ctx
        process = deps.job.process
        timestamp = deps.job.timestamp
        records = batch.records
        for i in range(start, len(records)):
            if not (i - start) % 16 and time.perf_counter() > deadline:
                break
            record = records[i]
            if batch.has_poison and isinstance(record, Poison):
                continue
            offset = self.position + i if batch.offsets is None else batch.offsets[i]
            event_time: int | None = None
            if self.timed:
                if timestamp is not None:
                    try:
                        event_time = timestamp(record)
                    except Exception:
                        continue
                elif batch.timestamps is not None:
                    event_time = batch.timestamps[i]
                else:
                    event_time = deps.source.event_time(self.key_group, offset)
            ctx.begin(keys[i], key_bytes[i], offset, event_time)
            with contextlib.suppress(_NotLoaded, CorruptState, Exception):
                process(record, ctx)
            ctx.rollback()  # nothing of the probe stays
        ctx.begin(None, b"", self.position)

    def _poison(self, poison: Poison) -> bool:
        """Apply ``onPoison`` to an undecodable record; False: the key group stops."""
        deps = self.deps
        policy = deps.on_poison
        if policy == "fail":
            self.failed = PoisonRecordError(poison)
            log.error("%s; key group %d stopped (onPoison fail)", self.failed, self.key_group)
            return False
        deps.metrics.poison_records.labels(**deps.metrics.labels, policy=policy).inc()
        if policy == "dead-letter":
            deps.outputs.dead_letter(poison)
        log.warning(
            "poison record (key group %d, offset %d) %s: %s",
            poison.key_group, poison.offset,
            "sent to the dead-letter topic" if policy == "dead-letter" else "skipped",
            poison.error,
        )  # fmt: skip
        return True

    def _corrupt(self, offset: int, key: Any, exc: CorruptState) -> None:
        """A state value of ``key`` cannot be decoded: stop the key group at its last
        commit (its uncommitted work is dropped, never committed over the bad value)."""
        deps = self.deps
        self.failed = CorruptStateError(self.key_group, offset, key, exc)
        deps.cache.drop(self.key_group)
        self._ctx.discard()
        log.error(
            "%s; key group %d stopped at its last commit (position %d), whatever the "
            "errorPolicy: repair or delete the value, then move or restart the key group",
            self.failed, self.key_group, self.committed_position,
        )  # fmt: skip

    async def _checkpoint_failed(self) -> None:
        """A record or timer failed: commit what came before it, unless the store's own
        state is corrupt (then nothing more is committed)."""
        if not isinstance(self.failed, CorruptStateError):
            await self.checkpoint()

    def _uncommitted(self) -> bool:
        return (
            self.position != self.committed_position
            or bool(self.deps.cache.dirty_bytes_of(self.key_group))
            or self.watermark.value != self.committed_watermark
            or self.timers.has_changes()
        )

    def _fire_passed(self, offset: int) -> bool:
        """Fire the event-time timers the watermark has passed, at position ``offset``:
        right after the record that moved the watermark past them, or that registered
        them behind it, whatever the batches (a replay fires them at the same position).
        False: stop the batch (a timer's key is not loaded, or the key group failed)."""
        until = self.watermark.value
        if until is None:
            return True
        next_time = self.timers.next_time(EVENT_TIME)
        if next_time is None or next_time > until:
            return True
        self.position = offset
        return self._fire(EVENT_TIME, until) and self.failed is None

    async def _advance_idle(self, now: float) -> None:
        """An idle key group's watermark follows processing time (``idleTimeout``): unlike
        the records' event times, a replay cannot recompute it, so the advance is made
        durable at this position before anything depends on it: the records so far are
        committed with the watermark they saw, then the advance alone.  A replay from any
        commit meets the same watermark at the same position (timers fire there again,
        the same records are late).  Tried when a checkpoint is due, so an idle key group
        commits at most twice per ``checkpointInterval``."""
        await self.checkpoint()
        before = self.watermark.value
        if not self.watermark.idle(now):
            return
        try:
            await self.checkpoint()
        except BaseException:
            self.watermark.value = before  # not durable: nothing fires on it
            raise

    async def _fire_due(self, now: float) -> float:
        """Fire the due timers (loading their keys' state); return the seconds waited."""
        waited = 0.0
        for queue, until in (
            (EVENT_TIME, self.watermark.value),
            (PROCESSING_TIME, int(now * 1000)),
        ):
            if until is None:
                continue
            for _ in range(100):  # a key evicted between load and fire: load again
                due = self.timers.peek_due(queue, until, 256)
                if not due:
                    break
                waited += (await self._load([kb for _, kb, _ in due]))[0]
                if self._fire(queue, until) or self.failed is not None:
                    break
        return waited

    def _fire(self, queue: str, until: int) -> bool:
        """Fire ``queue``'s timers up to ``until`` in (time, key) order; False: a timer's
        key is not loaded (or a user error stopped the key group), retry next step."""
        try:
            return self._fire_timers(queue, until)
        finally:
            self._ctx.flush()

    def _fire_timers(self, queue: str, until: int) -> bool:
        deps = self.deps
        kg = self.key_group
        ctx = self._ctx
        outputs = deps.outputs
        on_timer = deps.job.on_timer
        assert on_timer is not None
        timers = self.timers
        domain: Any = queue
        while True:
            due = timers.peek_due(queue, until, 256)
            if not due:
                return True
            for time_ms, kb, member in due:
                _, _, payload = decode_member(member)
                key = decode_key(kb)
                ctx.begin(key, kb, self.position, time_ms)
                try:
                    on_timer(FiredTimer(domain, time_ms, key, payload, member), ctx)
                except _NotLoaded:
                    ctx.rollback()
                    self._load_again = True
                    return False
                except CorruptState as exc:
                    self._corrupt(self.position, key, exc)
                    return False
                except Exception as exc:
                    ctx.rollback()
                    if deps.error_policy == "fail":
                        self.failed = UserFunctionError(kg, self.position, exc)
                        log.error("%s (timer); key group %d stopped", self.failed, kg)
                        return False
                    log.warning(
                        "skipped timer (key group %d, time %d): %s: %s",
                        kg, time_ms, type(exc).__name__, exc,
                    )  # fmt: skip
                    timers.pop_fired(queue, kb, time_ms, member)
                    continue
                timers.pop_fired(queue, kb, time_ms, member)
                if ctx._entry_writes:
                    ctx.apply()
                if ctx._outputs:
                    origin = TimerOrigin(queue, time_ms, key)
                    outputs.emit_all(kg, self.position, key, ctx._outputs, origin)
                if ctx._timers.ops:
                    ctx._timers.apply(timers, kb)
                self.timers_fired += 1

    async def checkpoint(self, release_generation: int | None = None) -> bool:
        """Flush the sink, then commit dirty state, fired and registered timers, the
        watermark and the position (fenced), in one atomic commit.

        ``release_generation``: a handoff's last commit, which releases the key group in
        the same request; returns whether it did (not when there was nothing to commit:
        the caller releases)."""
        deps = self.deps
        kg = self.key_group
        self._last_checkpoint = time.monotonic()
        if self._expiring and self._last_checkpoint - self._last_sweep >= SWEEP_SECONDS:
            await self._sweep_expired()
        if not self._uncommitted():
            return False
        await deps.outputs.flush(kg)
        release_marks: dict[str, float] | None = None
        if self.release_generation is not None:
            self.handoff_marks["flushed"] = time.time()
        if release_generation is not None:
            # sent with the release: the commit's request is when it was committed
            self.handoff_marks["committed"] = time.time()
            release_marks = self.handoff_marks
        puts, deletes = deps.cache.dirty_changes(kg)
        timer_changes = self.timers.changes()
        watermark = self.watermark.value
        started = time.perf_counter()
        crash_point("commit.before")
        if self.timers_fired != self._fired_at_commit:
            crash_point("commit.before.fired")
        if release_generation is not None:
            crash_point("release.before")
        try:
            result = await deps.store.commit(
                deps.job_name,
                kg,
                epoch=self.epoch,
                token=self.token,
                seq=self.seq,
                puts=puts,
                deletes=deletes,
                position=self.position,
                watermark=watermark,
                timers=timer_changes or None,
                entry_states=self._entry_states,
                release_generation=release_generation,
                release_marks=release_marks,
            )
        except StoreUnavailable:
            # applied or not, nobody can say: the next commit tells (fenced if it was)
            self._commit_in_doubt = True
            raise
        self._commit_in_doubt = False
        crash_point("commit.after")
        if release_generation is not None:
            crash_point("release.after")
        elif self.release_generation is not None:
            self.handoff_marks["committed"] = time.time()
        deps.metrics.commit_duration.observe(time.perf_counter() - started)
        self._fence_checked = time.monotonic()
        self.confirmed = True
        self.seq = result.seq
        self.committed_position = self.position
        self.committed_watermark = watermark
        self._fired_at_commit = self.timers_fired
        self.timers.committed()
        deps.cache.committed(kg)
        return release_generation is not None

    async def _sweep_expired(self) -> None:
        """Expired values of the next page of each expiring state become deletes of this
        commit (fenced and atomic like any write), unless the cache holds a newer write
        of the key (``_process`` and ``_fire`` have put their writes into the cache by
        now). Nothing else writes this key group meanwhile: it is this runner's."""
        deps = self.deps
        kg = self.key_group
        cache = deps.cache
        self._last_sweep = time.monotonic()
        now = now_ms()
        expired = 0
        for state in self._expiring:
            page = await deps.store.scan(
                deps.job_name, kg, state, cursor=self._sweep_cursors.get(state, 0),
                count=SWEEP_PAGE,
            )  # fmt: skip
            self._sweep_cursors[state] = page.cursor
            for key, raw in page.items:
                expires, _ = split_expiry(raw)
                if expires is not None and expires <= now and not cache.is_dirty(kg, state, key):
                    cache.put(kg, state, key, None)
                    expired += 1
        if expired:
            deps.metrics.state_expired.inc(expired)
            crash_point("sweep.after")  # the deletes are in the cache, not yet committed

    async def _check_fence(self) -> None:
        """With nothing to commit, confirm now and then that the store still holds this
        fence and the last commit; raises :class:`Fenced` when it does not."""
        if not self._check_fence_now and (
            time.monotonic() - self._fence_checked < FENCE_CHECK_SECONDS or self._uncommitted()
        ):
            return
        self._check_fence_now = False
        deps = self.deps
        await deps.store.check_fence(
            deps.job_name, self.key_group, epoch=self.epoch, token=self.token, seq=self.seq
        )
        self._fence_checked = time.monotonic()
        self.confirmed = True

    async def _release(self, generation: int) -> None:
        """The last commit and the release, in one request when there is something to
        commit (the commit's fence covers commits the store lost: it is refused)."""
        deps = self.deps
        if self.failed is not None or not await self.checkpoint(release_generation=generation):
            marks = self.handoff_marks
            marks.setdefault("flushed", marks["batch_ended"])  # nothing was left to flush
            marks.setdefault("committed", marks["flushed"])  # nor to commit
            crash_point("release.before")
            stored_seq = await deps.store.release(
                deps.job_name,
                self.key_group,
                epoch=self.epoch,
                token=self.token,
                generation=generation,
                seq=self.seq,
                marks=marks,
            )
            if stored_seq != self.seq:
                deps.metrics.commits_lost.inc()
                log.warning(
                    "key group %d: the store lost acknowledged commits before its release "
                    "(it holds commit %d, this worker made %d); the next owner replays from "
                    "the store's position, and the outputs since then are emitted again",
                    self.key_group, stored_seq, self.seq,
                )  # fmt: skip
            crash_point("release.after")
        deps.cache.drop(self.key_group)

    async def _wait(self, seconds: float | None) -> None:
        """Wait for a control request, at most ``seconds``."""
        if await self._wake.wait(seconds):
            self._wake.clear()
