"""The ``keyshift`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from keyshift.store import StoreError
from keyshift.store.admin import add_store_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyshift",
        description="Autoscale stateful stream jobs without moving state.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_store_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (StoreError, ValueError, OSError) as exc:  # a user's mistake or an outage: no traceback
        parser.exit(1, f"keyshift: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
