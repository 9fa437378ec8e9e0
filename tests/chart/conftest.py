"""Fixtures for the chart's tests: the API emulator (``k8s``) and the pod runner
(``pod_runner``) of the end-to-end tests, for the RBAC test's operator run (with the
hook that prints the pods' logs when a test fails)."""

from tests.e2e.conftest import pod_runner, pytest_runtest_makereport
from tests.k8s import k8s

__all__ = ["k8s", "pod_runner", "pytest_runtest_makereport"]
