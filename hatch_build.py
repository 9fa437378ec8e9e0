"""Wheel build hook: compile the worker's hot modules with mypyc, or build pure Python.

A wheel (``pip install .``, the container image) gets :data:`HOT_MODULES` compiled to C
extensions beside their ``.py`` files: Python imports the extension first, so the same
code runs, faster (``benchmarks/RESULTS.md``, "Hot path (issue 18, third step)").
Nothing else changes: the modules are the typed Python the repository holds.

Pure Python, with a warning and nothing else lost, when:

- the install is editable (``pip install -e .``: the sources run as they are);
- ``KEYSHIFT_COMPILE=0`` is set;
- compiling fails (no C compiler, say).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HOT_MODULES = (
    "keyshift/runtime/keygroup.py",
    "keyshift/runtime/cache.py",
    "keyshift/runtime/sources/generator.py",
    "keyshift/runtime/kafka/source.py",
)
"""The per-record path (the batch loop, the record context, the state cache, the
generator, the Kafka source's buffers and decoding), as paths in the installed package.

What stays interpreted, and why: the modules users import their jobs' types from
(``keyshift.runtime.api``: mypyc's classes are not subscriptable, ``Job[Event]``), and
modules that define msgspec Structs (``sinks.py``): mypyc drops a class's keywords, so a
``frozen=True`` Struct compiled would be neither frozen nor hashable
(``tests/test_compiled.py`` checks that no hot module defines one)."""

COMPONENTS = ("api", "state-store", "runtime", "operator")
"""The folders whose ``keyshift/`` portions make up the package (pyproject.toml)."""

GROUP = "keyshift_hot"
"""mypyc's shared library: ``keyshift_hot__mypyc.<abi>.so`` at the top of the wheel."""

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
setup(
    name="keyshift-hot",
    ext_modules=mypycify(sys.argv[1:], group_name={group!r}),
    script_args=["build_ext", "--inplace"],
)
"""


class CompileError(Exception):
    """mypyc or the C compiler failed; the wheel is built pure Python."""


def compile_hot_modules(root: Path, work: Path) -> list[Path]:
    """Compile :data:`HOT_MODULES` of the sources under ``root`` in ``work``; return the
    extension files, each under ``work`` at its path in the installed package."""
    for component in COMPONENTS:  # one tree, as installed: mypy resolves the imports
        shutil.copytree(root / component / "keyshift", work / "keyshift", dirs_exist_ok=True)
    command = [
        sys.executable,
        "-c",
        _SETUP.format(group=GROUP),
        "--ignore-missing-imports",  # the build environment has no runtime dependencies
        "--explicit-package-bases",  # module names from the paths, as installed
        *HOT_MODULES,
    ]
    env = {**os.environ, "MYPYPATH": str(work)}
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise CompileError("\n".join(tail))
    built = sorted(work.glob(f"{GROUP}__mypyc.*"))
    for module in HOT_MODULES:
        stem = Path(module).with_suffix("")
        built += sorted(work.glob(f"{stem}.*.so")) + sorted(work.glob(f"{stem}.*.pyd"))
    if len(built) != len(HOT_MODULES) + 1:
        raise CompileError(f"expected {len(HOT_MODULES) + 1} extensions, built {built}")
    return built


class HotModulesHook(BuildHookInterface[Any]):
    """hatchling's custom build hook (``[tool.hatch.build.targets.wheel.hooks.custom]``)."""

    _work: str | None = None

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version != "standard" or os.environ.get("KEYSHIFT_COMPILE") == "0":
            return  # "editable" runs the sources; "metadata" needs no extensions
        self._work = tempfile.mkdtemp(prefix="keyshift-mypyc-")
        work = Path(self._work)
        self.app.display_info(f"keyshift: compiling {', '.join(HOT_MODULES)} with mypyc")
        try:
            built = compile_hot_modules(Path(self.root), work)
        except (CompileError, OSError) as exc:
            self.app.display_warning(
                f"keyshift: compiling the hot modules failed, building pure Python:\n{exc}"
            )
            return
        for path in built:
            build_data["force_include"][str(path)] = path.relative_to(work).as_posix()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
