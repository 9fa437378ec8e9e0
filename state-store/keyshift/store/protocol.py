"""The state store's typed protocol: what every backend provides.

Callers (the worker runtime, the controller, the admin tools) depend on this
module only.  A backend (today: Valkey/Redis, standalone or cluster, in
``redis_backend``) implements :class:`StateStore`.

Fencing.  Every key group has an *epoch* that each ``claim`` increments and a
random *token* that each claim draws.  A commit carries both plus the commit
sequence number it expects; the store applies it only if all three match and
then advances the sequence.  The token makes a fence unforgeable even after a
store restart that lost the last claim: an epoch number may then be issued a
second time, a token never is.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from keyshift.errors import KeyshiftError

JOB_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""Job names are Kubernetes object names (DNS-1123 labels): no braces, slashes."""

STATE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
"""State and timer-queue names: short, printable, no separators of our keys."""

NO_OWNER = -1
"""Owner of a key group in an assignment that no worker owns (never published)."""


def check_job_name(job: str) -> str:
    if not JOB_NAME.match(job):
        raise ValueError(
            f"invalid job name {job!r}: use lower-case letters, digits and '-', "
            "at most 63 characters, starting and ending with a letter or digit"
        )
    return job


def check_state_name(name: str) -> str:
    if not STATE_NAME.match(name):
        raise ValueError(f"invalid state name {name!r}: use letters, digits, '_', '.', '-'")
    return name


class StoreError(KeyshiftError):
    """Base class of the state store's own errors."""


class StoreUnavailable(StoreError):
    """The store could not be reached within the client's retry budget."""


class Fenced(StoreError):
    """A write was rejected, and nothing was written.

    ``reason`` says which part of the fence did not match:

    - ``"epoch"``: the key group was claimed by someone else since (or the
      claim this writer holds was lost by the store);
    - ``"sequence"``: the epoch matches but the commit sequence does not, so
      the store does not hold the state this writer built on (e.g. it lost an
      acknowledged commit in a crash). The writer must reload.
    """

    def __init__(
        self,
        job: str,
        key_group: int,
        reason: Literal["epoch", "sequence"],
        *,
        expected_epoch: int,
        stored_epoch: int,
        expected_seq: int,
        stored_seq: int,
    ) -> None:
        self.job = job
        self.key_group = key_group
        self.reason: Literal["epoch", "sequence"] = reason
        self.expected_epoch = expected_epoch
        self.stored_epoch = stored_epoch
        self.expected_seq = expected_seq
        self.stored_seq = stored_seq
        if reason == "epoch":
            detail = f"writer holds epoch {expected_epoch}, store has epoch {stored_epoch}"
        else:
            detail = f"writer expects commit sequence {expected_seq}, store has {stored_seq}"
        super().__init__(f"fenced on {job}/{key_group} ({reason}): {detail}")


class StoreRejected(StoreError):
    """The store refused a command for a reason a retry does not cure (out of memory,
    no permission, a script error): nothing was written."""


class StoreCorrupt(StoreRejected):
    """The store holds data keyshift cannot read or must not build on: a metadata field
    that is not a number, a key of the wrong type, state whose metadata is gone, a value
    the state's codec cannot decode.  Nothing was written; the key group stops and shows
    this error until someone repairs the store (see docs/reliability.md)."""

    def __init__(self, job: str, key_group: int | None, detail: str) -> None:
        self.job = job
        self.key_group = key_group
        self.detail = detail
        where = job if key_group is None else f"{job}/{key_group}"
        super().__init__(f"corrupt state in the store at {where}: {detail}")


class StoreMisconfigured(StoreError):
    """The store is set up in a way keyshift cannot keep its promises on (for example a
    ``maxmemory-policy`` that evicts keys); the message says what to change."""


class StillOwned(StoreError):
    """A claim made ``if_released`` while another worker holds the key group: the
    claimer waits for its release.  Nothing was written."""

    def __init__(self, job: str, key_group: int, owner: str) -> None:
        self.job = job
        self.key_group = key_group
        self.owner = owner
        super().__init__(f"{job}/{key_group} is still held by {owner}: not released yet")


class StaleClaim(StoreError):
    """A claim made on an assignment older than the key group's last claim or release:
    the claimer must follow the newer assignment.  Nothing was written."""

    def __init__(self, job: str, key_group: int, generation: int, stored: int) -> None:
        self.job = job
        self.key_group = key_group
        self.generation = generation
        self.stored = stored
        super().__init__(
            f"claim of {job}/{key_group} at generation {generation} refused: the key group "
            f"was claimed or released at generation {stored} already"
        )


