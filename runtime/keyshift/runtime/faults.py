"""Crash points for fault tests: SIGKILL this process at precise moments.

``KEYSHIFT_CRASH_POINTS="commit.after=0.05,release.before=0.5"`` makes
:func:`crash_point` kill the worker with the given probability each time it
passes the named point; ``commit.after@3`` kills it on its third pass.  Unset
(always, in production) it costs one test.  Points: ``commit.before`` (the commit request not sent),
``commit.before.fired`` (the same, passed only by a commit that follows timer firings,
so that their outputs are flushed and the replay writes them again), ``commit.after``
(applied by the store, reply never seen), ``release.before`` (the release not sent: with
nothing left to commit, the final commit done; else the final commit not sent either, as
a handoff's last commit carries its release), ``release.after``, ``claim.after``,
``sweep.after`` (expired values turned into deletes in the cache, not yet committed).
"""

from __future__ import annotations

import os
import random
import signal
import sys

ENV = "KEYSHIFT_CRASH_POINTS"


def parse(spec: str) -> tuple[dict[str, float], dict[str, int]]:
    """``(probabilities, nth pass)`` per point name."""
    probabilities: dict[str, float] = {}
    nth: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        if "@" in item:
            name, _, count = item.partition("@")
            nth[name] = int(count)
        else:
            name, _, probability = item.partition("=")
            probabilities[name] = float(probability or "1")
    return probabilities, nth


_PROBABILITIES, _NTH = parse(os.environ.get(ENV, ""))
_PASSES: dict[str, int] = {}


def crash_point(name: str) -> None:
    if not _PROBABILITIES and not _NTH:
        return
    passes = _PASSES[name] = _PASSES.get(name, 0) + 1
    probability = _PROBABILITIES.get(name, 0.0)
    if passes == _NTH.get(name) or random.random() < probability:
        sys.stderr.write(f"crash point {name}: SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
