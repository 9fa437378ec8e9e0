"""One error tree: every exception keyshift defines for its users is a KeyshiftError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import keyshift
from keyshift.errors import KeyshiftError

INTERNAL = {
    # control flow inside one module, never seen by a user
    "keyshift.runtime.cache.CacheMiss",
    "keyshift.runtime.keygroup._NotLoaded",
    # a BaseException on purpose, so that a user function's `except Exception` cannot
    # swallow it; the runtime turns it into CorruptStateError
    "keyshift.runtime.api.CorruptState",
}
"""Exceptions that are not errors for a user (they never leave their module)."""

SKIP_MODULES = ("keyshift.controller.kubernetes.handlers",)  # imports kopf's operator setup


def defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(keyshift.__path__, "keyshift."):
        if info.name.startswith(SKIP_MODULES) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_error_keyshift_defines_is_a_keyshift_error() -> None:
    found = defined_exceptions()
    assert len(found) > 20  # the walk saw the packages
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, KeyshiftError))
    assert set(outside) == INTERNAL, f"not KeyshiftError: {set(outside) - INTERNAL}"


def test_the_tree_in_the_docstring_names_real_errors() -> None:
    doc = keyshift.errors.__doc__ or ""
    named = set(
        re.findall(
            r"\b([A-Z][A-Za-z]+(?:Error|Spec|Settings|URL|Large|Unavailable|"
            r"Lost|Status|Manifest|Running))\b",
            doc,
        )
    )
    by_name = {cls.__name__: cls for cls in defined_exceptions().values()}
    named -= {"ValueError", "RuntimeError", "YAMLError", "KeyshiftError"}
    assert named <= set(by_name), f"named but not defined: {named - set(by_name)}"
    assert all(issubclass(by_name[n], KeyshiftError) for n in named)
