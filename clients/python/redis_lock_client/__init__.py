"""Locks for the LOCK.* Redis module, on redis-py: sync (``LockClient``) and asyncio
(``AsyncLockClient``). The asyncio library is the source; the sync one is generated from it
(``clients/python/unasync.py``), but for the few lines where threads and tasks differ.

>>> client = LockClient.from_url("redis://127.0.0.1:6379/")
>>> with client.lock("orders:42", lease=10, wait_timeout=5) as guard:
...     write(guard.token)   # the fencing token
>>> with client.election("svc").campaign(value="10.0.0.1:80") as leadership:
...     serve(fence=leadership.epoch)   # leader election: the epoch is a fencing token
"""

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
from ._commands import Leader
from ._common import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_FAILOVER_TIMEOUT,
    DEFAULT_LEASE,
    DEFAULT_REPLICAS_TIMEOUT,
    Backend,
    Fenced,
    Kind,
    LockConnectionError,
    LockError,
    LockServerError,
    LockTimeout,
    LostCallback,
    LostReason,
    NoPermission,
    NotHeld,
    NotSafelyAcquired,
    NotSupported,
    Release,
    Renewal,
    UnexpectedReply,
    __version__,
)
from ._messages import leader_channel, lost_signal_channel
from ._sync import (
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
    "Backend",
    "DEFAULT_COMMAND_TIMEOUT",
    "DEFAULT_FAILOVER_TIMEOUT",
    "DEFAULT_LEASE",
    "DEFAULT_REPLICAS_TIMEOUT",
    "Election",
    "Fenced",
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
    "LostCallback",
    "LostReason",
    "MultiLock",
    "MultiLockGuard",
    "NoPermission",
    "NotHeld",
    "NotSafelyAcquired",
    "NotSupported",
    "Observer",
    "Release",
    "Renewal",
    "UnexpectedReply",
    "__version__",
    "leader_channel",
    "lost_signal_channel",
]
