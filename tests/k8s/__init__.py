"""Test support: a Kubernetes API emulator (kmock-based) for the operator's tests.

``KubernetesEmulator`` (in ``tests.k8s.emulator``) serves the Kubernetes API over real
HTTP on ``127.0.0.1`` from a background thread; see that module for what is and is
not emulated.  The ``k8s`` fixture starts one per test and stops it afterwards::

    def test_something(k8s: KubernetesEmulator) -> None:
        k8s.kubectl("apply", "-f", "crds/streamjob.yaml")
        env = {**os.environ, "KUBECONFIG": str(k8s.kubeconfig)}   # for kopf / clients
        ...
        assert k8s.get("configmaps", "x") is not None

Other test packages use it with ``from tests.k8s import k8s  # noqa: F401`` in their
``conftest.py`` (``tests/k8s/conftest.py`` does exactly that).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.emulator import KubernetesEmulator

__all__ = ["KubernetesEmulator", "k8s"]


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[KubernetesEmulator]:
    """A fresh emulator; ``.url``, ``.kubeconfig`` and helpers to read/write objects."""
    emulator = KubernetesEmulator(tmp_path).start()
    try:
        yield emulator
    finally:
        emulator.stop()