def fence_violation(
    job: str,
    key_group: int,
    *,
    epoch: int,
    token: str,
    seq: int,
    stored_epoch: int,
    stored_token: str,
    stored_seq: int,
) -> Fenced | None:
    """The :class:`Fenced` error a writer holding ``(epoch, token, seq)`` gets from a store
    holding the ``stored_*`` fence, or None if they match (``seq`` -1: not compared)."""
    if stored_epoch != epoch or stored_token != token:
        reason: Literal["epoch", "sequence"] = "epoch"
    elif seq >= 0 and stored_seq != seq:
        reason = "sequence"
    else:
        return None
    return Fenced(
        job,
        key_group,
        reason,
        expected_epoch=epoch,
        stored_epoch=stored_epoch,
        expected_seq=seq,
        stored_seq=stored_seq,
    )


class StaleGeneration(StoreError):
    """An assignment was published over a generation other than the expected one."""

    def __init__(self, job: str, expected: int, stored: int) -> None:
        self.job = job
        self.expected = expected
        self.stored = stored
        super().__init__(
            f"assignment of {job!r}: expected to replace generation {expected}, "
            f"store has generation {stored}"
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claimer holds after ``claim``: the fence and where to resume."""

    job: str
    key_group: int
    owner: str
    epoch: int
    token: str
    seq: int
    position: int
    watermark: int | None
    states: frozenset[str] = frozenset()
    """The key group's states that have values in the store (committed once at least)."""
    entry_states: frozenset[str] = frozenset()
    """Those of :attr:`states` committed as entry states (``commit(entry_states=)``): a
    state in ``states`` but not here holds values of another layout."""
    timer_queues: frozenset[str] = frozenset()
    """The timer queues the key group has committed timers to (once at least): those
    the new owner reads; the others are empty."""
    claimed_at: float | None = None
    """When the store applied the claim (unix seconds, the store's clock)."""
    previous_owner: str = ""
    """Who held the key group before this claim: "" when it was released (or when the
    answer is to a retried claim whose first answer was lost)."""


@dataclass(frozen=True, slots=True)
class Released:
    """A release, as :meth:`StateStore.watch_releases` announces it."""

    key_group: int
    handed_to: Claim | None = None
    """The claim of the successor the release handed the key group to (the claimer that
    waited for it: ``claim(if_released=True)`` was refused with :class:`StillOwned`); None
    when nobody waited, and the key group is free."""


@dataclass(frozen=True, slots=True)
class Timer:
    """A timer: fires at ``time`` (integer milliseconds); ``payload`` identifies it."""

    time: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class TimerChanges:
    add: Collection[Timer] = ()
    remove: Collection[bytes] = ()
    """Payloads of timers to delete."""


@dataclass(frozen=True, slots=True)
class CommitResult:
    seq: int
    """The sequence the next commit must carry."""
    replayed: bool = False
    """True when this very commit (same fence and the same commit id) had already been
    applied: a retried request whose first reply was lost."""


@dataclass(frozen=True, slots=True)
class KeyGroupInfo:
    """One key group as the store sees it (for admin tools and handoffs)."""

    job: str
    key_group: int
    epoch: int
    owner: str
    seq: int
    position: int
    watermark: int | None
    claimed_generation: int
    released_generation: int
    entries: int
    """Number of state entries over all of the key group's states."""
    timers: int
    claimed_at: float | None = None
    """Unix time of the last claim (the claimer's clock)."""
    released_at: float | None = None
    committed_at: float | None = None
    last_pause: float | None = None
    """Seconds the last handoff paused this key group: from the previous owner's
    release (or, after a claim by force, its last commit) to the claim."""
    release_marks: Mapping[str, float] = field(default_factory=dict)
    """The last releaser's handoff marks (unix times, its clock): ``release_requested``,
    ``batch_ended``, ``flushed``, ``committed`` (see :data:`RELEASE_MARKS`)."""
    claim_marks: Mapping[str, float] = field(default_factory=dict)
    """The current owner's handoff marks since its claim (its clock): ``learned``,
    ``loaded``, ``first_batch`` (see :data:`CLAIM_MARKS`)."""
    claim_via: str = ""
    """How the current owner learned it could claim: ``notified`` (the release's
    notification), ``subscribed`` (released while it subscribed), ``polled`` (the safety-net
    poll), ``found`` (released when it first looked), ``forced``, ``own``, ``assignment``."""


RELEASE_MARKS = ("release_requested", "batch_ended", "flushed", "committed")
"""The old owner's steps of a handoff, in order (then the store's ``released_at``):
asked to release, its batch in progress ended, outputs flushed, last commit applied."""

CLAIM_MARKS = ("learned", "loaded", "first_batch")
"""The new owner's steps of a handoff (around the store's ``claimed_at``): learned of the
release (before the claim), the first batch's state loaded, the first batch processed."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """Which worker owns which key group, in one generation.

    ``owners[kg]`` is the worker ordinal owning key group ``kg``.  Key groups in
    ``forced`` are claimed without waiting for the previous owner's release
    (failover: that owner is presumed dead and the epoch bump fences it).
    """

    generation: int
    parallelism: int
    owners: tuple[int, ...]
    forced: frozenset[int] = field(default_factory=frozenset)

    @property
    def key_groups(self) -> int:
        return len(self.owners)

    def owned_by(self, worker: int) -> list[int]:
        return [kg for kg, owner in enumerate(self.owners) if owner == worker]


@dataclass(frozen=True, slots=True)
class JobInfo:
    job: str
    key_groups: int
    created_at: float
    """Unix time the job's state was first created; a job's clock starts here."""


@dataclass(frozen=True, slots=True)
class ScanPage:
    items: list[tuple[bytes, bytes]]
    cursor: int
    """0 when the scan is complete."""


@dataclass(slots=True)
class KeyGroupDump:
    """A key group's full content, as exported in a savepoint."""

    key_group: int
    epoch: int
    seq: int
    position: int
    watermark: int | None
    states: dict[str, dict[bytes, bytes]]
    timers: dict[str, list[Timer]]
    entry_states: set[str] = field(default_factory=set)
    """Those of ``states`` that are entry states (their index is rebuilt on load)."""


class StateStore(Protocol):
    """The remote state store, per job and key group."""

    # -- lifecycle ---------------------------------------------------------
    async def ping(self) -> None: ...
    async def close(self) -> None: ...
    async def warm(self, connections: int) -> None:
        """Open up to ``connections`` connections ahead of need (best effort): a worker's
        claims and first loads in a handoff run at once, and each would otherwise open
        its own (a connect and a handshake round trip on a busy worker)."""
        ...

    async def eviction_policy(self) -> str | None:
        """The store's ``maxmemory-policy`` (on a cluster: an evicting one if any master
        has one), or None when the store does not say (CONFIG disabled)."""
        ...

    # -- job ---------------------------------------------------------------
    async def init_job(
        self, job: str, key_groups: int, *, created_at: float | None = None
    ) -> JobInfo:
        """Record the job's key group count and start time (default: now), once.

        Returns what is stored, which is the first call's values.
        """
        ...

    async def job_info(self, job: str) -> JobInfo | None: ...

    # -- fencing -----------------------------------------------------------
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
        """Take ownership: increment the epoch, take a token (``token``, or one drawn
        here), return where to resume.

        ``if_released``: only if nobody holds the key group or ``owner`` does (a restarted
        worker); raises :class:`StillOwned` otherwise, so that a new owner looks and claims
        in one round trip. Without it the claim fences whoever holds the key group.

        A claim refused with :class:`StillOwned` registers the claimer as the key group's
        successor (the newest generation's claimer, if several wait): the holder's release
        claims the key group for it with its ``token`` and announces that claim
        (:class:`Released`), so the new owner starts with no round trip after the release.
        A claimer that waits gives the same ``token`` each time: if the announcement was
        lost, its next claim is answered with the claim the release made.

        Raises :class:`StaleClaim` when ``generation`` is older than the key group's last
        claim or release, and :class:`StoreCorrupt` when the key group's metadata is gone
        while its state is still there (it would otherwise restart from position 0 on top
        of that state)."""
        ...

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
        """Apply one checkpoint atomically, or raise :class:`Fenced` writing nothing.

        ``entry_states``: those of the states written whose fields are entries of a
        collection (a map's or a list's, ``<key><entry key>``): the store keeps them in
        byte order too, so that :meth:`entries` reads one key's entries as a range.

        A retried request (its first reply lost) is answered ``replayed`` only when the
        store applied this very request; any other commit with a used sequence is fenced.

        ``release_generation``: also release the key group at that generation right after
        the commit (as :meth:`release` does, with ``release_marks`` as its marks), in the
        same round trip on a standalone server; the release applies only if the commit
        did. A handoff's last commit: the new owner learns of it one round trip sooner."""
        ...

    async def check_fence(
        self, job: str, key_group: int, *, epoch: int, token: str, seq: int
    ) -> None:
        """Raise :class:`Fenced` unless the store still holds this fence and sequence.

        How an owner with nothing to commit notices that the store lost its claim or
        acknowledged commits (a restart from an older AOF, a failover to a lagging
        replica): a commit would be fenced, but an idle key group does not commit."""
        ...

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
        """Give the key group up at ``generation``; later commits with this fence fail.
        Watchers of the job's releases (:meth:`watch_releases`) are notified.

        Returns the stored commit sequence: when it is not ``seq`` (if given), the store
        lost acknowledged commits of the releaser; the next owner resumes from what the
        store holds, so the state is consistent, but the releaser must say so.  ``marks``
        (the releaser's handoff timeline, :data:`RELEASE_MARKS`) replace the previous
        release's in :attr:`KeyGroupInfo.release_marks`."""
        ...

    def watch_releases(self, job: str) -> AsyncGenerator[Released | None, None]:
        """Yield None once subscribed to the job's release notifications (and again after
        each resubscription), then each release (:class:`Released`: the key group, and the
        claim of the successor it was handed to, if one waited).

        How a new owner waiting for the previous owner's release learns of it at once: a
        worker subscribes once, for its life, so that no handoff waits for a subscription.
        Best effort: a notification can be lost (a dropped connection, a failover), so
        the waiter also looks at the store now and then, and once more at each None (a
        release before the subscription has no notification for it)."""
        ...

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
        """Add the owner's handoff marks (:data:`CLAIM_MARKS`) and how it learned of the
        release to :attr:`KeyGroupInfo.claim_marks`, if it still holds the fence (a claim
        clears them); False when it does not (nothing written)."""
        ...

    async def key_group_info(self, job: str, key_group: int) -> KeyGroupInfo: ...

    async def owners(self, job: str, key_groups: Collection[int]) -> dict[int, str]:
        """The owner each key group has in the store ("" when released or never claimed):
        one field per key group, cheap enough to poll during a handoff."""
        ...

    # -- reads -------------------------------------------------------------
    async def get_many(
        self, job: str, key_group: int, state_name: str, keys: Collection[bytes]
    ) -> dict[bytes, bytes]:
        """The stored values of ``keys``; absent keys are left out."""
        ...

    async def get_states(
        self, job: str, key_group: int, wanted: Mapping[str, Collection[bytes]]
    ) -> dict[str, dict[bytes, bytes]]:
        """The stored values of several states' keys (``state name -> keys``) in one
        round trip, as :meth:`get_many` gives them per state: one dict per state asked
        for, absent keys left out.  A worker's batch reads all its states' misses so."""
        ...

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
        """Up to ``count`` entries of the entry state ``state_name`` whose field starts
        with ``prefix`` (``prefix`` itself excluded) and sorts after ``after``, in byte
        order: one page; the next starts after the last field of this one.  Costs the
        page's size, not the state's."""
        ...

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
        """One page of the entries whose key starts with ``prefix``."""
        ...

    def scan_all(
        self, job: str, key_group: int, state_name: str, prefix: bytes = b""
    ) -> AsyncGenerator[tuple[bytes, bytes], None]:
        """Every entry whose key starts with ``prefix``, each once."""
        ...

    async def due_timers(
        self, job: str, key_group: int, queue: str, until: int, *, limit: int = 1000
    ) -> list[Timer]:
        """Timers of ``queue`` with ``time <= until``, earliest first."""
        ...

    async def next_timer(self, job: str, key_group: int, queue: str) -> Timer | None: ...

    # -- assignment --------------------------------------------------------
    async def publish_assignment(
        self, job: str, assignment: Assignment, *, expected_generation: int
    ) -> None:
        """Replace generation ``expected_generation`` (0: none yet) and notify watchers."""
        ...

    async def get_assignment(self, job: str) -> Assignment | None: ...

    def watch_assignment(
        self, job: str, *, poll_interval: float = 1.0
    ) -> AsyncGenerator[Assignment, None]:
        """Yield the current assignment, then each newer one as it is published."""
        ...

    async def ack_generation(self, job: str, worker: str, generation: int) -> None:
        """Record that ``worker`` runs ``generation``."""
        ...

    async def worker_generations(self, job: str) -> dict[str, int]: ...

    async def forget_worker(self, job: str, worker: str) -> None: ...

    async def mark_alive(self, job: str, worker: str) -> None:
        """Record that ``worker`` runs ``job`` now (its heartbeat)."""
        ...

    async def mark_stopped(self, job: str, worker: str) -> None:
        """Forget ``worker``'s heartbeat: it stopped cleanly."""
        ...

    async def alive_workers(self, job: str) -> dict[str, float]:
        """Each worker's last heartbeat (unix time), as recorded by ``mark_alive``."""
        ...

    # -- admin -------------------------------------------------------------
    async def list_key_groups(self, job: str) -> list[KeyGroupInfo]: ...

    async def delete_job(self, job: str) -> int:
        """Delete all of a job's state; return the number of keys removed."""
        ...

    async def dump_key_group(self, job: str, key_group: int) -> KeyGroupDump: ...

    async def load_key_group(self, job: str, dump: KeyGroupDump) -> None:
        """Write a dumped key group, replacing what is there and fencing old writers."""
        ...
