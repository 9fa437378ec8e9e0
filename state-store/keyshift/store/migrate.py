"""Move map and list states to the per-entry layout.

Before per-entry collections, a key's whole map (``MapState``) or list
(``ListState``) was one value: the msgpack map or array, stored under the key
(``<key>``) in the state's hash.  Now each entry is stored on its own: map
entry ``k`` of key ``<key>`` under ``<key><k>``, list element ``i`` under
``<key><i>`` with the list's length under ``<key>`` (all msgpack), and the
state is an *entry state* of the store (indexed in byte order).  A worker
refuses to run a key group whose map or list state is in the old layout
(never misreading it); :func:`migrate_entries` (``keyshift store
migrate-entries``) converts it, key group by key group, with the job stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import msgspec

from keyshift.errors import KeyshiftError
from keyshift.store.protocol import StateStore

Kind = Literal["map", "list"]

_encode = msgspec.msgpack.Encoder().encode


class LayoutError(KeyshiftError, ValueError):
    """A stored value is not the map or array its state's kind says it is."""


def to_entries(kind: Kind, key: bytes, raw: bytes) -> dict[bytes, bytes]:
    """The per-entry fields of one key's old value: ``raw``, a map or list of ``kind``."""
    value = msgspec.msgpack.decode(raw)
    if kind == "map":
        if not isinstance(value, dict):
            raise LayoutError(f"expected a map, found a {type(value).__name__}")
        return {key + _encode(k): _encode(v) for k, v in value.items()}
    if not isinstance(value, list):
        raise LayoutError(f"expected a list, found a {type(value).__name__}")
    fields = {key + _encode(i): _encode(v) for i, v in enumerate(value)}
    if value:
        fields[key] = _encode(len(value))
    return fields


@dataclass(frozen=True, slots=True)
class MigrationSummary:
    job: str
    key_groups: int
    migrated: int
    """Key groups rewritten (the others had nothing in the old layout)."""
    keys: int
    """Keys whose maps or lists were converted."""


async def migrate_entries(
    store: StateStore,
    job: str,
    states: Mapping[str, Kind],
    progress: Callable[[int, int], None] | None = None,
) -> MigrationSummary:
    """Convert ``states`` (name -> ``"map"`` or ``"list"``) of ``job`` to the per-entry
    layout where they are in the old one.  Each converted key group is written back as a
    savepoint import writes it: every old writer is fenced, so run it with the job stopped.
    Idempotent: a key group already converted is left alone."""
    info = await store.job_info(job)
    if info is None:
        raise LayoutError(f"job {job!r} has no state in this store")
    migrated = converted = 0
    for kg in range(info.key_groups):
        dump = await store.dump_key_group(job, kg)
        changed = False
        for name, kind in states.items():
            if name in dump.entry_states or name not in dump.states:
                continue
            fields: dict[bytes, bytes] = {}
            for key, raw in dump.states[name].items():
                try:
                    fields.update(to_entries(kind, key, raw))
                except (msgspec.DecodeError, LayoutError) as exc:
                    raise LayoutError(
                        f"key group {kg}, state {name!r}, key {key!r}: not a {kind} of the old "
                        f"layout ({exc}); nothing of this key group was changed"
                    ) from None
                converted += 1
            dump.states[name] = fields
            dump.entry_states.add(name)
            changed = True
        if changed:
            await store.load_key_group(job, dump)
            migrated += 1
        if progress:
            progress(kg + 1, info.key_groups)
    return MigrationSummary(job, info.key_groups, migrated, converted)
