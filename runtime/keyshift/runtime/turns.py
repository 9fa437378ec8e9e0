"""Turns on the event loop for a worker's busy key groups, so that control work waits
about one batch, not one batch per key group.

asyncio runs every ready task once per loop iteration and looks at its sockets only
between iterations.  A saturated worker has all its key groups ready, each running a
batch of up to ``BATCH_SECONDS``: a new assignment, a release request or a store
reply then waits behind all of them (16 key groups: 320 ms).  :class:`Turns` gives
each iteration a budget: once the key groups' batches of the iteration have used it,
the others give up their turn (they yield at once), the iteration ends, and the
sockets are read.  Those that gave up a turn go first later, in the order they gave
it up, so that nobody starves; a key group that has just been claimed, and so is
paused, does not wait its turn (a handoff goes first).

A batch is charged to the iteration that lets it start, at what the key group's last
batch took: with a remote store a batch starts by loading its state, and its records
are processed an iteration or more later, when the reply has come. Charged only when
they finish, the batches of every key group would start in one iteration (none had
finished yet) and all be processed in the next, which then ran for all of them.

While a handoff is under way on the worker (a key group it releases, or one it waits to
claim), the budget and each batch are shorter (``HANDOFF_BUDGET``): every step of a
handoff is a round trip to the store whose reply waits for the iteration to end, so
on a saturated worker a handoff of ten steps would otherwise wait ten full iterations.
The key groups that stay keep running, in shorter slices.  A handoff counts for at
most ``HANDOFF_PRIORITY_SECONDS``: one that waits longer (an old owner that is slow to
release) does not keep the whole worker on short slices.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

ITERATION_BUDGET = 0.02
"""Seconds of batches per event loop iteration (one iteration can run over by the
batch in progress)."""


HANDOFF_BUDGET = 0.005
"""Seconds of batches per iteration, and at most per batch, while a handoff is under way."""
HANDOFF_PRIORITY_SECONDS = 5.0
"""How long one handoff keeps the short budget at most."""


class Turns:
    def __init__(
        self,
        budget: float = ITERATION_BUDGET,
        handoff_budget: float = HANDOFF_BUDGET,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget
        self.handoff_budget = handoff_budget
        self._clock = clock
        self._handoffs: dict[int, float] = {}
        """Key groups in a handoff here (released or awaited), by when it started."""
        self._spent = 0.0
        self._tick_pending = False
        self._iteration = 0
        self._estimates: dict[int, float] = {}
        """Per key group, the seconds its last batch took: what its next one is charged."""
        self._charged: dict[int, tuple[int, float]] = {}
        """Per key group with a batch started: the iteration that started it, and the
        seconds charged to it then."""
        self._waiting: deque[int] = deque()
        """Key groups that gave up a turn, in order: the first goes first."""
        self.given_up = 0
        """Turns given up so far (for tests and diagnostics)."""

    def may_work(self, key_group: int, *, urgent: bool = False) -> bool:
        """Whether ``key_group`` may run a batch now; if not, it yields and asks again.
        ``urgent``: its turn comes now whatever the others (a paused key group)."""
        if not self._tick_pending:
            self._tick_pending = True
            asyncio.get_running_loop().call_soon(self._tick)
        waiting = self._waiting
        if urgent:
            self._charge(key_group)
            return True
        budget = self.handoff_budget if self.handoff_under_way() else self.budget
        if self._spent < budget and (not waiting or waiting[0] == key_group):
            if waiting:
                waiting.popleft()
            self._charge(key_group)
            return True
        if key_group not in waiting:
            waiting.append(key_group)
        self.given_up += 1
        return False

    def handoff_started(self, key_group: int) -> None:
        """``key_group`` is being released here, or claimed: short slices for everyone."""
        self._handoffs.setdefault(key_group, self._clock())

    def handoff_finished(self, key_group: int) -> None:
        self._handoffs.pop(key_group, None)

    def handoff_under_way(self) -> bool:
        """Whether a handoff started here less than ``HANDOFF_PRIORITY_SECONDS`` ago
        is still under way (older ones are forgotten: they no longer count)."""
        if not self._handoffs:
            return False
        oldest = self._clock() - HANDOFF_PRIORITY_SECONDS
        for key_group, started in list(self._handoffs.items()):
            if started < oldest:
                del self._handoffs[key_group]
        return bool(self._handoffs)

    def batch_seconds(self, normal: float) -> float:
        """How long one batch may run now: ``normal``, or the short budget during a
        handoff."""
        return min(normal, self.handoff_budget) if self.handoff_under_way() else normal

    def _charge(self, key_group: int) -> None:
        """``key_group`` starts a batch: this iteration's budget pays what its last took."""
        estimate = self._estimates.get(key_group, 0.0)
        self._spent += estimate
        self._charged[key_group] = (self._iteration, estimate)

    def worked(self, key_group: int, seconds: float) -> None:
        """``key_group``'s batch took ``seconds`` (records processed, store waits not
        counted): this iteration's budget pays them, less what it was charged at the
        start if that was in this iteration too."""
        started, charged = self._charged.pop(key_group, (-1, 0.0))
        self._spent += seconds - charged if started == self._iteration else seconds
        self._estimates[key_group] = seconds

    def leave(self, key_group: int) -> None:
        """``key_group`` has nothing to do (idle, released, stopped): it waits for nothing."""
        if key_group in self._waiting:
            self._waiting.remove(key_group)
        self._charged.pop(key_group, None)

    def _tick(self) -> None:
        """Runs at the start of the loop iteration after the one that first asked: a new
        budget (the sockets were read in between)."""
        self._tick_pending = False
        self._spent = 0.0
        self._iteration += 1
