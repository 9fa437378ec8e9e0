"""The in-process backend of :class:`~keyshift.store.protocol.StateStore`: dicts.

Same rules as the Valkey/Redis backend (``redis_backend`` and its ``scripts/*.lua``):
fencing by epoch, token and sequence, stale claims refused, retried releases and
publications accepted, entry states read in byte order from an index, handoff marks and
pauses recorded the same way.  Nothing is persisted and nothing is shared between
processes: for benchmarks (the in-process ceiling) and fast tests.  What a remote store
adds and a dict cannot have (lost replies, lost notifications, corrupt or evicted
keys) is not simulated.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from keyshift.store.protocol import (
    Assignment,
    Claim,
    CommitResult,
    Fenced,
    JobInfo,
    KeyGroupDump,
    KeyGroupInfo,
    Released,
    ScanPage,
    StaleClaim,
    StaleGeneration,
    StillOwned,
    Timer,
    TimerChanges,
    check_job_name,
    check_state_name,
    fence_violation,
)


@dataclass
class _Index:
    """An entry state's fields in byte order (the Redis backend's sorted set)."""

    fields: list[bytes] = field(default_factory=list)
    members: set[bytes] = field(default_factory=set)

    def add(self, fields: Iterable[bytes]) -> None:
        new = {f for f in fields if f not in self.members}
        if not new:
            return
        self.members |= new
        if len(new) > 16 + len(self.fields) // 8:
            self.fields = sorted(self.members)
        else:
            for f in new:
                bisect.insort(self.fields, f)

    def remove(self, fields: Iterable[bytes]) -> None:
        gone = {f for f in fields if f in self.members}
        if not gone:
            return
        self.members -= gone
        if len(gone) > 16:
            self.fields = [f for f in self.fields if f not in gone]
        else:
            for f in gone:
                del self.fields[bisect.bisect_left(self.fields, f)]

    def page(self, prefix: bytes, after: bytes | None, count: int) -> list[bytes]:
        """Up to ``count`` fields that start with ``prefix`` (not ``prefix`` itself) and
        sort after ``after``, in byte order."""
        low = prefix if after is None else max(after, prefix)
        start = bisect.bisect_right(self.fields, low)
        found: list[bytes] = []
        for f in self.fields[start : start + count]:
            if not f.startswith(prefix):
                break
            found.append(f)
        return found

    def copy(self) -> _Index:
        return _Index(list(self.fields), set(self.members))


@dataclass
class _KeyGroup:
    """One key group: the Redis backend's metadata hash, names set, state hashes, entry
    indexes and timer sets.  Its metadata exists once ``epoch`` is above 0."""

    epoch: int = 0
    token: str = ""
    owner: str = ""
    seq: int = 0
    position: int = 0
    claimed_generation: int = 0
    released_generation: int = 0
    watermark: int | None = None
    claimed_at: float | None = None
    released_at: float | None = None
    committed_at: float | None = None
    pause: float | None = None
    release_marks: dict[str, float] = field(default_factory=dict)
    claim_marks: dict[str, float] = field(default_factory=dict)
    claim_via: str = ""
    released_token: str = ""
    """The token of the last release's releaser, and its sequence: a retry's answer."""
    released_seq: int = 0
    successor: tuple[str, str, int] | None = None
    """The claimer waiting for the release: owner, token, generation."""
    states: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    entry_states: set[str] = field(default_factory=set)
    indexes: dict[str, _Index] = field(default_factory=dict)
    timers: dict[str, dict[bytes, int]] = field(default_factory=dict)

    def stored_token(self) -> str | None:
        """The token field as a script reads it: None while there is no metadata."""
        return self.token if self.epoch > 0 else None

    def copy(self) -> _KeyGroup:
        return replace(
            self,
            release_marks=dict(self.release_marks),
            claim_marks=dict(self.claim_marks),
            states={name: dict(s) for name, s in self.states.items()},
            entry_states=set(self.entry_states),
            indexes={name: index.copy() for name, index in self.indexes.items()},
            timers={name: dict(t) for name, t in self.timers.items()},
        )


def _sorted_timers(stored: Mapping[bytes, int]) -> list[Timer]:
    """A timer queue in the order of a sorted set: by time, then payload."""
    return [Timer(time=t, payload=m) for t, m in sorted((t, m) for m, t in stored.items())]


class MemoryStore:
    """A :class:`~keyshift.store.protocol.StateStore` in this process's memory."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobInfo] = {}
        self._groups: dict[tuple[str, int], _KeyGroup] = {}
        self._assignments: dict[str, Assignment] = {}
        self._changed = asyncio.Condition()
        self._release_watchers: dict[str, set[asyncio.Queue[Released]]] = {}
        self.acks: dict[str, dict[str, int]] = {}
        """Each job's :meth:`worker_generations`."""
        self.alive: dict[str, dict[str, float]] = {}
        """Each job's :meth:`alive_workers`."""

    def _kg(self, job: str, key_group: int) -> _KeyGroup:
        """The key group, created empty on first use (as a write would create it)."""
        found = self._groups.get((job, key_group))
        if found is None:
            found = self._groups[(job, key_group)] = _KeyGroup()
        return found

    def _peek(self, job: str, key_group: int) -> _KeyGroup:
        """The key group, or an empty one left unstored (a read creates nothing)."""
        return self._groups.get((job, key_group)) or _KeyGroup()

    # -- lifecycle -------------------------------------------------------------

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def warm(self, connections: int) -> None:
        return None  # no connections

    async def eviction_policy(self) -> str | None:
        return "noeviction"  # nothing is ever evicted from a dict

    # -- job -------------------------------------------------------------------

    async def init_job(
        self, job: str, key_groups: int, *, created_at: float | None = None
    ) -> JobInfo:
        check_job_name(job)
        if key_groups < 1:
            raise ValueError(f"a job needs at least one key group, got {key_groups}")
        if job not in self._jobs:
            at = time.time() if created_at is None else created_at
            self._jobs[job] = JobInfo(job=job, key_groups=key_groups, created_at=at)
        return self._jobs[job]

    async def job_info(self, job: str) -> JobInfo | None:
        return self._jobs.get(job)

    # -- fencing ---------------------------------------------------------------

    async def claim(
        self,
        job: str,
        key_group: int,
        owner: str,
        *,
        generation: int = 0,
        if_released: bool = False,
        token: str | None = None,
    ) -> Claim:
        check_job_name(job)
        kg = self._kg(job, key_group)
        if token is not None and kg.epoch > 0 and kg.token == token:
            return self._claim_of(job, key_group, kg, "")  # applied already (a handover)
        token = token or secrets.token_hex(16)
        latest = max(kg.claimed_generation, kg.released_generation)
        if generation < latest:
            raise StaleClaim(job, key_group, generation, latest)
        previous = kg.owner
        if if_released and previous not in ("", owner):
            # the release hands the key group to the newest generation's waiting claimer
            if kg.successor is None or generation >= kg.successor[2]:
                kg.successor = (owner, token, generation)
            raise StillOwned(job, key_group, previous)
        # the pause: since the previous owner's release, or (a claim by force) its last commit
        since = kg.released_at if kg.stored_token() == "" else kg.committed_at
        self._apply_claim(kg, owner, token, generation, since)
        return self._claim_of(job, key_group, kg, previous)

    @staticmethod
    def _apply_claim(
        kg: _KeyGroup, owner: str, token: str, generation: int, since: float | None
    ) -> None:
        now = time.time()
        kg.epoch += 1
        kg.token = token
        kg.owner = owner
        kg.claimed_generation = generation
        kg.claimed_at = now
        kg.claim_marks = {}
        kg.claim_via = ""
        kg.successor = None
        kg.pause = None if since is None else now - since

    @staticmethod
    def _claim_of(job: str, key_group: int, kg: _KeyGroup, previous: str) -> Claim:
        return Claim(
            job, key_group, kg.owner, kg.epoch, kg.token, kg.seq, kg.position, kg.watermark,
            states=frozenset(kg.states), entry_states=frozenset(kg.entry_states),
            timer_queues=frozenset(kg.timers), previous_owner=previous,
            claimed_at=kg.claimed_at,
        )  # fmt: skip

    def _fenced(self, job: str, key_group: int, reason: str, *, epoch: int, seq: int) -> Fenced:
        kg = self._peek(job, key_group)
        return Fenced(
            job,
            key_group,
            "epoch" if reason == "epoch" else "sequence",
            expected_epoch=epoch,
            stored_epoch=kg.epoch,
            expected_seq=seq,
            stored_seq=kg.seq,
        )

    async def commit(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        seq: int,
        puts: Mapping[str, Mapping[bytes, bytes]] | None = None,
        deletes: Mapping[str, Collection[bytes]] | None = None,
        position: int,
        watermark: int | None = None,
        timers: Mapping[str, TimerChanges] | None = None,
        entry_states: Collection[str] = (),
        release_generation: int | None = None,
        release_marks: Mapping[str, float] | None = None,
    ) -> CommitResult:
        puts = puts or {}
        deletes = deletes or {}
        timers = timers or {}
        for name in (*puts, *deletes, *timers):
            check_state_name(name)
        kg = self._peek(job, key_group)
        if kg.epoch != epoch or kg.stored_token() != token:
            raise self._fenced(job, key_group, "epoch", epoch=epoch, seq=seq)
        if kg.seq != seq:
            # no reply is ever lost in a process: a used sequence is never a retry
            raise self._fenced(job, key_group, "sequence", epoch=epoch, seq=seq)
        for name in sorted(set(puts) | set(deletes)):
            state = kg.states.setdefault(name, {})
            put = puts.get(name, {})
            gone = deletes.get(name, ())
            state.update(put)
            for key in gone:
                state.pop(key, None)
            if name in entry_states:
                kg.entry_states.add(name)
                index = kg.indexes.setdefault(name, _Index())
                index.add(put)
                index.remove(gone)
        for queue, change in timers.items():
            stored = kg.timers.setdefault(queue, {})
            stored.update({t.payload: t.time for t in change.add})
            for member in change.remove:
                stored.pop(member, None)
        kg.seq += 1
        kg.position = position
        kg.committed_at = time.time()
        if watermark is not None:
            kg.watermark = watermark
        if release_generation is not None:
            await self.release(
                job, key_group, epoch=epoch, token=token, generation=release_generation,
                seq=kg.seq, marks=release_marks,
            )  # fmt: skip
        return CommitResult(seq=kg.seq)

    async def check_fence(
        self, job: str, key_group: int, *, epoch: int, token: str, seq: int
    ) -> None:
        kg = self._peek(job, key_group)
        fenced = fence_violation(
            job, key_group, epoch=epoch, token=token, seq=seq,
            stored_epoch=kg.epoch, stored_token=kg.token, stored_seq=kg.seq,
        )  # fmt: skip
        if fenced is not None:
            raise fenced

    async def release(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        generation: int,
        seq: int = -1,
        marks: Mapping[str, float] | None = None,
    ) -> int:
        kg = self._peek(job, key_group)
        if kg.released_token == token and kg.released_generation >= generation:
            return kg.released_seq  # this very release, retried (handed over since, maybe)
        if kg.epoch != epoch:
            raise self._fenced(job, key_group, "epoch", epoch=epoch, seq=seq)
        if kg.stored_token() == "" and kg.released_generation >= generation:
            return kg.seq  # released already: a retried request
        if kg.stored_token() != token:
            raise self._fenced(job, key_group, "epoch", epoch=epoch, seq=seq)
        kg.token = ""
        kg.owner = ""
        kg.released_token = token
        kg.released_seq = kg.seq
        kg.released_generation = generation
        kg.released_at = time.time()
        kg.release_marks = {name: float(at) for name, at in (marks or {}).items()}
        released = Released(key_group)
        waiting, kg.successor = kg.successor, None
        if waiting is not None and waiting[2] >= generation:
            owner, handed_token, claimed_generation = waiting
            self._apply_claim(kg, owner, handed_token, claimed_generation, kg.released_at)
            released = Released(key_group, self._claim_of(job, key_group, kg, ""))
        for queue in self._release_watchers.get(job, ()):
            queue.put_nowait(released)
        return kg.seq

    async def watch_releases(self, job: str) -> AsyncGenerator[Released | None, None]:
        queue: asyncio.Queue[Released] = asyncio.Queue()
        watchers = self._release_watchers.setdefault(job, set())
        watchers.add(queue)
        try:
            yield None  # subscribed
            while True:
                yield await queue.get()
        finally:
            watchers.discard(queue)
            if not watchers:
                self._release_watchers.pop(job, None)

    async def record_handoff(
        self,
        job: str,
        key_group: int,
        *,
        epoch: int,
        token: str,
        marks: Mapping[str, float],
        via: str = "",
    ) -> bool:
        kg = self._peek(job, key_group)
        if kg.epoch != epoch or kg.stored_token() != token:
            return False
        kg.claim_marks.update({name: float(at) for name, at in marks.items()})
        if via:
            kg.claim_via = via
        return True

    async def key_group_info(self, job: str, key_group: int) -> KeyGroupInfo:
        kg = self._peek(job, key_group)
        return KeyGroupInfo(
            job=job,
            key_group=key_group,
            epoch=kg.epoch,
            owner=kg.owner,
            seq=kg.seq,
            position=kg.position,
            watermark=kg.watermark,
            claimed_generation=kg.claimed_generation,
            released_generation=kg.released_generation,
            entries=sum(len(s) for s in kg.states.values()),
            timers=sum(len(t) for t in kg.timers.values()),
            claimed_at=kg.claimed_at,
            released_at=kg.released_at,
            committed_at=kg.committed_at,
            last_pause=kg.pause,
            release_marks=dict(kg.release_marks),
            claim_marks=dict(kg.claim_marks),
            claim_via=kg.claim_via,
        )

    async def owners(self, job: str, key_groups: Collection[int]) -> dict[int, str]:
        return {kg: self._peek(job, kg).owner for kg in key_groups}

    # -- reads -----------------------------------------------------------------

    async def get_many(
        self, job: str, key_group: int, state_name: str, keys: Collection[bytes]
    ) -> dict[bytes, bytes]:
        return (await self.get_states(job, key_group, {state_name: keys}))[state_name]

    async def get_states(
        self, job: str, key_group: int, wanted: Mapping[str, Collection[bytes]]
    ) -> dict[str, dict[bytes, bytes]]:
        states = self._peek(job, key_group).states
        found: dict[str, dict[bytes, bytes]] = {}
        for state_name, keys in wanted.items():
            state = states.get(state_name, {})
            found[state_name] = {k: state[k] for k in keys if k in state}
        return found

    async def entries(
        self,
        job: str,
        key_group: int,
        state_name: str,
        prefix: bytes,
        *,
        after: bytes | None = None,
        count: int = 1000,
    ) -> list[tuple[bytes, bytes]]:
        kg = self._peek(job, key_group)
        index = kg.indexes.get(state_name)
        if index is None:
            return []
        state = kg.states.get(state_name, {})
        return [(f, state[f]) for f in index.page(prefix, after, count)]

    async def scan(
        self,
        job: str,
        key_group: int,
        state_name: str,
        prefix: bytes = b"",
        *,
        cursor: int = 0,
        count: int = 256,
    ) -> ScanPage:
        """Every matching entry in one page (``count`` is a hint, as it is to Redis)."""
        state = self._peek(job, key_group).states.get(state_name, {})
        return ScanPage(items=[(k, v) for k, v in state.items() if k.startswith(prefix)], cursor=0)

    async def scan_all(
        self, job: str, key_group: int, state_name: str, prefix: bytes = b""
    ) -> AsyncGenerator[tuple[bytes, bytes], None]:
        page = await self.scan(job, key_group, state_name, prefix)
        for item in page.items:
            yield item

    async def due_timers(
        self, job: str, key_group: int, queue: str, until: int, *, limit: int = 1000
    ) -> list[Timer]:
        stored = self._peek(job, key_group).timers.get(queue, {})
        due = {m: t for m, t in stored.items() if t <= until}
        return _sorted_timers(due)[:limit]

    async def next_timer(self, job: str, key_group: int, queue: str) -> Timer | None:
        stored = self._peek(job, key_group).timers.get(queue, {})
        if not stored:
            return None
        t, m = min((t, m) for m, t in stored.items())
        return Timer(time=t, payload=m)

    # -- assignment ------------------------------------------------------------

    async def publish_assignment(
        self, job: str, assignment: Assignment, *, expected_generation: int
    ) -> None:
        check_job_name(job)
        if assignment.generation <= expected_generation:
            raise ValueError(
                f"new generation {assignment.generation} must exceed {expected_generation}"
            )
        current = self._assignments.get(job)
        stored = 0 if current is None else current.generation
        if current != assignment:  # the same again: a retried request, applied already
            if stored != expected_generation:
                raise StaleGeneration(job, expected_generation, stored)
            self._assignments[job] = assignment
        async with self._changed:
            self._changed.notify_all()

    async def get_assignment(self, job: str) -> Assignment | None:
        return self._assignments.get(job)

    async def watch_assignment(
        self, job: str, *, poll_interval: float = 1.0
    ) -> AsyncGenerator[Assignment, None]:
        last = 0
        while True:
            current = self._assignments.get(job)
            if current is not None and current.generation > last:
                last = current.generation
                yield current
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_interval), self._changed:
                    await self._changed.wait()

    async def ack_generation(self, job: str, worker: str, generation: int) -> None:
        self.acks.setdefault(job, {})[worker] = generation

    async def worker_generations(self, job: str) -> dict[str, int]:
        return dict(self.acks.get(job, {}))

    async def forget_worker(self, job: str, worker: str) -> None:
        self.acks.get(job, {}).pop(worker, None)

    async def mark_alive(self, job: str, worker: str) -> None:
        self.alive.setdefault(job, {})[worker] = time.time()

    async def mark_stopped(self, job: str, worker: str) -> None:
        self.alive.get(job, {}).pop(worker, None)

    async def alive_workers(self, job: str) -> dict[str, float]:
        return dict(self.alive.get(job, {}))

    # -- admin -----------------------------------------------------------------

    async def list_key_groups(self, job: str) -> list[KeyGroupInfo]:
        info = self._jobs.get(job)
        assignment = self._assignments.get(job)
        if info is not None:
            count = info.key_groups
        else:
            count = 0 if assignment is None else assignment.key_groups
        return [await self.key_group_info(job, kg) for kg in range(count)]

    async def delete_job(self, job: str) -> int:
        """Delete the job; return the number of keys the Redis backend would remove."""
        check_job_name(job)
        removed = (
            (self._jobs.pop(job, None) is not None)
            + (self._assignments.pop(job, None) is not None)
            + bool(self.acks.pop(job, None))  # a hash with no field is no key
            + bool(self.alive.pop(job, None))
        )
        for (owner, kg_number), kg in list(self._groups.items()):
            if owner != job:
                continue
            del self._groups[(owner, kg_number)]
            removed += kg.epoch > 0  # the metadata
            removed += bool(kg.states or kg.timers)  # the names set
            removed += sum(1 for s in kg.states.values() if s)
            removed += sum(1 for i in kg.indexes.values() if i.fields)
            removed += sum(1 for t in kg.timers.values() if t)
        return removed

    async def dump_key_group(self, job: str, key_group: int) -> KeyGroupDump:
        kg = self._peek(job, key_group)
        return KeyGroupDump(
            key_group=key_group,
            epoch=kg.epoch,
            seq=kg.seq,
            position=kg.position,
            watermark=kg.watermark,
            states={name: dict(kg.states[name]) for name in sorted(kg.states)},
            timers={name: _sorted_timers(kg.timers[name]) for name in sorted(kg.timers)},
            entry_states=set(kg.entry_states),
        )

    async def load_key_group(self, job: str, dump: KeyGroupDump) -> None:
        """Replace the key group with ``dump``: its metadata reset (``load_key_group.lua``)
        at an epoch above both the stored one and the dump's, which no writer holds."""
        for name in (*dump.states, *dump.timers):
            check_state_name(name)
        old = self._peek(job, dump.key_group)
        loaded = _KeyGroup(
            epoch=max(old.epoch + 1, dump.epoch + 1),
            seq=dump.seq,
            position=dump.position,
            watermark=dump.watermark,
            states={name: dict(s) for name, s in dump.states.items()},
            entry_states={name for name in dump.states if name in dump.entry_states},
            timers={q: {t.payload: t.time for t in ts} for q, ts in dump.timers.items()},
        )
        for name in loaded.entry_states:
            index = loaded.indexes[name] = _Index()
            index.add(loaded.states[name])
        self._groups[(job, dump.key_group)] = loaded

    # -- for tests: a look inside, and a store that loses writes ---------------

    def state(self, job: str, key_group: int, state_name: str) -> dict[bytes, bytes]:
        return dict(self._peek(job, key_group).states.get(state_name, {}))

    def snapshot(self, job: str, key_group: int) -> _KeyGroup:
        """A copy of a key group, to :meth:`restore` later (a store losing writes)."""
        return self._kg(job, key_group).copy()

    def restore(self, job: str, key_group: int, snapshot: _KeyGroup) -> None:
        self._groups[(job, key_group)] = snapshot.copy()
