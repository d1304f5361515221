"""Locks for the LOCK.* Redis module, on redis-py: sync (``redis_lock_client``) and asyncio
(``AsyncLockClient``, in ``redis_lock_client.aio``).

>>> client = LockClient.from_url("redis://127.0.0.1:6379/")
>>> with client.lock("orders:42", lease=10, wait_timeout=5) as guard:
...     write(guard.token)   # the fencing token
>>> with client.election("svc").campaign(value="10.0.0.1:80") as leadership:
...     serve(fence=leadership.epoch)   # leader election: the epoch is a fencing token
"""

from ._common import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_LEASE,
    Kind,
    Leader,
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
    leader_channel,
    lost_signal_channel,
)
from .aio import (
    AsyncElection,
    AsyncLeadership,
    AsyncLock,
    AsyncLockClient,
    AsyncLockGuard,
    AsyncMultiLock,
    AsyncMultiLockGuard,
    AsyncObserver,
)
from .sync import (
    Election,
    Leadership,
    Lock,
    LockClient,
    LockGuard,
    MultiLock,
    MultiLockGuard,
    Observer,
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
    "DEFAULT_COMMAND_TIMEOUT",
    "DEFAULT_LEASE",
    "Election",
    "Kind",
    "Leader",
    "Leadership",
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
    "Observer",
    "Release",
    "Renewal",
    "UnexpectedReply",
    "leader_channel",
    "lost_signal_channel",
]
