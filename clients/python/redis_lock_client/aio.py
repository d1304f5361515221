"""The asyncio library (``redis.asyncio``): the same names as the package's ``Async*``."""

from ._async import (
    AsyncElection,
    AsyncLeadership,
    AsyncLock,
    AsyncLockClient,
    AsyncLockGuard,
    AsyncMultiLock,
    AsyncMultiLockGuard,
    AsyncObserver,
)

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
