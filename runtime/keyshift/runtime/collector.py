"""The worker process's garbage collector: settled once it has started, and its pauses
measured.

CPython's cyclic collector stops the event loop while it runs, and a collection of the
oldest generation visits every tracked object: the modules, classes and functions
imported at start (about 25 ms on the benchmark machine), and every entry of the state
cache (about 0.25 µs per cached key: ``python -m benchmarks.gc_pause``).  With the interpreter's
defaults (700, 10, 10) a worker whose cache fills ran such a collection every few seconds
and stopped processing for 25-200 ms each time, on every key group at once.

:func:`settle_garbage_collector` runs at the start of a worker process, after its
imports: the objects that exist then go to the permanent generation, which no collection
visits again, and the thresholds (:data:`GC_THRESHOLDS`) make the young collections
larger and rarer and the full ones rarer still.  The count that triggers a collection is
the *net* growth of tracked objects, so a worker whose cache is full and whose records
come and go triggers almost none.  Cyclic garbage that lives long enough to reach the
oldest generation waits longer for its collection: memory, not pauses.

:class:`PauseRecorder` times every collection (``gc.callbacks``) for the worker's
``keyshift_gc_pause_seconds`` histogram.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

GC_THRESHOLDS = (20_000, 10, 100)
"""``gc.set_threshold``: a young collection per 20,000 net new tracked objects (a few
milliseconds at most), the middle one per ten of those, and the full one considered per
100 of the middle ones (the interpreter also waits until the oldest generation grew by a
quarter since its last full collection)."""


def settle_garbage_collector(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Collect once, freeze what exists (imports, not garbage) and set ``thresholds``.
    For a worker process's start; a library must not call it (it is process-wide)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)


class PauseRecorder:
    """Calls ``observe(generation, seconds)`` after every collection, from the thread that
    ran it.  :meth:`install` and :meth:`remove` add and take away its ``gc`` callback."""

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self._observe = observe
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self._observe(int(info["generation"]), time.perf_counter() - self._started)
            self._started = 0.0

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
