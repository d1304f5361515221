"""The blocking (threaded) library: the same names as the package's."""

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
    "Election",
    "Leadership",
    "Lock",
    "LockClient",
    "LockGuard",
    "MultiLock",
    "MultiLockGuard",
    "Observer",
]
