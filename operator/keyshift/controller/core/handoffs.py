"""Where a handoff's pause goes: each moved key group's timeline, as data.

The workers leave their marks in the store (the old owner's with its release, the new
owner's after its first batch; :class:`~keyshift.store.protocol.KeyGroupInfo`); the
executor reads them when a rescale finishes and keeps, in the rescale's record, per
moved key group the time of each step since the assignment was published, and per step
the median and longest time it took (:func:`timeline`).  Pure: no I/O here.

Times are the workers' wall clocks (one machine locally; on Kubernetes the pods' clocks
agree as well as NTP makes them).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

import msgspec

from keyshift.store.protocol import KeyGroupInfo

STAGES = (
    "release_requested",
    "batch_ended",
    "flushed",
    "committed",
    "released",
    "learned",
    "claimed",
    "loaded",
    "first_batch",
)
"""A handoff's steps in order: the old owner is asked to release (it has seen the new
assignment), its batch in progress ends, it flushes its outputs, its last commit is
applied, the store marks the key group released (and announces it, handing it to the
new owner when it waits); the new owner learns of it (handed over, notified, or by its
poll), claims (a handed-over key group is claimed already), has loaded the state of its
first batch (the first record is processed right after) and has processed that batch."""

DETAIL_LIMIT = 5
"""Finished rescales that keep their per key group timelines (older ones keep the
per-step summary only: the record lives in the StreamJob's status)."""


class KeyGroupHandoff(msgspec.Struct, kw_only=True, omit_defaults=True):
    key_group: int
    from_worker: int
    to_worker: int
    via: str = ""
    """How the new owner learned of the release: handed, notified, subscribed, polled,
    found, forced."""
    at_ms: dict[str, float] = msgspec.field(default_factory=dict)
    """Milliseconds since the assignment was published, per step of :data:`STAGES` known."""


class StepStats(msgspec.Struct, kw_only=True):
    median_ms: float
    max_ms: float
    key_groups: int


class HandoffTimeline(msgspec.Struct, kw_only=True):
    published_at: float
    steps: dict[str, StepStats] = msgspec.field(default_factory=dict)
    """Per step: the time since the step before it (the first: since publishing)."""
    pause_ms: StepStats | None = None
    """The old owner's batch ending to the new owner's first batch loaded (records flow)."""
    via: dict[str, int] = msgspec.field(default_factory=dict)
    """How many new owners learned of the release each way."""
    key_groups: list[KeyGroupHandoff] = msgspec.field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every new owner has recorded its first batch's load (it may come after the
        rescale's end: the executor looks again for a few seconds)."""
        return all("loaded" in h.at_ms or "claimed" not in h.at_ms for h in self.key_groups)


def key_group_handoff(
    info: KeyGroupInfo, from_worker: int, to_worker: int, generation: int, published_at: float
) -> KeyGroupHandoff:
    """One moved key group's timeline from what the store holds, counting only marks of
    this handoff: a release and a claim at ``generation`` or later (a claim by force has
    no release of its own)."""
    at: dict[str, float] = {}
    if info.released_generation >= generation:
        at.update(info.release_marks)
        if info.released_at is not None:
            at["released"] = info.released_at
    via = ""
    if info.claimed_generation >= generation and info.claimed_at is not None:
        at.update(info.claim_marks)
        at["claimed"] = info.claimed_at
        via = info.claim_via
        if at.get("learned", 0.0) > info.claimed_at:
            # the owner cannot learn of the release after claiming it: the two times come
            # from different calls (seen 1.3 ms apart under load); the claim bounds it
            at["learned"] = info.claimed_at
    return KeyGroupHandoff(
        key_group=info.key_group,
        from_worker=from_worker,
        to_worker=to_worker,
        via=via,
        at_ms={
            stage: round((at[stage] - published_at) * 1000, 1) for stage in STAGES if stage in at
        },
    )


def _stats(values: Sequence[float]) -> StepStats:
    return StepStats(
        median_ms=round(statistics.median(values), 1),
        max_ms=round(max(values), 1),
        key_groups=len(values),
    )


def timeline(published_at: float, handoffs: Iterable[KeyGroupHandoff]) -> HandoffTimeline:
    """The rescale's handoff timeline: per step, how long it took after the step before it
    (over the key groups that have both), and the per key group detail."""
    found = sorted(handoffs, key=lambda h: h.key_group)
    per_step: dict[str, list[float]] = {}
    pauses: list[float] = []
    via: dict[str, int] = {}
    for h in found:
        previous = 0.0  # publishing
        for stage in STAGES:
            if stage in h.at_ms:
                per_step.setdefault(stage, []).append(h.at_ms[stage] - previous)
                previous = h.at_ms[stage]
        if "batch_ended" in h.at_ms and "loaded" in h.at_ms:
            pauses.append(h.at_ms["loaded"] - h.at_ms["batch_ended"])
        if h.via:
            via[h.via] = via.get(h.via, 0) + 1
    return HandoffTimeline(
        published_at=published_at,
        steps={stage: _stats(per_step[stage]) for stage in STAGES if stage in per_step},
        pause_ms=_stats(pauses) if pauses else None,
        via=dict(sorted(via.items())),
        key_groups=found,
    )


def publish_time(started_at: float, steps: Iterable[tuple[str, float]]) -> float:
    """When the assignment was published: the end of the rescale's ``publishing`` phase
    (``steps``: each finished phase and its seconds, in order)."""
    at = started_at
    for phase, seconds in steps:
        at += seconds
        if phase == "publishing":
            return at
    return at
