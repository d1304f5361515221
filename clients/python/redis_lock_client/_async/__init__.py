"""The asyncio library (the source: ``_sync/`` is generated from it by ``unasync.py``)."""

from ._client import AsyncLockClient
from ._election import AsyncElection, AsyncLeadership, AsyncObserver
from ._lock import AsyncLock, AsyncLockGuard, AsyncMultiLock, AsyncMultiLockGuard

__all__ = [
    "AsyncElection",
    "AsyncLeadership",
    "AsyncLock",
    "AsyncLockClient",
    "AsyncLockGuard",
    "AsyncMultiLock",
    "AsyncMultiLockGuard",
    "AsyncObserver",
]
