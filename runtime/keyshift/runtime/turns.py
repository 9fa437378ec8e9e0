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
"""

from __future__ import annotations

import asyncio
from collections import deque

ITERATION_BUDGET = 0.02
"""Seconds of batches per event loop iteration (one iteration can run over by the
batch in progress)."""


class Turns:
    def __init__(self, budget: float = ITERATION_BUDGET) -> None:
        self.budget = budget
        self._spent = 0.0
        self._tick_pending = False
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
            return True
        if self._spent < self.budget and (not waiting or waiting[0] == key_group):
            if waiting:
                waiting.popleft()
            return True
        if key_group not in waiting:
            waiting.append(key_group)
        self.given_up += 1
        return False

    def worked(self, seconds: float) -> None:
        """A batch took ``seconds`` of this iteration's budget."""
        self._spent += seconds

    def leave(self, key_group: int) -> None:
        """``key_group`` has nothing to do (idle, released, stopped): it waits for nothing."""
        if key_group in self._waiting:
            self._waiting.remove(key_group)

    def _tick(self) -> None:
        """Runs at the start of the loop iteration after the one that first asked: a new
        budget (the sockets were read in between)."""
        self._tick_pending = False
        self._spent = 0.0
