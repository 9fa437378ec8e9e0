"""Fixtures of the controller tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.controller.localjob import LocalJob


@pytest.fixture
def local_jobs() -> Iterator[list[LocalJob]]:
    """``keyshift run`` supervisors a test started; each is stopped (Ctrl-C) at the end."""
    jobs: list[LocalJob] = []
    yield jobs
    for job in jobs:
        job.close()
