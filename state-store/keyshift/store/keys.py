"""Key names in the Valkey/Redis backend.

Every key of one key group carries the hash tag ``{<job>/<kg>}``, so a key
group lives in one cluster slot and a commit is one atomic script.  Job-level
keys carry ``{<job>}``.
"""

from __future__ import annotations

PREFIX = "ks"


def key_group_tag(job: str, key_group: int) -> str:
    return f"{{{job}/{key_group}}}"


def meta(job: str, key_group: int) -> str:
    """Hash: epoch, token, owner, seq, position, watermark, generations."""
    return f"{PREFIX}:{key_group_tag(job, key_group)}:meta"


def names(job: str, key_group: int) -> str:
    """Set of the key group's state names (``s:<name>``), entry states (also ``e:<name>``)
    and timer queues (``t:<queue>``)."""
    return f"{PREFIX}:{key_group_tag(job, key_group)}:names"


def state(job: str, key_group: int, state_name: str) -> str:
    """Hash: state key -> value."""
    return f"{PREFIX}:{key_group_tag(job, key_group)}:s:{state_name}"


def entry_index(job: str, key_group: int, state_name: str) -> str:
    """Sorted set (all scores 0): the fields of an entry state's hash, in byte order, so
    that one key's entries are a lexicographic range (``ZRANGEBYLEX``)."""
    return f"{PREFIX}:{key_group_tag(job, key_group)}:e:{state_name}"


def timers(job: str, key_group: int, queue: str) -> str:
    """Sorted set: timer payload scored by its time."""
    return f"{PREFIX}:{key_group_tag(job, key_group)}:t:{queue}"


def releases_channel(job: str) -> str:
    """Sharded pub/sub channel on which every key group's release is announced (the
    message: the key group's number); each worker subscribes once, for its life."""
    return f"{PREFIX}:{{{job}}}:released"


def job_info(job: str) -> str:
    return f"{PREFIX}:{{{job}}}:info"


def assignment(job: str) -> str:
    return f"{PREFIX}:{{{job}}}:assignment"


def assignment_channel(job: str) -> str:
    """Sharded pub/sub channel announcing new generations (same slot as the record)."""
    return f"{PREFIX}:{{{job}}}:assignment:changed"


def alive(job: str) -> str:
    """Hash: worker -> unix time of its last heartbeat (removed when it stops cleanly)."""
    return f"{PREFIX}:{{{job}}}:alive"


def worker_generations(job: str) -> str:
    return f"{PREFIX}:{{{job}}}:workers"


def job_patterns(job: str) -> list[str]:
    """SCAN patterns matching every key of a job (and no other job's)."""
    return [f"{PREFIX}:{{{job}}}:*", f"{PREFIX}:{{{job}/*"]
