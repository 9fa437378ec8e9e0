"""The Valkey/Redis backend of :class:`~keyshift.store.protocol.StateStore`.

Works against a standalone server and against Redis Cluster: every key group's
keys share one hash slot, so each commit is one Lua script on one node.

Retries.  Connection errors and timeouts are retried with exponential back-off
(and jitter) up to ``retry_seconds``; then :class:`StoreUnavailable` is raised.
Retrying a commit is safe: the fence and the commit's id make it either apply
once or be recognised as already applied (see ``scripts/commit.lua``).

Errors are translated here, at the boundary, into the store's own tree
(:class:`~keyshift.store.protocol.StoreError`): transient ones become
:class:`StoreUnavailable` once the budget is spent; a refusal that no retry cures
becomes :class:`StoreRejected`, or :class:`StoreCorrupt` when the data itself is wrong
(a metadata field that is not a number, a key of the wrong type).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Iterable, Mapping
from functools import partial
from importlib import resources
from itertools import chain
from typing import Any, Literal, TypeVar

import msgpack
import msgspec
import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.cluster import RedisCluster

from keyshift.store import keys
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
    StoreCorrupt,
    StoreRejected,
    StoreUnavailable,
    Timer,
    TimerChanges,
    check_job_name,
    check_state_name,
    fence_violation,
)
from keyshift.store.turn_reads import JOIN_AT_MOST, TurnReads

T = TypeVar("T")

log = logging.getLogger("keyshift.store")

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.BusyLoadingError,
    rexc.TryAgainError,
    rexc.ClusterDownError,
    rexc.MasterDownError,
    rexc.ReadOnlyError,  # a failover in progress: the node asked is a replica now
    ConnectionResetError,
    OSError,
)


RESUBSCRIBE_SECONDS = 1.0
"""How long a release watcher waits before subscribing again after a failure (and at
most between two reads of its subscription)."""
SUBSCRIBE_SECONDS = 5.0
"""How long a subscription's confirmation may take before it is made again."""


class _AssignmentRecord(msgspec.Struct, frozen=True):
    generation: int
    parallelism: int
    owners: list[int]
    forced: list[int]


def pack_strings(values: Iterable[bytes]) -> bytes:
    """``values`` as one msgpack array of raw strings, as the scripts' ``cmsgpack.unpack``
    reads them: the old spec's raw type, binary-safe, which every Redis and Valkey
    version reads (Redis 7.0's cmsgpack rejects the newer bin type)."""
    packed: bytes = _RAW_PACKER.pack(list(values))
    return packed


_RAW_PACKER = msgpack.Packer(use_bin_type=False, autoreset=True)


def _decode_assignment(raw: bytes) -> Assignment:
    rec = msgspec.json.decode(raw, type=_AssignmentRecord)
    return Assignment(
        generation=rec.generation,
        parallelism=rec.parallelism,
        owners=tuple(rec.owners),
        forced=frozenset(rec.forced),
    )


def _announced(data: object) -> Assignment | None:
    """The assignment an announcement carries; None when it carries none (a generation
    alone, as a controller before this one sent): the watcher reads the stored one."""
    if not isinstance(data, bytes):
        return None
    try:
        return _decode_assignment(data)
    except msgspec.DecodeError:  # ValidationError included
        return None


KEY_GROUP_SCRIPTS = ("claim", "commit", "release", "load_key_group", "handoff_marks")
"""Scripts that read a key group's metadata: ``meta.lua`` (its checked reads) goes first."""


def _released(data: object, job: str) -> Released | None:
    """A release announcement (release.lua): the key group's number, or a msgpack array
    with the claim of the successor it was handed to (None: not a release message)."""
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, bytes) or not data:
        return None
    if data[:1].isdigit():
        try:
            return Released(int(data))
        except ValueError:
            return None
    try:
        kg, owner, token, epoch, seq, position, watermark, stored, claimed_at = msgpack.unpackb(
            data, raw=True
        )
        return Released(int(kg), _claim(
            job, int(kg), owner.decode(), token.decode(),
            [epoch, seq, position, watermark or None, stored, b"", claimed_at],
        ))  # fmt: skip
    except (ValueError, TypeError, UnicodeDecodeError, msgpack.UnpackException):
        return None


