# Generated from redis_lock_client/_async/__init__.py by clients/python/unasync.py:
# edit that file and run the script, not this one.
"""The sync library (threads), generated from ``_async/`` by ``unasync.py``."""

from ._client import LockClient
from ._election import Election, Leadership, Observer
from ._lock import Lock, LockGuard, MultiLock, MultiLockGuard

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
