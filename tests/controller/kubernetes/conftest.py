"""Fixtures of the operator's tests: ``k8s``, a Kubernetes API emulator (tests/k8s)."""

from tests.k8s import k8s  # noqa: F401
