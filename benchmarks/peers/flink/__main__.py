"""Flink alone: ``python -m benchmarks.peers.flink [--sizes 1e5] [--modes native]``.

Sets the peer up from nothing (venv, distribution, compiled job), runs the
rescale workload at each size, prints the rows compare.json would hold and
tears the clusters down. ``--setup-only`` stops after the setup.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.peers.flink import measure
from benchmarks.peers.flink.peer import WORK, setup


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sizes", default="1e5")
    p.add_argument("--modes", default="native")
    p.add_argument("--backend", default="rocksdb", choices=["rocksdb", "forst"])
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--no-failover", action="store_true")
    p.add_argument("--setup-only", action="store_true")
    args = p.parse_args()
    home, jar = setup()
    print(f"FLINK_HOME={home}\njob jar: {jar}")
    if args.setup_only:
        return 0
    clusters = measure.Clusters(WORK / "alone", backend=args.backend)
    try:
        for part in args.sizes.split(","):
            rows = measure.run_size(
                int(float(part)),
                clusters,
                modes=tuple(args.modes.split(",")),
                rate=args.rate,
                failover=not args.no_failover,
            )
            print(json.dumps({k: v for k, v in rows.items() if k != "events"}, indent=1))
    finally:
        clusters.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
