"""Savepoints: export a job's whole state to a file and import it again.

For backup and for migration between stores.  The file is a sequence of
length-prefixed msgpack frames: a header, then one frame per key group, so a
large job is streamed a key group at a time, never held whole in memory.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import msgspec

from keyshift.errors import KeyshiftError
from keyshift.store.protocol import KeyGroupDump, StateStore, Timer

_T = TypeVar("_T", bound=msgspec.Struct)

MAGIC = "keyshift-savepoint"
VERSION = 2
"""2: frames list their entry states (maps and lists stored per entry); version 1 files,
which have none, are read too."""
READABLE_VERSIONS = (1, 2)
_LENGTH = struct.Struct(">I")


class _Header(msgspec.Struct):
    magic: str
    version: int
    job: str
    key_groups: int
    created_at: float


class _Frame(msgspec.Struct):
    key_group: int
    epoch: int
    seq: int
    position: int
    watermark: int | None
    states: dict[str, dict[bytes, bytes]]
    timers: dict[str, list[tuple[int, bytes]]]
    entry_states: list[str] = []


@dataclass(frozen=True, slots=True)
class SavepointSummary:
    job: str
    key_groups: int
    entries: int
    path: Path


class SavepointError(KeyshiftError, ValueError):
    """A savepoint that cannot be written or read: no such job, a job already there, a
    file that is not a savepoint or is incomplete."""


def _decode(data: bytes, into: type[_T], path: Path) -> _T:
    try:
        return msgspec.msgpack.decode(data, type=into)
    except msgspec.DecodeError as exc:  # msgspec's error, translated at the boundary
        raise SavepointError(f"{path} is not a readable keyshift savepoint: {exc}") from None


def _write(out: BinaryIO, obj: msgspec.Struct) -> None:
    data = msgspec.msgpack.encode(obj)
    out.write(_LENGTH.pack(len(data)))
    out.write(data)


def _frames(inp: BinaryIO) -> Iterator[bytes]:
    while head := inp.read(_LENGTH.size):
        if len(head) < _LENGTH.size:
            raise SavepointError("savepoint file is truncated")
        (size,) = _LENGTH.unpack(head)
        data = inp.read(size)
        if len(data) < size:
            raise SavepointError("savepoint file is truncated")
        yield data


async def export_job(
    store: StateStore,
    job: str,
    path: Path,
    progress: Callable[[int, int], None] | None = None,
) -> SavepointSummary:
    """Write ``job``'s state to ``path``; ``progress(done, total)`` after each key group."""
    info = await store.job_info(job)
    if info is None:
        raise SavepointError(f"job {job!r} has no state in this store")
    entries = 0
    tmp = path.with_suffix(path.suffix + ".partial")
    with tmp.open("wb") as out:
        _write(out, _Header(MAGIC, VERSION, job, info.key_groups, info.created_at))
        for kg in range(info.key_groups):
            dump = await store.dump_key_group(job, kg)
            entries += sum(len(s) for s in dump.states.values())
            _write(
                out,
                _Frame(
                    key_group=kg,
                    epoch=dump.epoch,
                    seq=dump.seq,
                    position=dump.position,
                    watermark=dump.watermark,
                    states=dump.states,
                    timers={q: [(t.time, t.payload) for t in ts] for q, ts in dump.timers.items()},
                    entry_states=sorted(dump.entry_states),
                ),
            )
            if progress:
                progress(kg + 1, info.key_groups)
    tmp.replace(path)  # a savepoint file is complete or absent
    return SavepointSummary(job=job, key_groups=info.key_groups, entries=entries, path=path)


async def import_job(
    store: StateStore,
    job: str,
    path: Path,
    progress: Callable[[int, int], None] | None = None,
) -> SavepointSummary:
    """Load the savepoint at ``path`` as job ``job`` (which must have no state yet).

    Every imported key group gets an epoch above the exported one, so writers
    of the exported job cannot commit into the imported one.
    """
    if await store.job_info(job) is not None:
        raise SavepointError(
            f"job {job!r} already has state in this store; delete it first "
            "(keyshift store delete) so that nothing is overwritten by accident"
        )
    entries = 0
    with path.open("rb") as inp:
        frames = _frames(inp)
        header = _decode(next(frames, b""), _Header, path)
        if header.magic != MAGIC or header.version not in READABLE_VERSIONS:
            raise SavepointError(
                f"{path} is not a keyshift savepoint of version "
                f"{' or '.join(map(str, READABLE_VERSIONS))}"
            )
        count = 0
        for data in frames:
            frame = _decode(data, _Frame, path)
            await store.load_key_group(
                job,
                KeyGroupDump(
                    key_group=frame.key_group,
                    epoch=frame.epoch,
                    seq=frame.seq,
                    position=frame.position,
                    watermark=frame.watermark,
                    states=frame.states,
                    timers={q: [Timer(t, p) for t, p in ts] for q, ts in frame.timers.items()},
                    entry_states=set(frame.entry_states),
                ),
            )
            entries += sum(len(s) for s in frame.states.values())
            count += 1
            if progress:
                progress(count, header.key_groups)
        if count != header.key_groups:
            raise SavepointError(
                f"savepoint {path} holds {count} of {header.key_groups} key groups: incomplete"
            )
    # written last: a job whose import failed midway has no info and can be re-imported
    await store.init_job(job, header.key_groups, created_at=header.created_at)
    return SavepointSummary(job=job, key_groups=header.key_groups, entries=entries, path=path)
