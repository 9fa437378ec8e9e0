"""The StreamJob API's names, defined once: its group, version, kind and plural (the
CRD, the operator's client and the tests use these), and the names of a job's workers."""

from __future__ import annotations

from typing import Final

API_VERSION: Final = "keyshift.dev/v1alpha1"
GROUP: Final = API_VERSION.partition("/")[0]
VERSION: Final = API_VERSION.partition("/")[2]
KIND: Final = "StreamJob"
PLURAL: Final = "streamjobs"
SINGULAR: Final = "streamjob"
"""The StreamJob API's names, defined here once (the CRD, the operator's client and the
tests use these)."""


def worker_name(job: str, ordinal: int) -> str:
    """A worker's name: its pod's name, ``<job>-worker-<i>``."""
    return f"{job}-worker-{ordinal}"


def ordinal_of(job: str, name: str) -> int | None:
    """The ordinal in a worker's name (:func:`worker_name`), or None if it is not one."""
    prefix = f"{job}-worker-"
    suffix = name[len(prefix) :]
    return int(suffix) if name.startswith(prefix) and suffix.isdigit() else None
