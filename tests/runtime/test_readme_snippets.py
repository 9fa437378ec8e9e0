"""Every Python snippet of runtime/README.md runs: the ```python blocks, in order, in one
namespace (a later one uses what an earlier one defined), as a reader would paste them.
The snippets assert what the README says about them."""

from __future__ import annotations

import re
from typing import Any

from tests.support import REPO

README = REPO / "runtime" / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """The ```python blocks of ``markdown``: (line of the block's first line, code)."""
    found = _BLOCK.finditer(markdown)
    return [(markdown.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in found]


def test_the_block_extraction() -> None:
    text = "intro\n```python\nx = 1\n```\n```yaml\ny: 2\n```\n```python\nassert x == 1\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (9, "assert x == 1\n")]


def test_every_python_snippet_of_the_runtime_readme_runs() -> None:
    text = README.read_text()
    blocks = python_blocks(text)
    writing = text.index("## Writing a job")
    in_writing = [code for line, code in blocks if writing < text.index(code)]
    assert len(in_writing) >= 3 and any("JobHarness" in code for code in in_writing)
    assert all(code.count("```") == 0 for _, code in blocks)
    namespace: dict[str, Any] = {"__name__": "runtime_readme"}
    for line, code in blocks:
        # compiled with the README's name and line numbers: a failure points at the line
        exec(compile("\n" * (line - 1) + code, str(README), "exec"), namespace)
    assert namespace["h"].timers() == []  # the harness snippet ran to its end
