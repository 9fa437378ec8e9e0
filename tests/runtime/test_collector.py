"""The worker process's garbage collector: settled at start, its pauses measured."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from keyshift.runtime.collector import GC_THRESHOLDS, PauseRecorder
from keyshift.runtime.metrics import WorkerMetrics


def test_every_collection_shows_in_the_pause_histogram_by_generation() -> None:
    m = WorkerMetrics("j", "w")
    recorder = PauseRecorder(m.gc_pause)
    recorder.install()
    recorder.install()  # once only
    enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: exactly these two
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        recorder.remove()
        if enabled:
            gc.enable()
    gc.collect(2)  # removed: not counted

    def count(generation: str) -> float | None:
        labels = {**m.labels, "generation": generation}
        return m.registry.get_sample_value("keyshift_gc_pause_seconds_count", labels)

    assert (count("0"), count("1"), count("2")) == (1, 0, 1)
    assert recorder not in gc.callbacks


def test_a_worker_process_freezes_its_imports_and_collects_rarely() -> None:
    """What the worker's entry point does, in a process of its own (it is process-wide):
    the objects of the imports are out of the collector's reach, and a growing heap of
    cache-like entries triggers no full collection."""
    code = textwrap.dedent(
        """
        import gc, sys
        import keyshift.runtime.__main__  # the worker's imports
        from keyshift.runtime.collector import settle_garbage_collector
        before = len(gc.get_objects())
        settle_garbage_collector()
        full = []
        gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2
                            and full.append(1))
        entries = [[i, {"count": i}] for i in range(300_000)]  # a cache filling
        print(before, gc.get_freeze_count(), len(gc.get_objects()), gc.get_threshold(),
              len(full))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split(maxsplit=3)  # fmt: skip
    before, frozen, tracked, rest = int(out[0]), int(out[1]), int(out[2]), out[3]
    assert frozen >= before * 0.9  # the imports' objects: frozen
    assert tracked >= 300_000  # the entries: tracked, not frozen
    thresholds, full = rest.rsplit(maxsplit=1)
    assert thresholds == str(GC_THRESHOLDS)
    assert full == "0"
