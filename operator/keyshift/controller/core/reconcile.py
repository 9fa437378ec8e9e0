"""What the controller should start next, when no rescale is running: pure.

In order of precedence:

1. no assignment yet: the first deployment at the desired parallelism;
2. failover: workers that own key groups and have not been ready for
   ``failover_after`` seconds lose them to the survivors (claimed by force) —
   unless no worker at all is ready, which points at a common cause (the
   store, the network) that a failover would not cure.  Time during which the
   controller itself could not reach the store does not count: after a store
   outage every worker gets ``failover_after`` seconds from the store's return
   to be ready again (they come back one by one, not at once);
3. rebalance: after a failover (the owners are no longer one contiguous range per
   worker), once every worker is ready again, contiguous ranges are restored;
4. the desired parallelism (manual or autoscaler) differs from the current one; from
   parallelism 0 (scaled to zero) that is a wake, planned from the state in the store.

``load`` (the measured load per key group, or None) only shapes the ranges of a
rescale decided for one of these reasons: a change of load alone never starts one,
so plans do not ping-pong as loads wobble.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from keyshift.controller.core.assignment import is_ranges, plan_failover
from keyshift.controller.core.pool import WorkerInfo
from keyshift.controller.core.rescale import Reason, Rescale, plan_failover_rescale, plan_rescale
from keyshift.store.protocol import Assignment


@dataclass(frozen=True, slots=True)
class Desired:
    parallelism: int
    reason: Reason = "manual"


def lost_workers(
    assignment: Assignment,
    workers: Mapping[int, WorkerInfo],
    now: float,
    failover_after: float,
    store_ok_since: float | None = None,
) -> set[int]:
    """Owners of key groups that have not been ready for ``failover_after`` seconds,
    counted from ``store_ok_since`` at the earliest (the end of the last store outage)."""
    owners = set(assignment.owners)
    lost = set()
    for w in owners:
        info = workers.get(w)
        if info is None or info.ready:
            continue
        since = info.not_ready_since
        if since is None:
            continue
        if store_ok_since is not None:
            since = max(since, store_ok_since)
        if now - since >= failover_after:
            lost.add(w)
    return lost


def next_rescale(
    job: str,
    key_groups: int,
    assignment: Assignment | None,
    workers: Mapping[int, WorkerInfo],
    desired: Desired,
    now: float,
    failover_after: float,
    store_ok_since: float | None = None,
    load: Sequence[float] | None = None,
    standby: int = 0,
    held: Collection[int] = (),
) -> Rescale | None:
    """``held``: while the job is scaled to zero, the key groups the store still names an
    owner of (a wake claims them by force: no worker runs to release them)."""
    if assignment is None:
        return plan_rescale(job, key_groups, None, 0, 0, desired.parallelism, "initial", now,
                            load, standby)  # fmt: skip
    p, g = assignment.parallelism, assignment.generation
    owners = assignment.owners

    lost = lost_workers(assignment, workers, now, failover_after, store_ok_since)
    anyone_ready = any(workers[w].ready for w in range(p) if w in workers)
    if lost and anyone_ready and len(lost) < len(set(owners)):
        return plan_failover_rescale(job, owners, p, g, plan_failover(owners, lost), now)

    all_ready = all(w in workers and workers[w].ready for w in range(p))
    if not is_ranges(owners, p) and all_ready:
        return plan_rescale(job, key_groups, owners, p, g, p, "rebalance", now, load, standby)

    if desired.parallelism != p and all_ready:
        return plan_rescale(job, key_groups, owners, p, g, desired.parallelism, desired.reason, now,
                            load, standby, held if p == 0 else ())  # fmt: skip
    return None
