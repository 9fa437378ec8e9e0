"""Keep ``benchmarks/RESULTS.md`` as sections that each benchmark rewrites."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS_MD = Path(__file__).parent / "RESULTS.md"
HEADER = (
    "# Benchmark results\n\n"
    "Each section is written by the benchmark it names; rerun the command to refresh it.\n"
    "Machines here are shared and noisy: compare figures of one run, as ratios.\n"
)


def replace_section(title: str, body: str, path: Path = RESULTS_MD) -> None:
    """Replace (or append) the ``## title`` section of ``path`` with ``body``."""
    text = path.read_text() if path.exists() else HEADER
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)
