# Generated from redis_lock_client/_async/_unlocked.py by clients/python/unasync.py:
# edit that file and run the script, not this one.
"""An acquire that waits on a server with the ``redislock`` Functions library, which cannot
block: it listens to the lock's unlock message and asks again at each one, and when the
holder's lease ends."""

from __future__ import annotations

import time
from typing import Any, Optional

from .._commands import info, lease_left
from .._messages import unlock_channel
from ._backend import IO_ERRORS, RawConnection, close_connection, read
from ._connection import Connector, call

#: How long after the holder's lease ends the acquire is asked again (Redis removes an expired
#: key when it is next touched: the acquire itself).
LEASE_MARGIN = 0.002


def wait_unlocked(
    connector: Connector, args: list[Any], key: bytes, owner: bytes, until: Optional[float]
) -> Any:
    """``args`` (an acquire that does not wait) until it is granted or ``until`` (monotonic;
    None: no end) passes: subscribed first (``SUBSCRIBE`` to the unlock channel, on a
    connection of its own, named for ``owner``), then asked; while refused, asked again at each
    message on the channel (a hint: anything on it only has the acquire asked again), and at
    the holder's lease end (read with ``LOCK.INFO``'s ``lock_info``) or the deadline, whichever
    comes first. The acquire's reply: the token, or None (not granted by the deadline). A
    read that timed out or broke has the channel subscribed again before the next ask, so that
    no release between the two is missed. Each acquire carries ONCE: asking again never counts
    a re-entry twice."""
    channel = unlock_channel(key)
    listening: Optional[RawConnection] = None
    try:
        while True:
            if listening is None and (until is None or time.monotonic() < until):
                listening = connector.new(owner)
                call(listening, ["SUBSCRIBE", channel], connector.timeout)
            reply = connector.query(args)
            if reply is not None:
                return reply
            left = None if until is None else until - time.monotonic()
            if listening is None or (left is not None and left <= 0):
                return None
            lease = lease_left(connector.query(info(key)))
            if lease is None:
                continue  # freed meanwhile: asked again at once
            pause = left if lease < 0 else lease / 1000 + LEASE_MARGIN
            if left is not None and pause is not None:
                pause = min(pause, left)
            try:
                read(listening, pause)  # a message (what it says does not matter)
            except IO_ERRORS:
                # The lease's end or the deadline (the read's end closes the connection), or
                # a broken connection: asked again, listening afresh.
                close_connection(listening)
                listening = None
    finally:
        if listening is not None:
            close_connection(listening)
