"""The wheel's build hook (hatch_build.py): the hot modules compiled, or pure Python.

CI installs the package editable (pure Python) for the suite, then builds the wheel,
unpacks it and runs the runtime tests again on its compiled modules with
``KEYSHIFT_EXPECT_COMPILED=1`` (``.ci/run``): there the first test checks that the
modules the tests ran are the compiled ones.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sysconfig
from pathlib import Path

import msgspec
import pytest

from hatch_build import HOT_MODULES, CompileError, compile_hot_modules

ROOT = Path(__file__).resolve().parents[1]
EXPECT_COMPILED = os.environ.get("KEYSHIFT_EXPECT_COMPILED") == "1"


@pytest.mark.parametrize("path", HOT_MODULES)
def test_the_hot_modules_run_compiled_from_the_wheel(path: str) -> None:
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    assert module.__file__ is not None
    compiled = module.__file__.endswith(sysconfig.get_config_var("EXT_SUFFIX"))
    assert compiled == EXPECT_COMPILED, module.__file__


@pytest.mark.parametrize("path", HOT_MODULES)
def test_no_hot_module_defines_a_struct(path: str) -> None:
    """mypyc drops class keywords: a frozen Struct compiled would not be frozen."""
    name = path.removesuffix(".py").replace("/", ".")
    module = importlib.import_module(name)
    defined = [
        cls.__name__
        for cls in vars(module).values()
        if inspect.isclass(cls) and issubclass(cls, msgspec.Struct) and cls.__module__ == name
    ]
    assert not defined, f"move {defined} out of {path}, or the module out of HOT_MODULES"


def test_without_a_c_compiler_the_build_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook catches CompileError and builds pure Python; the error names the cause."""
    monkeypatch.setenv("CC", "/bin/false")
    with pytest.raises(CompileError, match="/bin/false"):
        compile_hot_modules(ROOT, tmp_path)
