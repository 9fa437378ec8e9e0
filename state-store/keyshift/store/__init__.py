"""keyshift's remote state store: a typed protocol, its Valkey/Redis backend and an
in-process backend (``MemoryStore``) for benchmarks and tests."""

from keyshift.store.client import InvalidStoreURL, open_store, parse_store_url
from keyshift.store.memory_backend import MemoryStore
from keyshift.store.protocol import (
    NO_OWNER,
    Assignment,
    Claim,
    CommitResult,
    Fenced,
    JobInfo,
    KeyGroupDump,
    KeyGroupInfo,
    Released,
    ScanPage,
    StaleClaim,
    StaleGeneration,
    StateStore,
    StillOwned,
    StoreCorrupt,
    StoreError,
    StoreMisconfigured,
    StoreRejected,
    StoreUnavailable,
    Timer,
    TimerChanges,
)
from keyshift.store.redis_backend import RedisStateStore

__all__ = [
    "NO_OWNER",
    "Assignment",
    "Claim",
    "CommitResult",
    "Fenced",
    "InvalidStoreURL",
    "JobInfo",
    "KeyGroupDump",
    "KeyGroupInfo",
    "MemoryStore",
    "RedisStateStore",
    "Released",
    "ScanPage",
    "StaleClaim",
    "StaleGeneration",
    "StateStore",
    "StillOwned",
    "StoreCorrupt",
    "StoreError",
    "StoreMisconfigured",
    "StoreRejected",
    "StoreUnavailable",
    "Timer",
    "TimerChanges",
    "open_store",
    "parse_store_url",
]
