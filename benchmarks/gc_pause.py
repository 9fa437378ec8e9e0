"""How long a full garbage collection stops a worker, by the keys its state cache holds.

    python -m benchmarks.gc_pause [--keys 10000,100000,1000000] [--repeats 5]

In a fresh process per size, settled as a worker process is
(:func:`keyshift.runtime.collector.settle_garbage_collector`, after the worker's
imports), a real :class:`keyshift.runtime.cache.StateCache` is filled with the keys of
the counter example (two states per key, ints, kept decoded) and committed (clean, as a
cache mostly is); then ``gc.collect()`` is timed ``--repeats`` times (median).  Also
shown: the same collection without the freeze (the imports visited too).  Prints a
Markdown table; ``--output`` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

PROBE = """
import gc, json, sys, time
import keyshift.runtime.__main__  # a worker's imports
from keyshift.runtime.cache import StateCache
from keyshift.runtime.collector import settle_garbage_collector
keys, repeats, freeze = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
if freeze:
    settle_garbage_collector()
cache = StateCache(1 << 40)
for state in ("count", "sum"):
    cache.register(state, encode=str.encode, decode=bytes.decode)
for i in range(keys):
    cache.put_key(i % 8, b"key-%d" % i, {"count": i, "sum": 2 * i})
for kg in range(8):
    cache.committed(kg)
times = []
for _ in range(repeats):
    started = time.perf_counter()
    gc.collect()
    times.append(time.perf_counter() - started)
print(json.dumps({"keys": len(cache), "tracked": len(gc.get_objects()), "seconds": times}))
"""


def measure(keys: int, repeats: int, freeze: bool) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(keys), str(repeats), "1" if freeze else "0"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    data = json.loads(out)
    median = statistics.median(data["seconds"])
    return {"keys": data["keys"], "tracked": data["tracked"], "median_seconds": median}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--keys", default="10000,100000,1000000")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output", type=Path)
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    for keys in (int(float(k)) for k in args.keys.split(",")):
        settled = measure(keys, args.repeats, freeze=True)
        default = measure(keys, args.repeats, freeze=False)
        rows.append({"keys": keys, "settled": settled, "not_frozen": default})
        settled_ms = float(settled["median_seconds"]) * 1000
        default_ms = float(default["median_seconds"]) * 1000
        print(f"{keys:,} keys: full collection {settled_ms:.1f} ms settled, "
              f"{default_ms:.1f} ms not frozen", flush=True)  # fmt: skip
    print("\n| cached keys | full collection, settled | per key | not frozen (imports too) |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        s, d = r["settled"], r["not_frozen"]
        per_key = 1e6 * float(s["median_seconds"]) / r["keys"]
        print(f"| {r['keys']:,} | {float(s['median_seconds']) * 1000:.1f} ms | {per_key:.2f} µs "
              f"| {float(d['median_seconds']) * 1000:.1f} ms |")  # fmt: skip
    if args.output:
        args.output.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows},
                                          indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
