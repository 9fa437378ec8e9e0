"""Handoff decisions, as pure functions of assignments and what the store says.

- :func:`plan_handoff` (when an assignment arrives): which key groups do I release,
  claim, keep?
- :func:`stale_claims` (after a restart): which key groups does the store say I hold
  that the assignment gives to someone else?

Whether a key group may be claimed now (released, or mine) the store decides, in the
claim itself (``claim(if_released=True)``): looking first would cost a round trip.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from keyshift.store.protocol import Assignment


@dataclass(frozen=True)
class HandoffPlan:
    generation: int
    release: frozenset[int]
    """Key groups I run that the new assignment gives to others (or to nobody)."""
    claim: frozenset[int]
    """Key groups the new assignment gives me that I do not run yet."""
    keep: frozenset[int]
    """Key groups I run and keep: they never pause."""
    forced: frozenset[int]
    """The part of ``claim`` to claim at once, without waiting for a release."""


def plan_handoff(running: Collection[int], new: Assignment, me: int) -> HandoffPlan:
    """What worker ``me``, running ``running``, does to move to ``new``."""
    mine = frozenset(new.owned_by(me))
    current = frozenset(running)
    claim = mine - current
    return HandoffPlan(
        generation=new.generation,
        release=current - mine,
        claim=claim,
        keep=current & mine,
        forced=claim & new.forced,
    )


def stale_claims(
    owners_in_store: dict[int, str], assignment: Assignment, me: int, me_name: str
) -> list[int]:
    """Key groups the store says I own but the assignment gives to someone else.

    After a crash, a restarted worker finds these: its previous incarnation held
    them and never released them.  It releases them (claim, then release) so
    that their new owners need not wait for a forced claim.
    """
    return sorted(
        kg
        for kg, owner in owners_in_store.items()
        if owner == me_name and kg < assignment.key_groups and assignment.owners[kg] != me
    )
