"""The lost-hold signal's listener: one pub/sub connection per server (per master in a
cluster), read by one task (a thread in the threaded library).

It knows what it listens for only through a callback: each watcher names its channels and takes
the messages of them (``Watcher.signal``); the watcher decides what a message means for it. In
a cluster the key channels are shard channels (``SSUBSCRIBE``), as the server sends them with
``SPUBLISH``. The connection also listens to the flush channel (classic ``SUBSCRIBE``; a cluster
``PUBLISH`` reaches every node): a flush of its database goes to every watcher. When the server
drops a shard channel by itself (its slot left the node), the watchers of that channel are
handed to ``on_slot_left``. Pub/sub is at-most-once: a message sent while the connection is down
is gone, and the watchdog stays the backstop.

A subscription the ACL refuses (``NOPERM``: the user lacks the channel's ``&`` rule) is told to
the watchers waiting for it at once, as ``NoPermission`` naming the channel (the server's error
line names none on Redis 7.0: each reply answers the oldest (un)subscription sent and not yet
answered, ``Subscriber.answered``). A refused channel is forgotten, so the next watcher asks
again (the ACL may have changed meanwhile).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable, Optional, Protocol

from redis.exceptions import ResponseError

from .. import _fork
from .._common import LockConnectionError, NoPermission
from .._connect import server_error
from .._messages import LostMessage, flush_channel, parse_flush, parse_lost
from ._backend import CLOSED, IO_ERRORS, Event, Subscriber, sleep, spawn, wait_event
from ._connection import FOLLOW_PERIOD, Connector


#: The listener's first pause between two tries to connect, doubled each try up to
#: ``RETRY_MAX``; a new watcher wakes it, but never closer than this to the last try.
RETRY_FIRST = 0.05
RETRY_MAX = 2.0


class _Confirmation:
    """One subscription's outcome: ``done`` is set once the server confirmed it, or refused it
    (``refused``)."""

    def __init__(self) -> None:
        self.done = Event()
        self.refused: Optional[NoPermission] = None


class Watcher(Protocol):
    """What listens: its channels, and what it makes of a message of one of them."""

    @property
    def channels(self) -> set[bytes]: ...

    def signal(self, message: LostMessage) -> None: ...


class SignalHub:
    def __init__(
        self,
        connector: Connector,
        sharded: bool,
        on_slot_left: Callable[[SignalHub, list[Watcher]], None],
    ) -> None:
        self._connector = connector
        self._subscribe = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        self._unsubscribe = "SUNSUBSCRIBE" if sharded else "UNSUBSCRIBE"
        self.db = connector.db
        self._on_slot_left = on_slot_left
        self._reset()
        _fork.register(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[bytes, list[weakref.ref[Watcher]]] = {}
        self._confirmed: dict[bytes, _Confirmation] = {}
        #: The flush channel's subscription on the current connection (made afresh on each).
        self._flush = _Confirmation()
        self._sub: Optional[Subscriber] = None
        #: Set by a new watcher while the listener is not connected: it connects at once
        #: instead of after its growing pause (after a failover the pause reached up to 2 s,
        #: and a new hold waits for its subscription's confirmation before it is handed out).
        self._wake = Event()
        self._running = False
        self._closed = False

    async def watch(self, watcher: Watcher) -> None:
        """Subscribes to the watcher's channels; returns once the server confirmed them and the
        flush channel (or after the command timeout: the watchdog still covers the hold).
        Raises ``NoPermission`` naming the channel as soon as the ACL refused one of them."""
        waits: list[_Confirmation] = []
        with self._lock:
            for channel in watcher.channels:
                entry = self._watched.setdefault(channel, [])
                entry[:] = [r for r in entry if r() is not None]
                entry.append(weakref.ref(watcher))
                confirmation = self._confirmed.get(channel)
                if confirmation is None:
                    confirmation = self._confirmed[channel] = _Confirmation()
                    if self._sub is not None:
                        self._sub.post(self._subscribe, channel)
                waits.append(confirmation)
            if self._flush.refused is not None:
                # Refused on this connection: asked again (the ACL may have changed).
                self._flush = _Confirmation()
                if self._sub is not None:
                    self._sub.post("SUBSCRIBE", flush_channel())
            waits.append(self._flush)
            start = not self._running
            self._running = True
            if self._sub is None:
                self._wake.set()
        if start:
            spawn("redis-lock-signal", self._run)
        until = time.monotonic() + self._connector.timeout
        for confirmation in waits:
            await wait_event(confirmation.done, max(until - time.monotonic(), 0.0))
            if confirmation.refused is not None:
                raise confirmation.refused

    def unwatch(self, watcher: Watcher) -> None:
        with self._lock:
            for channel in watcher.channels:
                entry = self._watched.get(channel)
                if entry is None:
                    continue
                entry[:] = [r for r in entry if r() not in (None, watcher)]
                if entry:
                    continue
                del self._watched[channel]
                self._confirmed.pop(channel, None)
                if self._sub is not None:
                    self._sub.post(self._unsubscribe, channel)

    def resubscribe(self, watcher: Watcher) -> None:
        """Subscribes the watcher's channels again (the server dropped them, but they are
        served here after all)."""
        with self._lock:
            for channel in watcher.channels:
                if channel in self._watched and self._sub is not None:
                    self._sub.post(self._subscribe, channel)

    async def close(self) -> None:
        self._closed = True
        sub = self._sub
        if sub is not None:
            await sub.close()

    async def _run(self) -> None:
        delay = RETRY_FIRST
        while not self._closed:
            tried = time.monotonic()
            try:
                sub = Subscriber(await self._connector.new())
            except LockConnectionError:
                await wait_event(self._wake, delay)
                self._wake.clear()
                # Woken by a new watcher: still at least the first pause between two tries
                # (connections refused while commands pass, as at maxclients, would otherwise
                # be tried at the pace of the acquires).
                await sleep(max(0.0, tried + RETRY_FIRST - time.monotonic()))
                delay = min(delay * 2, RETRY_MAX)
                continue
            delay = RETRY_FIRST
            self._wake.clear()  # a wake of a try that succeeded is spent
            with self._lock:
                # The flush channel first: confirmed before any key's channel is.
                sub.post("SUBSCRIBE", flush_channel())
                for channel in self._confirmed:
                    sub.post(self._subscribe, channel)
                self._sub = sub
            if self._connector.sentinel:
                spawn("redis-lock-follow", self._follow, sub)
            try:
                while True:
                    try:
                        reply = await sub.read()
                    except ResponseError as e:
                        # A refusal, or e.g. MOVED for a channel whose slot this node left.
                        self._refused(sub.answered(), e)
                        continue
                    if reply is CLOSED:
                        return
                    self._handle(sub, reply)
            except IO_ERRORS:
                pass  # connect again, subscribe again
            finally:
                with self._lock:
                    self._sub = None
                    # The channels are no longer subscribed: a watcher of one of them (another
                    # reader of a key, a permit) waits for the next connection's confirmation,
                    # not for one that the closed connection got.
                    for channel in self._confirmed:
                        self._confirmed[channel] = _Confirmation()
                    self._flush = _Confirmation()
                await sub.close()

    async def _follow(self, sub: Subscriber) -> None:
        """Under Sentinel: while ``sub`` is the listener's connection, leaves it as soon as the
        master the Sentinels name is another server (a failover the connection did not see
        break: a paused master, a demoted one that kept its clients); the listener connects
        again, to the new master."""
        while not self._closed and self._sub is sub:
            await sleep(FOLLOW_PERIOD)
            master = await self._connector.current_master()
            if self._sub is sub and master is not None and sub.address not in (None, master):
                await sub.kick()
                return

    def _watchers(self, channel: Optional[bytes]) -> list[Watcher]:
        """The watchers of ``channel`` (None: every watcher, each once)."""
        with self._lock:
            if channel is not None:
                refs = list(self._watched.get(channel, []))
            else:
                refs = [r for entry in self._watched.values() for r in entry]
        found = {id(w): w for r in refs if (w := r()) is not None}
        return list(found.values())

    def _refused(self, sent: Optional[tuple[str, bytes]], e: ResponseError) -> None:
        """The error reply to ``sent``: a refusal of the ACL is handed to the watchers waiting
        for that subscription, and the channel forgotten (the next watcher asks again)."""
        if sent is None:
            return
        op, channel = sent
        refusal = server_error(e, op)
        if not isinstance(refusal, NoPermission) or op not in ("SUBSCRIBE", "SSUBSCRIBE"):
            return
        with self._lock:
            if channel == flush_channel() and op == "SUBSCRIBE":
                confirmation: Optional[_Confirmation] = self._flush
            else:
                confirmation = self._confirmed.pop(channel, None)
        if confirmation is not None:
            confirmation.refused = NoPermission(refusal.line, op, channel)
            confirmation.done.set()

    def _handle(self, sub: Subscriber, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel, payload = reply[0], reply[1], reply[2]
        ours = False
        if kind in (b"subscribe", b"ssubscribe", b"unsubscribe", b"sunsubscribe"):
            ours = sub.answered(kind, channel) is not None
        if kind in (b"subscribe", b"ssubscribe"):
            with self._lock:
                if channel == flush_channel() and kind == b"subscribe":
                    confirmation: Optional[_Confirmation] = self._flush
                else:
                    confirmation = self._confirmed.get(channel)
            if confirmation is not None:
                confirmation.done.set()
        elif kind == b"sunsubscribe" and not ours:
            with self._lock:
                dropped = channel in self._confirmed  # not ours: the slot left this node
            if dropped:
                self._on_slot_left(self, self._watchers(channel))
        elif kind in (b"message", b"smessage") and isinstance(payload, bytes):
            if channel == flush_channel():
                flushed = parse_flush(payload)
                if flushed is not None and flushed.covers(self.db):
                    for watcher in self._watchers(None):
                        watcher.signal(flushed)
                return
            message = parse_lost(payload)
            if message is not None:
                for watcher in self._watchers(channel):
                    watcher.signal(message)

    def after_fork(self) -> None:
        """In a forked child: the listener does not exist here; start afresh on demand."""
        self._reset()
