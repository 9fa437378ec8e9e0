"""keyshift's remote state store: a typed protocol and its Valkey/Redis backend."""

from keyshift.store.client import InvalidStoreURL, open_store, parse_store_url
from keyshift.store.protocol import (
    NO_OWNER,
    Assignment,
    Claim,
    CommitResult,
    Fenced,
    JobInfo,
    KeyGroupDump,
    KeyGroupInfo,
    ScanPage,
    StaleClaim,
    StaleGeneration,
    StateStore,
    StoreCorrupt,
    StoreError,
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
    "RedisStateStore",
    "ScanPage",
    "StaleClaim",
    "StaleGeneration",
    "StateStore",
    "StoreCorrupt",
    "StoreError",
    "StoreRejected",
    "StoreUnavailable",
    "Timer",
    "TimerChanges",
    "open_store",
    "parse_store_url",
]