def _claim(job: str, key_group: int, owner: str, token: str, reply: list[Any]) -> Claim:
    """claim.lua's answer (and a handover's, in its announcement) as a :class:`Claim`."""
    epoch, seq, position, watermark, stored, previous, claimed_at = reply
    kinds = [raw.decode().partition(":") for raw in stored]
    return Claim(
        job=job,
        key_group=key_group,
        owner=owner,
        epoch=int(epoch),
        token=token,
        seq=int(seq),
        position=int(position),
        watermark=None if watermark is None else int(watermark),
        states=frozenset(name for kind, _, name in kinds if kind == "s"),
        entry_states=frozenset(name for kind, _, name in kinds if kind == "e"),
        timer_queues=frozenset(name for kind, _, name in kinds if kind == "t"),
        previous_owner=previous.decode(errors="replace"),
        claimed_at=float(claimed_at),
    )


def _load_script(name: str) -> str:
    scripts = resources.files("keyshift.store").joinpath("scripts")
    text = scripts.joinpath(f"{name}.lua").read_text()
    if name in KEY_GROUP_SCRIPTS:
        text = scripts.joinpath("meta.lua").read_text() + text
    return text


def _rejected(exc: rexc.ResponseError, what: str, job: str, key_group: int | None) -> Exception:
    """The store's refusal of a command, as an error of the store's own tree."""
    message = str(exc).split(" script: ")[0]  # a script error ends with the script's name
    if message.startswith("KSCORRUPT "):
        return StoreCorrupt(job, key_group, message.removeprefix("KSCORRUPT "))
    if message.startswith("WRONGTYPE"):
        return StoreCorrupt(job, key_group, f"a key has the wrong type ({message})")
    where = job if key_group is None else f"{job}/{key_group}"
    return StoreRejected(f"the store refused {what} on {where}: {message}")


def _quoted(raw: bytes) -> str:
    """A field's value in an error, cut short and quoted as the scripts quote it."""
    return '"' + raw[:40].decode(errors="replace") + '"'


def _commit_result(reply: Any, job: str, key_group: int, *, epoch: int, seq: int) -> CommitResult:
    """commit.lua's reply: the result, or :class:`Fenced`."""
    if reply[0] == b"OK":
        return CommitResult(seq=int(reply[1]), replayed=bool(int(reply[2])))
    reason: Literal["epoch", "sequence"] = "epoch" if reply[1] == b"epoch" else "sequence"
    raise Fenced(
        job,
        key_group,
        reason,
        expected_epoch=epoch,
        stored_epoch=int(reply[2]),
        expected_seq=seq,
        stored_seq=int(reply[3]),
    )


def _release_result(reply: Any, job: str, key_group: int, *, epoch: int, seq: int) -> int:
    """release.lua's reply: the stored sequence, or :class:`Fenced` (by the epoch, or by
    the sequence when the commit it was to follow was not applied)."""
    if reply[0] == b"OK":
        return int(reply[1])
    if reply[0] == b"UNCOMMITTED":
        raise Fenced(job, key_group, "sequence", expected_epoch=epoch, stored_epoch=epoch,
                     expected_seq=seq, stored_seq=int(reply[1]))  # fmt: skip
    raise Fenced(
        job,
        key_group,
        "epoch",
        expected_epoch=epoch,
        stored_epoch=int(reply[2]),
        expected_seq=seq,
        stored_seq=int(reply[3]),
    )


def _meta_int(meta: dict[bytes, bytes], field: str, job: str, key_group: int) -> int:
    """A whole-number metadata field (0 when absent); any other value is corruption."""
    raw = meta.get(field.encode())
    if raw is None or raw == b"":
        return 0
    try:
        return int(raw)
    except ValueError:
        raise StoreCorrupt(
            job, key_group, f"field {field} is not a whole number: {_quoted(raw)}"
        ) from None


def _meta_float(meta: dict[bytes, bytes], field: str, job: str, key_group: int) -> float | None:
    raw = meta.get(field.encode())
    if raw is None or raw == b"":
        return None
    try:
        return float(raw)
    except ValueError:
        raise StoreCorrupt(
            job, key_group, f"field {field} is not a number: {_quoted(raw)}"
        ) from None


def _marks(meta: dict[bytes, bytes], prefix: bytes, job: str, key_group: int) -> dict[str, float]:
    """The handoff marks stored under ``prefix`` (``r:`` releaser, ``c:`` claimer)."""
    found: dict[str, float] = {}
    for raw_field in meta:
        if raw_field.startswith(prefix) and raw_field != b"c:via":
            name = raw_field[len(prefix) :].decode(errors="replace")
            at = _meta_float(meta, raw_field.decode(errors="replace"), job, key_group)
            if at is not None:
                found[name] = at
    return found


