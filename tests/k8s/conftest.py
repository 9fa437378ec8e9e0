"""The ``k8s`` fixture for this package (defined in tests/k8s/__init__.py)."""

from tests.k8s import k8s

__all__ = ["k8s"]
