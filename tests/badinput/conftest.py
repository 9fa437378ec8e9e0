"""Fixtures of the bad-input tests: the API emulator (``k8s``) and the pod runner."""

from tests.e2e.conftest import pod_runner
from tests.k8s import k8s

__all__ = ["k8s", "pod_runner"]