def lex_range(prefix: bytes, after: bytes | None) -> tuple[bytes, bytes]:
    """``ZRANGEBYLEX`` bounds of the members that start with ``prefix`` (``prefix``
    itself excluded) and sort after ``after``."""
    low = b"(" + (prefix if after is None else max(after, prefix))
    end = prefix.rstrip(b"\xff")
    if not end:
        return low, b"+"
    return low, b"(" + end[:-1] + bytes([end[-1] + 1])


def _escape_glob(prefix: bytes) -> bytes:
    out = bytearray()
    for byte in prefix:
        if byte in b"*?[]\\":
            out.append(ord("\\"))
        out.append(byte)
    return bytes(out)


class RedisStateStore:
    """State store on Valkey/Redis.  Create with :func:`keyshift.store.open_store`."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        cluster: bool,
        retry_seconds: float = 30.0,
        url: str = "",
    ) -> None:
        self._client: Any = client
        self.cluster = cluster
        self.url = url
        self.retry_seconds = retry_seconds
        self._initialized = not cluster
        self._init_lock = asyncio.Lock()
        # a Cluster's pipeline of several key groups spans nodes (a task per node): its
        # key groups' reads stay one pipeline each
        self._turn_reads = TurnReads(
            partial(self._client.pipeline, transaction=False),
            join_at_most=0 if cluster else JOIN_AT_MOST,
        )
        self._scripts = {
            name: self._client.register_script(_load_script(name))
            for name in (*KEY_GROUP_SCRIPTS, "publish_assignment", "entries")
        }

    # -- plumbing ------------------------------------------------------------

    async def _initialize(self) -> None:
        """Load the cluster's slot map once, before any command.

        redis-py's asyncio cluster client initialises lazily; when several
        commands race into that first initialisation, it drops connections
        under commands already sent and retries them (a claim applied twice),
        or fails with an AttributeError. Initialising first, alone, avoids both.
        """
        async with self._init_lock:
            if not self._initialized:
                await self._client.initialize()
                self._initialized = True

    async def _retrying(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        *,
        job: str = "",
        key_group: int | None = None,
    ) -> T:
        """Run ``call``, retrying transient errors with capped exponential back-off;
        a refusal (``job``/``key_group`` name what it was about) is not retried."""
        started = time.monotonic()
        deadline = started + self.retry_seconds
        delay = 0.02
        failures = 0
        while True:
            try:
                if not self._initialized:
                    await self._initialize()
                result = await call()
            except (rexc.AuthenticationError, rexc.AuthorizationError) as exc:
                # a ConnectionError to redis-py, but no retry brings the right password
                raise StoreRejected(
                    f"the store at {self.url or 'its address'} refused the credentials "
                    f"during {what}: {exc}"
                ) from exc
            except rexc.InvalidResponse as exc:
                raise StoreRejected(
                    f"the server at {self.url or 'its address'} does not speak the Redis "
                    f"protocol (is it the store's port?): {exc}"
                ) from exc
            except TRANSIENT_ERRORS as exc:
                failures += 1
                if failures == 1:  # a retried call leaves a trace, once
                    log.warning("store %s failed (%s: %s); retrying for up to %.0fs",
                                what, type(exc).__name__, exc, self.retry_seconds)  # fmt: skip
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailable(
                        f"state store unreachable for {self.retry_seconds:.0f}s during {what}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                await asyncio.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
                delay = min(delay * 2, 1.0)
            except rexc.ResponseError as exc:  # after TRANSIENT_ERRORS: some are responses
                raise _rejected(exc, what, job, key_group) from exc
            else:
                if failures:
                    log.warning("store %s succeeded after %d retries in %.1fs",
                                what, failures, time.monotonic() - started)  # fmt: skip
                return result

    async def _script(
        self, name: str, keys_: list[str], args: list[Any], job: str, key_group: int | None
    ) -> Any:
        script = self._scripts[name]
        return await self._retrying(
            name, lambda: script(keys=keys_, args=args), job=job, key_group=key_group
        )

    async def ping(self) -> None:
        await self._retrying("ping", self._client.ping)

    async def warm(self, connections: int) -> None:
        """Standalone: connect ``connections`` of the pool at once, then give them back.
        A cluster client keeps a pool per node, filled as commands reach it: nothing."""
        if self.cluster:
            return
        pool = self._client.connection_pool
        opened = await asyncio.gather(
            *(pool.get_connection() for _ in range(connections)), return_exceptions=True
        )
        for connection in opened:
            if not isinstance(connection, BaseException):
                await pool.release(connection)

    async def close(self) -> None:
        await self._client.aclose()

    async def eviction_policy(self) -> str | None:
        if self.cluster:
            await self._initialize()
            call = partial(
                self._client.execute_command,
                "CONFIG", "GET", "maxmemory-policy", target_nodes=RedisCluster.PRIMARIES,
            )  # fmt: skip
        else:
            call = partial(self._client.execute_command, "CONFIG", "GET", "maxmemory-policy")
        try:
            reply = await self._retrying("eviction_policy", call)
        except StoreRejected:
            return None  # CONFIG is disabled (a managed service) or not permitted
        replies = list(reply.values()) if self.cluster else [reply]
        policies = set()
        for one in replies:  # a flat [name, value] list, or a {name: value} mapping
            values = list(one.values()) if isinstance(one, dict) else one[1::2]
            policies |= {v.decode() if isinstance(v, bytes) else str(v) for v in values}
        evicting = sorted(policies - {"noeviction"})
        return evicting[0] if evicting else "noeviction"

    # -- job -----------------------------------------------------------------

    async def init_job(
        self, job: str, key_groups: int, *, created_at: float | None = None
    ) -> JobInfo:
        check_job_name(job)
        if key_groups < 1:
            raise ValueError(f"a job needs at least one key group, got {key_groups}")
        key = keys.job_info(job)
        created = await self._retrying(
            "init_job", lambda: self._client.hsetnx(key, "key_groups", key_groups)
        )
        if created:
            await self._retrying(
                "init_job",
                lambda: self._client.hsetnx(
                    key, "created_at", repr(time.time() if created_at is None else created_at)
                ),
            )
        info = await self.job_info(job)
        assert info is not None
        return info

    async def job_info(self, job: str) -> JobInfo | None:
        raw = await self._retrying(
            "job_info",
            lambda: self._client.hmget(keys.job_info(job), ["key_groups", "created_at"]),
        )
        if raw[0] is None:
            return None
        created = float(raw[1]) if raw[1] is not None else 0.0
        return JobInfo(job=job, key_groups=int(raw[0]), created_at=created)

    # -- fencing -------------------------------------------------------------

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
        token = token or secrets.token_hex(16)
        reply = await self._script(
            "claim",
            [keys.meta(job, key_group), keys.names(job, key_group)],
            [owner, token, generation, repr(time.time()), "1" if if_released else ""],
            job,
            key_group,
        )
        if reply[0] == b"STALE":
            raise StaleClaim(job, key_group, generation, int(reply[1]))
        if reply[0] == b"OWNED":
            raise StillOwned(job, key_group, reply[1].decode(errors="replace"))
        # a retried claim (reply lost) is recognised by its token: one epoch, not two
        return _claim(job, key_group, owner, token, reply)

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
        state_names = sorted(set(puts) | set(deletes))
        key_list = [keys.meta(job, key_group), keys.names(job, key_group)]
        commit_id = secrets.token_hex(8)  # the commit's id: its retries carry the same
        args: list[Any] = [
            epoch,
            token,
            seq,
            position,
            "" if watermark is None else watermark,
            len(state_names),
            len(timers),
            repr(time.time()),
            commit_id,
        ]
        for name in state_names:
            check_state_name(name)
            key_list.append(keys.state(job, key_group, name))
            entries = name in entry_states
            if entries:
                key_list.append(keys.entry_index(job, key_group, name))
            put = puts.get(name)
            dele = deletes.get(name)
            # one argument each: the script unpacks them, and packing two values beats
            # packing thousands of arguments (a seventh of the worker's CPU for the commit)
            args += [
                name,
                1 if entries else 0,
                pack_strings(chain.from_iterable(put.items())) if put else b"",
                pack_strings(dele) if dele else b"",
            ]
        for queue in sorted(timers):
            check_state_name(queue)
            key_list.append(keys.timers(job, key_group, queue))
            change = timers[queue]
            args += [queue, len(change.add), len(change.remove)]
            for t in change.add:
                args += [t.time, t.payload]
            args += list(change.remove)
        if release_generation is None:
            reply = await self._script("commit", key_list, args, job, key_group)
            return _commit_result(reply, job, key_group, epoch=epoch, seq=seq)
        if self.cluster:  # the release publishes in a second call there anyway
            reply = await self._script("commit", key_list, args, job, key_group)
            result = _commit_result(reply, job, key_group, epoch=epoch, seq=seq)
            await self.release(
                job, key_group, epoch=epoch, token=token, generation=release_generation,
                seq=result.seq, marks=release_marks,
            )  # fmt: skip
            return result
        # one round trip: the release follows the commit, and applies only if it did
        released_args = self._release_args(
            job, key_group, epoch, token, release_generation, release_marks, after_commit=commit_id
        )
        commit_script, release_script = self._scripts["commit"], self._scripts["release"]

        async def both() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            await commit_script(keys=key_list, args=args, client=pipe)
            await release_script(
                keys=[keys.meta(job, key_group), keys.names(job, key_group)],
                args=released_args,
                client=pipe,
            )
            replies: list[Any] = await pipe.execute()
            return replies

        committed, released = await self._retrying("commit", both, job=job, key_group=key_group)
        result = _commit_result(committed, job, key_group, epoch=epoch, seq=seq)
        _release_result(released, job, key_group, epoch=epoch, seq=result.seq)
        return result

    async def check_fence(
        self, job: str, key_group: int, *, epoch: int, token: str, seq: int
    ) -> None:
        raw = await self._retrying(
            "check_fence",
            lambda: self._client.hmget(keys.meta(job, key_group), ["epoch", "token", "seq"]),
            job=job,
            key_group=key_group,
        )
        meta = {b"epoch": raw[0] or b"", b"seq": raw[2] or b""}
        fenced = fence_violation(
            job,
            key_group,
            epoch=epoch,
            token=token,
            seq=seq,
            stored_epoch=_meta_int(meta, "epoch", job, key_group),
            stored_token=(raw[1] or b"").decode(errors="replace"),
            stored_seq=_meta_int(meta, "seq", job, key_group),
        )
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
        args = self._release_args(job, key_group, epoch, token, generation, marks)
        reply = await self._script(
            "release", [keys.meta(job, key_group), keys.names(job, key_group)], args, job,
            key_group,
        )  # fmt: skip
        stored_seq = _release_result(reply, job, key_group, epoch=epoch, seq=seq)
        if self.cluster:  # the script could not publish on the job's slot: announce it here
            channel = keys.releases_channel(job)
            try:
                await self._client.execute_command("SPUBLISH", channel, reply[2])
            except (rexc.RedisError, OSError) as exc:  # best effort: the new owner's poll covers
                log.info("release of key group %d not announced: %s", key_group, exc)
        return stored_seq

    def _release_args(
        self,
        job: str,
        key_group: int,
        epoch: int,
        token: str,
        generation: int,
        marks: Mapping[str, float] | None,
        *,
        after_commit: str = "",
    ) -> list[Any]:
        """release.lua's arguments; ``after_commit``: release only if the commit of this
        id (sent before it in the same request) is the last one the store applied."""
        channel = "" if self.cluster else keys.releases_channel(job)
        args: list[Any] = [
            epoch, token, generation, repr(time.time()), channel, key_group, after_commit,
        ]  # fmt: skip
        for name, at in (marks or {}).items():
            args += [name, repr(float(at))]
        return args

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
        args: list[Any] = [epoch, token, via]
        for name, at in marks.items():
            args += [name, repr(float(at))]
        reply = await self._script(
            "handoff_marks", [keys.meta(job, key_group)], args, job, key_group
        )
        return bool(int(reply))

    async def watch_releases(self, job: str) -> AsyncGenerator[Released | None, None]:
        """Subscribe (sharded: SSUBSCRIBE on the node serving the job's slot) to the job's
        release channel; yield None once subscribed, then the release each message announces.
        A subscription that fails or breaks is made again (and yields None again)."""
        channel = keys.releases_channel(job)
        while True:
            pubsub = await self._subscribe(channel)
            if pubsub is None:
                await asyncio.sleep(RESUBSCRIBE_SECONDS)  # the waiter's poll covers
                continue
            try:
                if not await self._subscribed(pubsub, channel):
                    await asyncio.sleep(RESUBSCRIBE_SECONDS)
                    continue
                yield None  # subscribed: a release from now on is announced
                while True:
                    message = await self._message(pubsub, wait=RESUBSCRIBE_SECONDS)
                    if message is None:
                        continue
                    if message.get("type") in ("smessage", "message"):
                        released = _released(message.get("data"), job)
                        if released is not None:
                            yield released
                    elif message.get("type") == "sunsubscribe":
                        break  # the slot moved (a failover): subscribe again
            except TRANSIENT_ERRORS:
                await asyncio.sleep(RESUBSCRIBE_SECONDS / 10)
            finally:
                await self._close_pubsub(pubsub)

    async def _message(self, pubsub: Any, *, wait: float) -> dict[str, Any] | None:
        """The subscription's next message (or None after ``wait`` seconds)."""
        if self.cluster:
            found = await pubsub.get_sharded_message(timeout=wait)
        else:
            found = await pubsub.get_message(timeout=wait)
        return found if isinstance(found, dict) else None

    async def _subscribed(self, pubsub: Any, channel: str) -> bool:
        """Wait for the server's confirmation of the subscription: a release published
        after it is delivered (a release checked for on another connection before it might
        not be)."""
        deadline = time.monotonic() + SUBSCRIBE_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            message = await self._message(pubsub, wait=left)
            if message is not None and message.get("type") == "ssubscribe":
                return True
        return False

    async def key_group_info(self, job: str, key_group: int) -> KeyGroupInfo:
        meta: dict[bytes, bytes] = await self._retrying(
            "key_group_info",
            lambda: self._client.hgetall(keys.meta(job, key_group)),
            job=job,
            key_group=key_group,
        )
        names = await self._retrying(
            "key_group_info",
            lambda: self._client.smembers(keys.names(job, key_group)),
            job=job,
            key_group=key_group,
        )
        entries = 0
        timer_count = 0
        for raw_name in names:
            kind, _, name = raw_name.decode().partition(":")
            if kind == "s":
                entries += await self._client.hlen(keys.state(job, key_group, name))
            elif kind == "t":
                timer_count += await self._client.zcard(keys.timers(job, key_group, name))

        def whole(field: str) -> int:
            return _meta_int(meta, field, job, key_group)

        def real(field: str) -> float | None:
            return _meta_float(meta, field, job, key_group)

        return KeyGroupInfo(
            job=job,
            key_group=key_group,
            epoch=whole("epoch"),
            owner=meta.get(b"owner", b"").decode(errors="replace"),
            seq=whole("seq"),
            position=whole("position"),
            watermark=whole("watermark") if meta.get(b"watermark") else None,
            claimed_generation=whole("claimed_generation"),
            released_generation=whole("released_generation"),
            entries=entries,
            timers=timer_count,
            claimed_at=real("claimed_at"),
            released_at=real("released_at"),
            committed_at=real("committed_at"),
            last_pause=real("pause"),
            release_marks=_marks(meta, b"r:", job, key_group),
            claim_marks=_marks(meta, b"c:", job, key_group),
            claim_via=meta.get(b"c:via", b"").decode(errors="replace"),
        )

    async def owners(self, job: str, key_groups: Collection[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        for kg in key_groups:  # one key per call: key groups span cluster slots
            hget = partial(self._client.hget, keys.meta(job, kg), "owner")
            raw = await self._retrying("owners", hget)
            found[kg] = raw.decode() if raw else ""
        return found

    # -- reads ---------------------------------------------------------------

    async def get_many(
        self, job: str, key_group: int, state_name: str, keys_: Collection[bytes]
    ) -> dict[bytes, bytes]:
        return (await self.get_states(job, key_group, {state_name: keys_}))[state_name]

    async def get_states(
        self, job: str, key_group: int, wanted: Mapping[str, Collection[bytes]]
    ) -> dict[str, dict[bytes, bytes]]:
        asked = {name: list(keys_) for name, keys_ in wanted.items() if keys_}
        found: dict[str, dict[bytes, bytes]] = {name: {} for name in wanted}
        if not asked:
            return found
        # one HMGET per state, sent together (the key group's keys share a slot); a small
        # read also with the other key groups' of this turn
        read = [(keys.state(job, key_group, name), fields) for name, fields in asked.items()]
        replies = await self._retrying(
            "get_states", partial(self._turn_reads.hmget, read), job=job, key_group=key_group
        )
        for (name, fields), values in zip(asked.items(), replies, strict=True):
            found[name] = {k: v for k, v in zip(fields, values, strict=True) if v is not None}
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
        low, high = lex_range(prefix, after)
        reply = await self._script(
            "entries",
            [keys.state(job, key_group, state_name), keys.entry_index(job, key_group, state_name)],
            [low, high, count],
            job,
            key_group,
        )
        return list(zip(reply[::2], reply[1::2], strict=True))

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
        match = _escape_glob(prefix) + b"*"
        key = keys.state(job, key_group, state_name)
        next_cursor, found = await self._retrying(
            "scan",
            lambda: self._client.hscan(key, cursor, match=match, count=count),
            job=job,
            key_group=key_group,
        )
        return ScanPage(items=list(found.items()), cursor=int(next_cursor))

    async def scan_all(
        self, job: str, key_group: int, state_name: str, prefix: bytes = b""
    ) -> AsyncGenerator[tuple[bytes, bytes], None]:
        seen: set[bytes] = set()  # HSCAN may return an entry twice while the hash rehashes
        cursor = 0
        while True:
            page = await self.scan(job, key_group, state_name, prefix, cursor=cursor)
            for k, v in page.items:
                if k not in seen:
                    seen.add(k)
                    yield k, v
            cursor = page.cursor
            if cursor == 0:
                return

    async def due_timers(
        self, job: str, key_group: int, queue: str, until: int, *, limit: int = 1000
    ) -> list[Timer]:
        key = keys.timers(job, key_group, queue)
        found = await self._retrying(
            "due_timers",
            lambda: self._client.zrangebyscore(
                key, "-inf", until, start=0, num=limit, withscores=True
            ),
            job=job,
            key_group=key_group,
        )
        return [Timer(time=int(score), payload=member) for member, score in found]

    async def next_timer(self, job: str, key_group: int, queue: str) -> Timer | None:
        key = keys.timers(job, key_group, queue)
        found = await self._retrying(
            "next_timer",
            lambda: self._client.zrange(key, 0, 0, withscores=True),
            job=job,
            key_group=key_group,
        )
        if not found:
            return None
        member, score = found[0]
        return Timer(time=int(score), payload=member)

    # -- assignment ----------------------------------------------------------

    async def publish_assignment(
        self, job: str, assignment: Assignment, *, expected_generation: int
    ) -> None:
        check_job_name(job)
        if assignment.generation <= expected_generation:
            raise ValueError(
                f"new generation {assignment.generation} must exceed {expected_generation}"
            )
        payload = msgspec.json.encode(
            _AssignmentRecord(
                generation=assignment.generation,
                parallelism=assignment.parallelism,
                owners=list(assignment.owners),
                forced=sorted(assignment.forced),
            )
        )
        reply = await self._script(
            "publish_assignment",
            [keys.assignment(job)],
            [expected_generation, assignment.generation, payload],
            job,
            None,
        )
        if reply[0] != b"OK":
            raise StaleGeneration(job, expected_generation, int(reply[1]))
        channel = keys.assignment_channel(job)
        # the message carries the record: a watcher takes it from there, without a read
        await self._retrying(
            "publish_assignment",
            lambda: self._client.execute_command("SPUBLISH", channel, payload),
        )

    async def get_assignment(self, job: str) -> Assignment | None:
        raw = await self._retrying(
            "get_assignment", lambda: self._client.hget(keys.assignment(job), "payload")
        )
        if raw is None:
            return None
        return _decode_assignment(raw)

    async def watch_assignment(
        self, job: str, *, poll_interval: float = 1.0
    ) -> AsyncGenerator[Assignment, None]:
        """Yield the current and each newer assignment.

        Notified through sharded pub/sub; a poll every ``poll_interval`` seconds
        covers missed messages and lost subscriptions.
        """
        channel = keys.assignment_channel(job)
        pubsub: Any = None
        last = 0
        announced: Assignment | None = None
        try:
            while True:
                if pubsub is None:
                    pubsub = await self._subscribe(channel)
                # the announced record, or (none, or a poll's turn) the stored one
                current = announced or await self.get_assignment(job)
                announced = None
                if current is not None and current.generation > last:
                    last = current.generation
                    yield current
                if pubsub is None:
                    await asyncio.sleep(poll_interval)
                    continue
                try:
                    if self.cluster:
                        message = await pubsub.get_sharded_message(
                            ignore_subscribe_messages=True, timeout=poll_interval
                        )
                    else:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=poll_interval
                        )
                except TRANSIENT_ERRORS:
                    await self._close_pubsub(pubsub)
                    pubsub = None
                else:
                    if isinstance(message, dict):
                        announced = _announced(message.get("data"))
        finally:
            if pubsub is not None:
                await self._close_pubsub(pubsub)

    async def _subscribe(self, channel: str) -> Any:
        try:
            await self._initialize()  # a cluster's slot map routes the shard channel
            pubsub = self._client.pubsub()
            await pubsub.ssubscribe(channel)
            return pubsub
        except (rexc.RedisError, OSError):
            return None  # polling covers until the next attempt

    @staticmethod
    async def _close_pubsub(pubsub: Any) -> None:
        with contextlib.suppress(Exception):
            await pubsub.aclose()

    async def ack_generation(self, job: str, worker: str, generation: int) -> None:
        await self._retrying(
            "ack_generation",
            lambda: self._client.hset(keys.worker_generations(job), worker, generation),
        )

    async def worker_generations(self, job: str) -> dict[str, int]:
        raw = await self._retrying(
            "worker_generations", lambda: self._client.hgetall(keys.worker_generations(job))
        )
        return {k.decode(): int(v) for k, v in raw.items()}

    async def forget_worker(self, job: str, worker: str) -> None:
        await self._retrying(
            "forget_worker", lambda: self._client.hdel(keys.worker_generations(job), worker)
        )

    async def mark_alive(self, job: str, worker: str) -> None:
        key = keys.alive(job)
        await self._retrying(
            "mark_alive", lambda: self._client.hset(key, worker, repr(time.time()))
        )

    async def mark_stopped(self, job: str, worker: str) -> None:
        await self._retrying("mark_stopped", lambda: self._client.hdel(keys.alive(job), worker))

    async def alive_workers(self, job: str) -> dict[str, float]:
        raw = await self._retrying("alive_workers", lambda: self._client.hgetall(keys.alive(job)))
        found: dict[str, float] = {}
        for worker, at in raw.items():
            with contextlib.suppress(ValueError):
                found[worker.decode(errors="replace")] = float(at)
        return found

    # -- admin ---------------------------------------------------------------

    async def _key_group_count(self, job: str) -> int:
        info = await self.job_info(job)
        if info is not None:
            return info.key_groups
        assignment = await self.get_assignment(job)
        return 0 if assignment is None else assignment.key_groups

    async def list_key_groups(self, job: str) -> list[KeyGroupInfo]:
        count = await self._key_group_count(job)
        return [await self.key_group_info(job, kg) for kg in range(count)]

    async def delete_job(self, job: str) -> int:
        check_job_name(job)
        await self._initialize()
        found: list[bytes] = []
        for pattern in keys.job_patterns(job):
            async for key in self._client.scan_iter(match=pattern, count=1000):
                found.append(key)
        removed = 0
        for key in found:  # one key per call: keys of a job span many cluster slots
            removed += await self._retrying("delete_job", partial(self._client.unlink, key))
        return removed

    async def dump_key_group(self, job: str, key_group: int) -> KeyGroupDump:
        info = await self.key_group_info(job, key_group)
        names = await self._client.smembers(keys.names(job, key_group))
        states: dict[str, dict[bytes, bytes]] = {}
        timer_queues: dict[str, list[Timer]] = {}
        entry_states: set[str] = set()
        for raw_name in sorted(names):
            kind, _, name = raw_name.decode().partition(":")
            if kind == "s":
                states[name] = {k: v async for k, v in self.scan_all(job, key_group, name)}
            elif kind == "e":
                entry_states.add(name)  # the index is rebuilt from the hash on load
            else:
                found = await self._client.zrange(
                    keys.timers(job, key_group, name), 0, -1, withscores=True
                )
                timer_queues[name] = [Timer(time=int(s), payload=m) for m, s in found]
        return KeyGroupDump(
            key_group=key_group,
            epoch=info.epoch,
            seq=info.seq,
            position=info.position,
            watermark=info.watermark,
            states=states,
            timers=timer_queues,
            entry_states=entry_states,
        )

    async def load_key_group(self, job: str, dump: KeyGroupDump) -> None:
        kg = dump.key_group
        await self._initialize()
        old_names = await self._client.smembers(keys.names(job, kg))
        for raw_name in old_names:
            kind, _, name = raw_name.decode().partition(":")
            key = {"s": keys.state, "e": keys.entry_index}.get(kind, keys.timers)(job, kg, name)
            await self._client.unlink(key)
        await self._client.unlink(keys.names(job, kg))
        await self._script(
            "load_key_group",
            [keys.meta(job, kg)],
            [
                dump.epoch + 1,
                dump.seq,
                dump.position,
                "" if dump.watermark is None else dump.watermark,
            ],
            job,
            kg,
        )
        for name, entries in dump.states.items():
            check_state_name(name)
            await self._client.sadd(keys.names(job, kg), f"s:{name}")
            if name in dump.entry_states:
                await self._client.sadd(keys.names(job, kg), f"e:{name}")
            items = list(entries.items())
            for start in range(0, len(items), 1000):
                chunk = dict(items[start : start + 1000])
                await self._client.hset(keys.state(job, kg, name), mapping=chunk)
                if name in dump.entry_states:
                    index = keys.entry_index(job, kg, name)
                    await self._client.zadd(index, dict.fromkeys(chunk, 0))
        for queue, timer_list in dump.timers.items():
            check_state_name(queue)
            await self._client.sadd(keys.names(job, kg), f"t:{queue}")
            for start in range(0, len(timer_list), 1000):
                chunk_t = {t.payload: t.time for t in timer_list[start : start + 1000]}
                await self._client.zadd(keys.timers(job, kg, queue), chunk_t)
