"""Locks for the LOCK.* Redis module, on redis-py: sync (``redis_lock_client``) and asyncio
(``AsyncLockClient``, in ``redis_lock_client.aio``).

>>> client = LockClient.from_url("redis://127.0.0.1:6379/")
>>> with client.lock("orders:42", lease=10, wait_timeout=5) as guard:
...     write(guard.token)   # the fencing token
"""

from ._common import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_LEASE,
    Kind,
    LockConnectionError,
    LockError,
    LockServerError,
    LockTimeout,
    LostReason,
    LostSignal,
    NotHeld,
    Release,
    Renewal,
    UnexpectedReply,
    lost_signal_channel,
)
from .aio import AsyncLock, AsyncLockClient, AsyncLockGuard, AsyncMultiLock, AsyncMultiLockGuard
from .sync import Lock, LockClient, LockGuard, MultiLock, MultiLockGuard

__all__ = [
    "AsyncLock",
    "AsyncLockClient",
    "AsyncLockGuard",
    "AsyncMultiLock",
    "AsyncMultiLockGuard",
    "DEFAULT_COMMAND_TIMEOUT",
    "DEFAULT_LEASE",
    "Kind",
    "Lock",
    "LockClient",
    "LockConnectionError",
    "LockError",
    "LockGuard",
    "LockServerError",
    "LockTimeout",
    "MultiLock",
    "MultiLockGuard",
    "LostReason",
    "LostSignal",
    "NotHeld",
    "Release",
    "Renewal",
    "UnexpectedReply",
    "lost_signal_channel",
]
