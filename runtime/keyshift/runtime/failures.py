"""Key groups a worker could not run because of the store, and when to try again.

A store error that no retry cures (a corrupt metadata field, a key of the wrong type,
state whose metadata is gone, a command the store refuses) stops the key group where it
happened: the claim, or a commit.  The worker then marks it failed (in ``/healthz`` and
the ``keyshift_key_groups_failed`` gauge), logs the error once, and tries again after a
back-off that doubles up to :data:`MAX_BACKOFF_SECONDS`, so that someone who repairs the
store sees the key group resume without restarting the worker, and a worker that cannot
recover does not spin.

Pure bookkeeping: the caller passes the clock in.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0


def backoff_seconds(attempts: int) -> float:
    """Wait before attempt ``attempts + 1``: 1 s, 2 s, 4 s, ... at most 30 s."""
    return min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2.0 ** max(0, attempts - 1))


@dataclass(frozen=True, slots=True)
class KeyGroupFailure:
    error: str
    """What failed, in words (the error's type and message): for the log."""
    error_type: str
    """The error's type alone: for ``/healthz``."""
    since: float
    """Unix time of the first failure in this run of failures."""
    attempts: int
    retry_at: float
    """Unix time before which the key group is not tried again."""


class FailedKeyGroups:
    """The key groups failed for a store error, with their back-off."""

    def __init__(self) -> None:
        self._failures: dict[int, KeyGroupFailure] = {}

    def record(self, key_group: int, error: BaseException, now: float) -> bool:
        """Record a failure; True when it is news (first, or another error): log it."""
        text = f"{type(error).__name__}: {error}"
        previous = self._failures.get(key_group)
        attempts = 1 if previous is None else previous.attempts + 1
        self._failures[key_group] = KeyGroupFailure(
            error=text,
            error_type=type(error).__name__,
            since=now if previous is None else previous.since,
            attempts=attempts,
            retry_at=now + backoff_seconds(attempts),
        )
        return previous is None or previous.error != text

    def clear(self, key_group: int) -> bool:
        """The key group runs again; True when it had failed."""
        return self._failures.pop(key_group, None) is not None

    def waiting(self, key_group: int, now: float) -> bool:
        """Whether the key group is still in its back-off."""
        failure = self._failures.get(key_group)
        return failure is not None and now < failure.retry_at

    def get(self, key_group: int) -> KeyGroupFailure | None:
        return self._failures.get(key_group)

    def __contains__(self, key_group: object) -> bool:
        return key_group in self._failures

    def items(self) -> list[tuple[int, KeyGroupFailure]]:
        return sorted(self._failures.items())
