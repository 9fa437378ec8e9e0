"""Load-aware, low-movement ranges against the count-based split, on skewed loads.

    python -m benchmarks.assignment_skew

A pure computation (no job runs): for per key group load vectors it plans the ranges
by count (``plan_assignment``) and by load (``plan_ranges``) and reports the busiest
worker's load over the mean, the best any contiguous split can do, and how many key
groups each rescale moves. The loads:

- *even*: what the generator source produces (every key group gets the same
  records/s; its Zipf draws keys within a key group);
- *Zipf 1.3 over keys, hashed*: 100,000 keys with Zipf(1.3) frequencies, each key in
  key group ``hash(key) % K`` (how a producer partitions a keyed stream);
- *Zipf 1.3 over key groups*: the key groups' own loads Zipf(1.3), shuffled (seeded),
  the issue's stress case.

Writes ``benchmarks/results/assignment_skew.json`` and the "Load-aware ranges" section
of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_md import replace_section
from keyshift.controller.core.assignment import (
    balance_of,
    best_bottleneck,
    moved,
    plan_assignment,
    plan_ranges,
)
from keyshift.runtime.sources.generator import mix64

RESULTS = Path(__file__).parent / "results"
COMMAND = "python -m benchmarks.assignment_skew"
RESCALES = [(32, 1, 2), (32, 2, 4), (32, 4, 8), (32, 4, 2), (128, 2, 4), (128, 4, 32)]


def zipf_over_keys(key_groups: int, keys: int = 100_000, s: float = 1.3) -> list[float]:
    load = [0.0] * key_groups
    for rank in range(keys):
        load[mix64(rank) % key_groups] += 1 / (rank + 1) ** s
    total = sum(load)
    return [x / total for x in load]


def zipf_over_key_groups(key_groups: int, s: float = 1.3, seed: int = 1) -> list[float]:
    load = [1 / (rank + 1) ** s for rank in range(key_groups)]
    random.Random(seed).shuffle(load)
    total = sum(load)
    return [x / total for x in load]


def even(key_groups: int) -> list[float]:
    return [1.0 / key_groups] * key_groups


LOADS: dict[str, Callable[[int], list[float]]] = {
    "even": even,
    "Zipf 1.3 over keys, hashed": zipf_over_keys,
    "Zipf 1.3 over key groups": zipf_over_key_groups,
}


def row(name: str, load: Sequence[float], k: int, a: int, b: int) -> dict[str, Any]:
    plain_a, plain_b = plan_assignment(k, a), plan_assignment(k, b)
    started = time.perf_counter()
    from_plain = plan_ranges(k, b, load, plain_a)
    seconds = time.perf_counter() - started
    aware_a = plan_ranges(k, a, load, plan_assignment(k, 1)).owners
    from_aware = plan_ranges(k, b, load, aware_a)
    mean = sum(load) / b
    return {
        "load": name,
        "key_groups": k,
        "from": a,
        "to": b,
        "count_based_balance": round(balance_of(plain_b, load, b), 4),
        "load_aware_balance": from_plain.balance,
        "load_aware_balance_from_load_aware": from_aware.balance,
        "best_contiguous_balance": round(best_bottleneck(load, b) / mean, 4),
        "hottest_key_group_over_mean": round(max(load) / mean, 4),
        "count_based_moves": len(moved(plain_a, plain_b)),
        "load_aware_moves_from_count_based": from_plain.moved,
        "load_aware_moves_from_load_aware": from_aware.moved,
        "plan_ms": round(seconds * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args()
    rows = [row(name, make(k), k, a, b) for name, make in LOADS.items() for k, a, b in RESCALES]
    RESULTS.mkdir(exist_ok=True)
    doc = {"command": COMMAND, "python": platform.python_version(), "rows": rows}
    (RESULTS / "assignment_skew.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "| load | K | rescale | busiest/mean: count-based | load-aware | best contiguous "
        "| hottest key group/mean | moves: count-based | load-aware (from count-based) "
        "| load-aware (from load-aware) | plan time |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['load']} | {r['key_groups']} | {r['from']} → {r['to']} "
            f"| {r['count_based_balance']:.2f} | {r['load_aware_balance']:.2f} "
            f"| {r['best_contiguous_balance']:.2f} | {r['hottest_key_group_over_mean']:.2f} "
            f"| {r['count_based_moves']} | {r['load_aware_moves_from_count_based']} "
            f"| {r['load_aware_moves_from_load_aware']} | {r['plan_ms']:.1f} ms |"
        )
    print("\n".join(lines))
    if not args.no_results_md:
        intro = (
            f"`{COMMAND}` — a pure computation over per key group load vectors "
            "(`benchmarks/results/assignment_skew.json`): the count-based split "
            "(`plan_assignment`) beside the load-aware, low-movement ranges (`plan_ranges`, "
            "slack 5%: a plan within 5% of the best contiguous busiest load counts as "
            "equally balanced, and never worse than count-based). *busiest/mean*: the "
            "busiest worker's load over the mean; *best contiguous*: the least any "
            "contiguous split can reach; *hottest key group/mean*: a floor no assignment "
            "of whole key groups goes below. Moves are from the count-based ranges at the "
            "old parallelism (a first load-aware rescale) and from load-aware ones (later "
            "rescales). *even* is the generator's load (it draws Zipf keys within a key "
            "group, every key group gets the same records/s); *Zipf 1.3 over keys, hashed*: "
            "100,000 Zipf(1.3) keys partitioned by hash (the hottest key alone is 26% of "
            "the load); *Zipf 1.3 over key groups*: the key groups' own loads, shuffled."
        )
        replace_section("Load-aware ranges", intro + "\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
