"""The blocking (threaded) library: LockClient, Lock, LockGuard, MultiLock, MultiLockGuard,
Election, Leadership, Observer."""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
import weakref
from types import TracebackType
from typing import Any, Generic, Optional, Sequence, TypeVar, Union, cast

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._common import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_LEASE,
    RETRIES,
    WAIT_MARGIN,
    Deadline,
    HoldStatus,
    Key,
    KeySet,
    Kind,
    Leader,
    LeaderFeed,
    LockConnectionError,
    LockError,
    LockServerError,
    LockTimeout,
    LostCallback,
    LostReason,
    LostSignal,
    NotHeld,
    Release,
    Renewal,
    UnexpectedReply,
    campaign_args,
    flush_channel,
    flush_covers,
    is_final,
    leader_channel,
    lost_signal_channel,
    multi_keys,
    new_client_id,
    parse_flush,
    parse_leader,
    proclaimed,
    shows_hold,
    to_bytes,
)
from ._connect import RawConnection, Redirected, own_kwargs, server_error

log = logging.getLogger("redis_lock_client")

_IO_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)

# Everything that must be disarmed in a forked child (see _after_fork_in_child).
_forkable: "weakref.WeakSet[Any]" = weakref.WeakSet()


class _Connector:
    """Makes the library's connections (see _connect.py) and runs one command on one."""

    def __init__(self, cls: type[AbstractConnection], kwargs: dict[str, Any], timeout: float):
        self.cls = cls
        self.kwargs = own_kwargs(kwargs, timeout)
        self.timeout = timeout
        self.pool = ConnectionPool(connection_class=cls, **self.kwargs)

    def new(self) -> RawConnection:
        conn = cast(RawConnection, self.cls(**self.kwargs))
        conn.connect()
        return conn

    @staticmethod
    def call(conn: RawConnection, args: list[Any], timeout: Optional[float]) -> Any:
        """One command; a broken or timed-out connection is closed (no stale reply is read later)."""
        try:
            conn.send_command(*args, check_health=False)
            return conn.read_response(timeout=timeout)
        except ResponseError as e:
            raise server_error(e) from None
        except _IO_ERRORS as e:
            conn.disconnect()
            raise LockConnectionError(f"{args[0]}: {e}") from e

    def query(self, args: list[Any]) -> Any:
        """One command on a pooled connection (acquire without WAIT, renew, release)."""
        try:
            pooled = self.pool.get_connection()
        except _IO_ERRORS as e:
            raise LockConnectionError(f"connect: {e}") from e
        try:
            return self.call(cast(RawConnection, pooled), args, self.timeout)
        finally:
            self.pool.release(pooled)


class _OwnConnection:
    """The connection an EPHEMERAL hold is bound to: never replaced, never reconnected. Any error
    on it closes it for good (the server then ends the hold, if it has not already)."""

    def __init__(self, conn: RawConnection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.broken = False

    def call(self, args: list[Any], timeout: Optional[float]) -> Any:
        with self.lock:
            if self.broken:
                raise LockConnectionError("the EPHEMERAL hold's connection is closed")
            try:
                return _Connector.call(self.conn, args, timeout)
            except LockConnectionError:
                self.broken = True
                raise

    def alive(self) -> bool:
        """False once the server closed it (nothing else may arrive on an idle connection)."""
        if not self.lock.acquire(blocking=False):
            return True  # in use: the command's own outcome will tell
        try:
            if self.broken:
                return False
            if self.conn.can_read(timeout=0):
                self.broken = True
        except _IO_ERRORS:
            self.broken = True
        finally:
            self.lock.release()
        return not self.broken

    def close(self) -> None:
        with self.lock:
            self.broken = True
            self.conn.disconnect()

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self.broken = True  # the parent's socket: never used, never shut down here


class _Hold:
    """One hold (of one key, or of several taken together): what every guard of it, its
    watchdog thread and the signal listener share."""

    def __init__(
        self,
        *,
        client: LockClient,
        keys: KeySet,
        owner: bytes,
        tokens: tuple[int, ...],
        lease: float,
        renewal: Renewal,
        own: Optional[_OwnConnection],
        sent: float,
        on_lost: Optional[LostCallback],
    ) -> None:
        self.client = client
        self.keys = keys
        self.key = keys.route
        self.owner = owner
        self.tokens = tokens
        self.token = tokens[0]
        # Each key's lost-hold channel and this hold's token there.
        self.channels = {lost_signal_channel(k): t for k, t in zip(keys.keys, tokens)}
        self.lease = lease
        self.renewal = renewal
        self.own = own
        self.deadline = Deadline(lease, sent)
        self.lost_event = threading.Event()
        self.stop = threading.Event()
        # Held while a renewal is in flight: a release waits for it, so nothing renews after.
        self.renewing = threading.Lock()
        self.on_lost = on_lost
        self.status = HoldStatus(self._lost)
        self.pid = os.getpid()
        # The signal listener of the keys' node (standalone: the client's one), set by start().
        self.hub: Optional[_SignalHub] = None
        self.thread = threading.Thread(
            target=_keep, args=(self,), name=f"redis-lock-watchdog:{self.token}", daemon=True
        )
        _forkable.add(self)

    def start(self) -> None:
        self.thread.start()
        self.hub = self.client._node_for(self.key).signals
        if self.hub is not None:
            self.hub.watch(self)

    def lose(self, reason: LostReason) -> None:
        self.status.mark_lost(reason)

    def _lost(self, reason: LostReason) -> None:
        self.stop.set()
        self.lost_event.set()
        if self.hub is not None:
            self.hub.unwatch(self)
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:  # noqa: BLE001 - a callback's failure must not stop the library
                log.exception("the lost callback of lock %r raised", self.keys.keys)

    def send(self, args: list[Any]) -> Any:
        if self.own is not None:
            return self.own.call(args, self.client.command_timeout)
        return self.client._query(self.key, args)

    def end(self) -> None:
        """Released: stop the watchdog and wait out a renewal in flight."""
        self.stop.set()
        with self.renewing:
            pass
        if self.hub is not None:
            self.hub.unwatch(self)

    def after_fork(self) -> None:
        """In a forked child: the hold is the parent's. Mark it lost without a callback, renew
        nothing (the watchdog thread does not exist here), release nothing."""
        self.renewing = threading.Lock()
        self.status.after_fork()
        self.status.mark_lost(LostReason.FORKED, notify=False)
        # New events: a parent thread may have held an old one's internal lock at the fork.
        self.stop = threading.Event()
        self.stop.set()
        self.lost_event = threading.Event()
        self.lost_event.set()
        if self.own is not None:
            self.own.after_fork()


def _keep(hold: _Hold) -> None:
    """The watchdog thread: renews at lease/3 (or waits out a fixed lease)."""
    try:
        if hold.renewal is Renewal.FIXED:
            while not hold.stop.wait(max(hold.deadline.left(), 0.0)):
                if hold.deadline.left() <= 0:
                    hold.lose(LostReason.LEASE_ENDED)
                    return
            return
        _watchdog(hold)
    finally:
        if hold.own is not None and hold.status.reason is not None:
            hold.own.close()


def _sleep(hold: _Hold, until: float) -> bool:
    """Waits until `until`; True if the hold was stopped. An EPHEMERAL hold's connection is
    looked at every 100 ms meanwhile, so that its close is seen at once."""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return hold.stop.is_set()
        if hold.own is None:
            return hold.stop.wait(left)
        if hold.stop.wait(min(left, 0.1)):
            return True
        if not hold.own.alive():
            hold.lose(LostReason.CONNECTION_CLOSED)
            return True


def _watchdog(hold: _Hold) -> None:
    interval = max(hold.lease / 3, 0.001)
    retry = min(interval, 0.1)
    renew = hold.keys.renew(hold.owner, hold.lease)
    next_at = time.monotonic() + interval
    while True:
        if _sleep(hold, min(next_at, hold.deadline.at)):
            return
        if hold.deadline.left() <= 0:
            hold.lose(LostReason.UNREACHABLE)
            return
        with hold.renewing:
            if hold.stop.is_set():
                return
            sent = time.monotonic()
            try:
                reply = hold.send(renew)
            except LockServerError as e:
                if is_final(str(e)):
                    hold.lose(LostReason.HOLD_GONE)
                    return
                next_at = time.monotonic() + retry
                continue
            except LockConnectionError:
                if hold.own is not None:
                    hold.lose(LostReason.CONNECTION_CLOSED)
                    return
                next_at = time.monotonic() + retry
                continue
        renewed = hold.keys.renewed(reply)
        if renewed:
            hold.deadline.extend(sent)
            next_at = sent + interval
        elif renewed is False:  # one key is enough: the hold is all its keys or nothing
            hold.lose(LostReason.HOLD_GONE)
            return
        else:
            next_at = time.monotonic() + retry


class _SignalHub:
    """One pub/sub connection (per node in a cluster) for the lost-hold signal, read by one thread.

    Holds are watched by channel (one per key; a multi-key hold on each of its keys' channels); a
    message marks a hold lost only if its owner and its token on that key are the hold's. In a
    cluster the channels are shard channels (``SSUBSCRIBE`` on the key's node), as the server
    sends them with ``SPUBLISH``. The connection also listens to
    the flush channel (classic ``SUBSCRIBE``; a cluster ``PUBLISH`` reaches every node): on
    ``flushed <db>`` every hold watched here is checked at once with ``LOCK.INFO`` and reported
    ``FLUSHED`` if the server no longer shows it. Pub/sub is at-most-once: a message sent while
    the connection is down is gone, and the watchdog stays the backstop.
    """

    def __init__(self, client: LockClient, connector: _Connector, sharded: bool) -> None:
        self._client = client
        self._connector = connector
        self._subscribe = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        self._unsubscribe = "SUNSUBSCRIBE" if sharded else "UNSUBSCRIBE"
        self._db = int(connector.kwargs.get("db", 0) or 0)
        self._reset()
        _forkable.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[bytes, list[weakref.ref[_Hold]]] = {}
        self._confirmed: dict[bytes, threading.Event] = {}
        self._pending: list[tuple[str, bytes]] = []
        self._thread: Optional[threading.Thread] = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = False

    def watch(self, hold: _Hold) -> None:
        """Subscribes to the hold's channels; returns once the server confirmed them (or after
        the command timeout: the watchdog still covers the hold)."""
        events: list[threading.Event] = []
        with self._lock:
            for channel in hold.channels:
                entry = self._watched.setdefault(channel, [])
                entry[:] = [r for r in entry if r() is not None]
                entry.append(weakref.ref(hold))
                event = self._confirmed.get(channel)
                if event is None:
                    event = self._confirmed[channel] = threading.Event()
                    self._pending.append((self._subscribe, channel))
                events.append(event)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redis-lock-signal", daemon=True
                )
                self._thread.start()
        self._wake()
        until = time.monotonic() + self._connector.timeout
        for event in events:
            event.wait(max(until - time.monotonic(), 0.0))

    def unwatch(self, hold: _Hold) -> None:
        with self._lock:
            for channel in hold.channels:
                entry = self._watched.get(channel)
                if entry is None:
                    continue
                entry[:] = [r for r in entry if r() not in (None, hold)]
                if entry:
                    continue
                del self._watched[channel]
                self._confirmed.pop(channel, None)
                self._pending.append((self._unsubscribe, channel))
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _run(self) -> None:
        conn: Optional[RawConnection] = None
        delay = 0.05
        while not self._closed:
            if conn is None:
                try:
                    conn = self._connector.new()
                except _IO_ERRORS:
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                delay = 0.05
                with self._lock:
                    # The flush channel first: confirmed before any key's channel is.
                    self._pending = [("SUBSCRIBE", flush_channel())]
                    self._pending += [(self._subscribe, c) for c in self._confirmed]
            with self._lock:
                ops, self._pending = self._pending, []
            try:
                for op, channel in ops:
                    conn.send_command(op, channel, check_health=False)
                while conn.can_read(timeout=0):
                    try:
                        self._handle(conn.read_response())
                    except ResponseError:
                        pass  # e.g. MOVED for a key whose channel is in another slot
                sock = getattr(conn, "_sock", None)
                if sock is None:
                    raise RedisConnectionError("the pub/sub connection closed")
                ready, _, _ = select.select([sock, self._wake_r], [], [], 5.0)
                if self._wake_r in ready:
                    self._wake_r.recv(4096)
            except _IO_ERRORS:
                conn.disconnect()
                conn = None
        if conn is not None:
            conn.disconnect()

    def _handle(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel, payload = reply[0], reply[1], reply[2]
        if kind in (b"subscribe", b"ssubscribe"):
            with self._lock:
                event = self._confirmed.get(channel)
            if event is not None:
                event.set()
        elif kind in (b"message", b"smessage") and isinstance(payload, bytes):
            if channel == flush_channel():
                db = parse_flush(payload)
                if db is not None and flush_covers(db, self._db):
                    self._verify_all()
                return
            signal = LostSignal.parse(payload)
            if signal is None:
                return
            with self._lock:
                refs = list(self._watched.get(channel, []))
            for ref in refs:
                hold = ref()
                if (
                    hold is not None
                    and hold.owner == signal.owner
                    and hold.channels.get(channel) == signal.token
                ):
                    hold.lose(signal.reason)

    def _verify_all(self) -> None:
        """After a flush: every hold watched here is checked, on a thread of its own (the
        listener keeps reading), with LOCK.INFO, which changes nothing."""
        with self._lock:
            found = [h for refs in self._watched.values() for r in refs if (h := r()) is not None]
        holds = list({id(h): h for h in found}.values())  # a multi-key hold once
        if holds:
            threading.Thread(
                target=self._client._verify, args=(holds,), name="redis-lock-flush", daemon=True
            ).start()

    def after_fork(self) -> None:
        """In a forked child: the listener thread does not exist here; start afresh on demand."""
        self._reset()


class _Node:
    """One server (a cluster: one master): its connections and its signal listener."""

    def __init__(self, client: LockClient, connector: _Connector, sharded: bool) -> None:
        self.commands = connector
        self.signals = _SignalHub(client, connector, sharded) if client._lost_signal else None

    def close(self) -> None:
        if self.signals is not None:
            self.signals.close()
        self.commands.pool.disconnect()


class LockClient:
    """Makes lock handles on one server or one Redis Cluster, with the library's own
    connections to it.

    ``LockClient(redis.Redis(...))``, ``LockClient(redis.cluster.RedisCluster(...))``,
    ``LockClient.from_url("redis://...")`` or ``LockClient(host=..., port=...)``: the address,
    credentials and TLS are taken from what is given; the library's connections use their own
    read timeout (``command_timeout``) and no redis-py retries. Connections, per server (in a
    cluster: per master, each command going to the master that serves its key, a MOVED reply
    refreshing the slot map): a pool for ordinary commands (acquire without waiting, renewals,
    releases), a fresh connection for each acquire that waits, one connection owned by each
    EPHEMERAL hold, and (``lost_signal=True``, the default) one pub/sub connection read by one
    thread for the server's lost-hold signal (``SSUBSCRIBE`` in a cluster) and flush message.

    Each client has a random id; each handle it makes is its own owner ``<client id>:<n>``.
    """

    def __init__(
        self,
        redis_client: Optional[Union[redis.Redis, ConnectionPool, RedisCluster]] = None,
        *,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        lost_signal: bool = True,
        **connection_kwargs: Any,
    ) -> None:
        if command_timeout <= 0:
            raise ValueError("command_timeout must be positive")
        self.command_timeout = command_timeout
        self._lost_signal = lost_signal
        self._extra = connection_kwargs
        self._cluster: Optional[RedisCluster] = None
        self._nodes: dict[str, _Node] = {}
        self._nodes_lock = threading.Lock()
        self._single: Optional[_Node] = None
        if isinstance(redis_client, RedisCluster):
            self._cluster = redis_client
        else:
            if redis_client is not None:
                pool = (
                    redis_client
                    if isinstance(redis_client, ConnectionPool)
                    else redis_client.connection_pool
                )
                cls: type[AbstractConnection] = pool.connection_class
                kwargs = {**pool.connection_kwargs, **connection_kwargs}
            else:
                cls = redis.Connection
                kwargs = connection_kwargs
            self._single = _Node(self, _Connector(cls, kwargs, command_timeout), sharded=False)
        self.id = new_client_id()
        self._pid = os.getpid()
        self._next = 0
        self._next_lock = threading.Lock()
        _forkable.add(self)

    def after_fork(self) -> None:
        """In a forked child: a new id, so that the child's owners are not the parent's."""
        self._next_lock = threading.Lock()
        self._nodes_lock = threading.Lock()
        self.id = new_client_id()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> LockClient:
        """A client on ``url`` (``redis://``, ``rediss://``, ``unix://``)."""
        command_timeout = kwargs.pop("command_timeout", DEFAULT_COMMAND_TIMEOUT)
        lost_signal = kwargs.pop("lost_signal", True)
        return cls(
            ConnectionPool.from_url(url, **kwargs),
            command_timeout=command_timeout,
            lost_signal=lost_signal,
        )

    def _node_for(self, key: bytes) -> _Node:
        """The server that serves ``key`` (standalone: the one server)."""
        if self._single is not None:
            return self._single
        cluster = cast(RedisCluster, self._cluster)
        try:
            node = cluster.nodes_manager.get_node_from_slot(key_slot(key))
        except redis.RedisError as e:
            raise LockConnectionError(f"no node serves {key!r}: {e}") from e
        with self._nodes_lock:
            known = self._nodes.get(node.name)
            if known is None:
                pool = node.redis_connection.connection_pool
                kwargs = {**pool.connection_kwargs, **self._extra}
                connector = _Connector(pool.connection_class, kwargs, self.command_timeout)
                known = self._nodes[node.name] = _Node(self, connector, sharded=True)
            return known

    def _refresh(self) -> None:
        """A MOVED/ASK reply: the slot map is stale (a resharding, a failover); load it again."""
        if self._cluster is None:
            return
        try:
            self._cluster.nodes_manager.initialize()
        except redis.RedisError as e:
            raise LockConnectionError(f"cluster slot map: {e}") from e

    def _query(self, key: bytes, args: list[Any]) -> Any:
        """One command on a pooled connection to the key's server, sent again (up to twice)
        to the right node after a MOVED/ASK."""
        attempt = 0
        while True:
            try:
                return self._node_for(key).commands.query(args)
            except Redirected:
                if self._cluster is None or attempt >= RETRIES:
                    raise
                attempt += 1
                self._refresh()

    def _verify(self, holds: list[_Hold]) -> None:
        """After a flush message: each hold still active is looked up with LOCK.INFO (a read
        that changes nothing) on each of its keys, and reported FLUSHED unless the server still
        shows its owner with its token on every one. A connection error leaves it to the
        watchdog."""
        for hold in holds:
            for key, token in zip(hold.keys.keys, hold.tokens):
                if not hold.status.is_active():
                    break
                try:
                    reply = self._query(hold.key, ["LOCK.INFO", key])
                except LockServerError as e:
                    if is_final(str(e)):
                        hold.lose(LostReason.FLUSHED)
                    break
                except LockError:
                    break
                if not shows_hold(reply, hold.owner, token):
                    hold.lose(LostReason.FLUSHED)

    def _all_nodes(self) -> list[_Node]:
        if self._single is not None:
            return [self._single]
        with self._nodes_lock:
            return list(self._nodes.values())

    def close(self) -> None:
        """Stops the signal listeners and closes pooled connections. Holds keep their own."""
        for node in self._all_nodes():
            node.close()

    def __enter__(self) -> LockClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _owner(self) -> bytes:
        if self._pid != os.getpid():
            self.after_fork()
            self._pid = os.getpid()
        with self._next_lock:
            self._next += 1
            return f"{self.id}:{self._next}".encode()

    def lock(self, key: Key, **options: Any) -> Lock:
        """A handle on the exclusive lock of ``key`` (also the write side of its read-write
        lock). Options: see :class:`Lock`."""
        return Lock(self, to_bytes(key), Kind.EXCLUSIVE, 0, **options)

    def read_lock(self, key: Key, **options: Any) -> Lock:
        """A handle on a shared (read) hold of ``key``."""
        return Lock(self, to_bytes(key), Kind.SHARED, 0, **options)

    def semaphore(self, key: Key, limit: int, **options: Any) -> Lock:
        """A handle on one permit of the counting semaphore ``key`` with ``limit`` permits."""
        if not 1 <= limit <= 10000:
            raise ValueError("limit must be between 1 and 10000")
        return Lock(self, to_bytes(key), Kind.PERMIT, limit, **options)

    def multi_lock(self, keys: Sequence[Key], *, shared: bool = False, **options: Any) -> MultiLock:
        """A handle on several keys held together, all or nothing (``LOCK.MACQUIRE``): exclusive
        holds, or shared (read) holds with ``shared=True``. 1 to 64 distinct keys; in a cluster
        all in one slot (use a hash tag: ``{order:42}:a``, ``{order:42}:b``). Options: see
        :class:`Lock`."""
        checked = KeySet(multi_keys(keys), multi=True)
        kind = Kind.SHARED if shared else Kind.EXCLUSIVE
        return MultiLock(self, tuple(keys), checked, kind, **options)

    def election(
        self,
        key: Key,
        candidate: Optional[Key] = None,
        *,
        lease: float = DEFAULT_LEASE,
        renewal: Renewal = Renewal.WATCHDOG,
        ephemeral: bool = True,
        on_lost: Optional[LostCallback] = None,
    ) -> Election:
        """A handle on the election ``key`` (``LOCK.CAMPAIGN``/``PROCLAIM``/``LEADER``), as
        ``candidate`` (default: a name of its own, ``<client id>:<n>``). See :class:`Election`."""
        return Election(
            self,
            to_bytes(key),
            None if candidate is None else to_bytes(candidate),
            lease=lease,
            renewal=renewal,
            ephemeral=ephemeral,
            on_lost=on_lost,
        )


_G = TypeVar("_G", bound="_Guard")


class _Handle(Generic[_G]):
    """What a handle on one key and a handle on several share: its owner, its options, its
    acquire (waiting, retries, EPHEMERAL), its re-entries. The commands come from ``keys``."""

    def __init__(
        self,
        client: LockClient,
        keys: KeySet,
        kind: Kind,
        limit: int,
        *,
        lease: float = DEFAULT_LEASE,
        renewal: Renewal = Renewal.WATCHDOG,
        wait_timeout: Optional[float] = None,
        ephemeral: bool = False,
        on_lost: Optional[LostCallback] = None,
        owner: Optional[bytes] = None,
    ) -> None:
        if lease < 0.001:
            raise ValueError("the lease must be at least 1 ms")
        if wait_timeout is not None and wait_timeout < 0:
            raise ValueError("wait_timeout must not be negative")
        self.client = client
        self.keys = keys
        self.kind = kind
        self.limit = limit
        self.lease = lease
        self.renewal = renewal
        self.wait_timeout = wait_timeout
        self.ephemeral = ephemeral
        self.on_lost = on_lost
        self._named = owner
        self.owner = client._owner() if owner is None else owner
        # Serialises this handle's acquires (and a multi-key hold's last release); reentrant, so
        # that an on_lost callback run inside an acquire may release.
        self._gate = threading.RLock()
        self._slot = threading.Lock()
        self._active: Optional[_Hold] = None
        self._guards = 0
        self._local = threading.local()
        _forkable.add(self)

    #: Whether acquiring again while holding counts one more guard (locks), or returns the one
    #: guard of the hold (an election's leadership, never counted, as LOCK.CAMPAIGN).
    _counts_reentry = True

    def _guard(self, hold: _Hold) -> _G:
        raise NotImplementedError

    def after_fork(self) -> None:
        """In a forked child: the handle becomes a new owner holding nothing, so that nothing it
        sends (a re-entry, a release) can touch the parent's holds."""
        self._gate = threading.RLock()
        self._slot = threading.Lock()
        self._active, self._guards = None, 0
        self._local = threading.local()
        # A name given by the application stays (it is the application's to keep unique).
        self.owner = self.client._owner() if self._named is None else self._named

    def try_acquire(self) -> Optional[_G]:
        """Takes the key(s) if free (or re-enters this handle's hold), without waiting; None
        when another owner holds one or others wait for one."""
        return self._acquire(False, self.wait_timeout)

    def acquire(self) -> _G:
        """Takes the key(s), waiting in the server as long as ``wait_timeout`` allows (on a
        connection of its own); raises ``LockTimeout`` when it passes."""
        guard = self._acquire(self.wait_timeout != 0, self.wait_timeout)
        if guard is None:
            raise LockTimeout(self.wait_timeout or 0.0)
        return guard

    def __enter__(self) -> _G:
        guard = self.acquire()
        stack: list[_G] = self._local.__dict__.setdefault("stack", [])
        stack.append(guard)
        return guard

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        stack: list[_G] = self._local.__dict__.setdefault("stack", [])
        stack.pop().__exit__(exc_type, exc, tb)

    def _args(self, waits: bool, wait: Optional[float], value: Optional[bytes]) -> list[Any]:
        """The acquire command; ``value`` is a campaign's (see ``_Candidate``)."""
        return self.keys.acquire(
            self.owner, self.lease, self.kind, self.limit, self.ephemeral, wait, waits
        )

    def _acquire(
        self, waits: bool, wait_timeout: Optional[float], value: Optional[bytes] = None
    ) -> Optional[_G]:
        """One acquire (or campaign): ``waits`` False is one attempt; else it waits up to
        ``wait_timeout`` (None: until granted)."""
        with self._gate:
            with self._slot:
                current = self._active
            if current is not None and not current.status.is_active():
                current = None
            sent = time.monotonic()
            own: Optional[_OwnConnection] = None
            if self.ephemeral:
                reply, own = self._send_ephemeral(current, waits, wait_timeout, value)
            else:
                reply = self._send_with_retries(waits, wait_timeout, value)
            try:
                tokens = self.keys.tokens(reply)
            except UnexpectedReply:
                if own is not None and (current is None or own is not current.own):
                    own.close()
                raise
            return self._settle(current, tokens, sent, own)

    def _send_with_retries(
        self, waits: bool, wait_timeout: Optional[float], value: Optional[bytes]
    ) -> Any:
        until = None if wait_timeout is None else time.monotonic() + wait_timeout
        attempt = 0
        while True:
            this_waits, wait = waits, wait_timeout
            if waits and until is not None:
                wait = until - time.monotonic()
                if wait < 0.001:
                    this_waits = False  # a retry with no wait left: one last attempt
            try:
                if this_waits:
                    return self._send_waiting(self._args(True, wait, value), wait)
                return self.client._query(self.keys.route, self._args(False, None, value))
            except LockConnectionError:
                if attempt >= RETRIES:
                    raise
                attempt += 1
            except Redirected:
                if attempt >= RETRIES:
                    raise
                attempt += 1
                self.client._refresh()

    def _send_waiting(self, args: list[Any], wait: Optional[float]) -> Any:
        connector = self.client._node_for(self.keys.route).commands
        try:
            conn = connector.new()
        except _IO_ERRORS as e:
            raise LockConnectionError(f"connect: {e}") from e
        try:
            return connector.call(conn, args, None if wait is None else wait + WAIT_MARGIN)
        finally:
            conn.disconnect()

    def _send_ephemeral(
        self,
        current: Optional[_Hold],
        waits: bool,
        wait_timeout: Optional[float],
        value: Optional[bytes],
    ) -> tuple[Any, Optional[_OwnConnection]]:
        timeout: Optional[float] = self.client.command_timeout
        if waits:
            timeout = None if wait_timeout is None else wait_timeout + WAIT_MARGIN
        args = self._args(waits, wait_timeout, value)
        if current is not None and current.own is not None:
            try:
                return current.own.call(args, timeout), current.own
            except LockConnectionError:
                current.lose(LostReason.CONNECTION_CLOSED)
                raise
        attempt = 0
        while True:
            try:
                own = _OwnConnection(self.client._node_for(self.keys.route).commands.new())
            except _IO_ERRORS as e:
                raise LockConnectionError(f"connect: {e}") from e
            try:
                return own.call(args, timeout), own
            except Redirected:
                own.close()
                if attempt >= RETRIES:
                    raise
                attempt += 1
                self.client._refresh()
            except LockError:
                own.close()
                raise

    def _settle(
        self,
        current: Optional[_Hold],
        tokens: Optional[tuple[int, ...]],
        sent: float,
        own: Optional[_OwnConnection],
    ) -> Optional[_G]:
        if tokens is not None and current is not None and current.tokens == tokens:
            with self._slot:
                if self._active is current:
                    if self._counts_reentry:
                        self._guards += 1
                    current.deadline.extend(sent)
                    return self._guard(current)
        # Whatever the handle held is gone: the server answered other tokens, or nil.
        if current is not None:
            current.lose(LostReason.HOLD_GONE)
        with self._slot:
            old, self._active, self._guards = self._active, None, 0
        if old is not None:
            old.stop.set()
        if tokens is None:
            if own is not None:
                own.close()
            return None
        hold = _Hold(
            client=self.client,
            keys=self.keys,
            owner=self.owner,
            tokens=tokens,
            lease=self.lease,
            renewal=self.renewal,
            own=own,
            sent=sent,
            on_lost=self.on_lost,
        )
        with self._slot:
            self._active, self._guards = hold, 1
        hold.start()
        return self._guard(hold)

    def _end_guard(self, hold: _Hold) -> Optional[bool]:
        """One guard of `hold` ends: True if it was the last, False if others remain, None if
        the hold is no longer the handle's."""
        with self._slot:
            if self._active is not hold:
                return None
            self._guards -= 1
            if self._guards > 0:
                return False
            self._active = None
            return True


class Lock(_Handle["LockGuard"]):
    """A handle: one owner on one key, with its options.

    - ``lease`` (seconds, default 30): renewed every ``lease / 3`` by a watchdog thread.
    - ``renewal``: ``Renewal.WATCHDOG`` (default) or ``Renewal.FIXED`` (nothing renews; the hold
      is reported lost, ``LEASE_ENDED``, at its lease end).
    - ``wait_timeout`` (seconds, default None = until granted): how long ``acquire()`` waits in
      the server (FIFO, no polling) before ``LockTimeout``.
    - ``ephemeral``: the hold is bound to a connection the guard owns; its close (crash,
      ``CLIENT KILL``) ends the hold in the server, and any error on it reports the hold lost.
    - ``on_lost``: called once with the reason when a hold of this handle is lost, on the
      library's thread that saw it (keep it short).

    Re-entry is per handle: acquiring again through a handle that holds the key succeeds at once
    with the same token; the hold ends with its last guard. Two handles are two owners.
    """

    def __init__(
        self, client: LockClient, key: bytes, kind: Kind, limit: int, **options: Any
    ) -> None:
        super().__init__(client, KeySet((key,), multi=False), kind, limit, **options)
        self.key = key

    def _guard(self, hold: _Hold) -> LockGuard:
        return LockGuard(self, hold)


class MultiLock(_Handle["MultiLockGuard"]):
    """A handle: one owner on several keys held together (``client.multi_lock(keys)``), with
    the options of :class:`Lock`.

    ``acquire()`` takes every key at one instant or none (``LOCK.MACQUIRE``); a wait stands in
    every key's FIFO queue at once and is granted when it heads them all, so two handles taking
    the same keys in opposite orders cannot deadlock. The hold is one hold: one watchdog renews
    every key with one ``LOCK.MRENEW``, it is lost when any key's hold is lost, and its release
    (``LOCK.MRELEASE``) frees every key. Re-entry is per handle, as for :class:`Lock`.
    """

    def __init__(
        self,
        client: LockClient,
        given: tuple[Key, ...],
        keys: KeySet,
        kind: Kind,
        **options: Any,
    ) -> None:
        super().__init__(client, keys, kind, 0, **options)
        self.given = given

    def _guard(self, hold: _Hold) -> MultiLockGuard:
        return MultiLockGuard(self, hold)


def _abandon(handle: _Handle[Any], hold: _Hold, pid: int) -> None:
    """A guard was garbage-collected unreleased: release it in the background (never in a forked
    child, whose holds are the parent's)."""
    if os.getpid() != pid:
        return
    if handle._end_guard(hold) and hold.status.mark_released() is None:
        threading.Thread(target=_release_quietly, args=(hold,), daemon=True).start()


def _release_quietly(hold: _Hold) -> None:
    hold.end()
    try:
        hold.send(hold.keys.release(hold.owner))
    except Exception:  # noqa: BLE001 - best effort (the client may be closing): the lease ends it
        log.debug("releasing an abandoned hold of %r failed", hold.keys.keys, exc_info=True)
    finally:
        if hold.own is not None:
            hold.own.close()


def _release_rest(hold: _Hold) -> None:
    """A lost multi-key hold: LOCK.MRELEASE for the keys the owner may still hold (it ends the
    owner's holds only, nobody else's). Best effort: a failure leaves them to their lease."""
    try:
        hold.send(hold.keys.release(hold.owner))
    except LockError:
        log.debug("releasing the rest of lost hold %r failed", hold.keys.keys, exc_info=True)
    finally:
        if hold.own is not None:
            hold.own.close()


class _Guard:
    """What the guard of one key and the guard of several share: ``lost``, the release, ``with``."""

    def __init__(self, handle: _Handle[Any], hold: _Hold) -> None:
        self._handle = handle
        self._hold = hold
        self._released = False
        self._finalizer = weakref.finalize(self, _abandon, handle, hold, os.getpid())

    @property
    def owner(self) -> bytes:
        return self._hold.owner

    @property
    def lost(self) -> threading.Event:
        """Set when the hold is lost (never after a release): ``guard.lost.wait(timeout)``."""
        return self._hold.lost_event

    @property
    def lost_reason(self) -> Optional[LostReason]:
        return self._hold.status.reason

    def release(self) -> Release:
        """Releases this guard. The last guard of a hold stops the watchdog, waits out a renewal
        in flight, and sends LOCK.RELEASE (LOCK.MRELEASE for several keys; never retried);
        earlier ones only count down.

        Raises ``NotHeld`` when the hold was lost (with the reason) or the server no longer
        knew it (on any of its keys), ``LockConnectionError`` when the release could not be
        sent or answered (the lease then ends the hold). A multi-key hold lost on some of its
        keys may still hold the others: its last release sends LOCK.MRELEASE all the same
        (frees them at once instead of at their lease end), then raises ``NotHeld``.
        """
        if self._released:
            return Release.ALREADY_RELEASED
        self._released = True
        self._finalizer.detach()
        hold = self._hold
        if hold.pid != os.getpid():
            raise NotHeld(LostReason.FORKED)
        if hold.keys.multi:
            # No acquire of this handle (same owner) may be granted between the count-down and
            # the LOCK.MRELEASE, which would end it.
            with self._handle._gate:
                return self._release(hold)
        return self._release(hold)

    def _release(self, hold: _Hold) -> Release:
        last = self._handle._end_guard(hold)
        if last is None:
            raise NotHeld(hold.status.reason)
        if not last:
            if hold.status.reason is not None:
                raise NotHeld(hold.status.reason)
            return Release.STILL_HELD
        error = hold.status.mark_released()
        hold.end()
        if error is not None:
            if hold.keys.multi:
                _release_rest(hold)
            raise error
        try:
            reply = hold.send(hold.keys.release(hold.owner))
        finally:
            if hold.own is not None:
                hold.own.close()
        if not hold.keys.released(reply):
            raise NotHeld(None)
        return Release.RELEASED

    def __enter__(self: _G) -> _G:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Releases. ``NotHeld`` is raised if the hold was lost during the block, unless the
        block itself raised (its exception is not masked)."""
        try:
            self.release()
        except NotHeld:
            if exc_type is None:
                raise
        except LockError:
            if exc_type is None:
                raise


class LockGuard(_Guard):
    """A hold on a key: its fencing token, its ``lost`` event, its release.

    ``with`` releases it on exit. A guard that is garbage-collected unreleased is released in the
    background; do not rely on that: use ``with`` or ``release()``.
    """

    @property
    def token(self) -> int:
        """The hold's fencing token: pass it with every write you protect, and have the resource
        refuse a token lower than the highest it has seen."""
        return self._hold.token

    @property
    def key(self) -> bytes:
        return self._hold.key

    def __repr__(self) -> str:
        return (
            f"LockGuard(key={self.key!r}, owner={self.owner!r}, token={self.token}, "
            f"lost={self.lost_reason})"
        )


class MultiLockGuard(_Guard):
    """A hold on several keys: a fencing token per key, one ``lost`` event, one release.

    ``with`` releases every key on exit; the rest is as for :class:`LockGuard`.
    """

    @property
    def tokens(self) -> dict[Key, int]:
        """Each key's fencing token, keyed by the keys as given to ``multi_lock`` (str stays
        str), in that order: ``guard.tokens["a"]``. Fence each key's writes with its own."""
        handle = cast(MultiLock, self._handle)
        return dict(zip(handle.given, self._hold.tokens))

    @property
    def keys(self) -> tuple[bytes, ...]:
        return self._hold.keys.keys

    def __repr__(self) -> str:
        return (
            f"MultiLockGuard(keys={self.keys!r}, owner={self.owner!r}, "
            f"tokens={self._hold.tokens}, lost={self.lost_reason})"
        )


class _Candidate(_Handle["Leadership"]):
    """The hold of a campaign: a :class:`Lock` handle whose acquire is ``LOCK.CAMPAIGN`` (same
    watchdog, lost signal, EPHEMERAL connection, waits and retries), and whose re-entry is
    never counted (campaigning again while leading returns the same leadership)."""

    _counts_reentry = False

    def __init__(self, election: Election, **options: Any) -> None:
        keys = KeySet((election.key,), multi=False)
        super().__init__(election.client, keys, Kind.EXCLUSIVE, 0, **options)
        self.election = election
        self._leadership: Optional[Leadership] = None

    def _args(self, waits: bool, wait: Optional[float], value: Optional[bytes]) -> list[Any]:
        return campaign_args(
            self.election.key, self.owner, self.lease, self.ephemeral, wait, waits, value
        )

    def _guard(self, hold: _Hold) -> Leadership:
        current = self._leadership
        if current is None or current._hold is not hold:
            current = self._leadership = Leadership(self, hold)
        return current


class Election:
    """A handle on one election key, for one candidate (``client.election(key, candidate)``):
    campaign for it, read its leader, observe its leaders.

    - ``campaign(value=None, timeout=None)`` waits in the server's FIFO queue until this
      candidate leads and returns its :class:`Leadership` (the epoch, ``lost``, ``proclaim``,
      ``resign``); ``LockTimeout`` when ``timeout`` (seconds; 0 = one attempt) passes first.
      The leadership is a hold like a :class:`Lock`'s: the watchdog renews it every
      ``lease / 3``, and it is reported lost as any hold is.
    - ``ephemeral`` (default True): the leadership is bound to a connection the leadership owns,
      so a crashed or killed process stops leading at once, not at its lease end.
    - ``leader()`` reads who leads now; ``observe()`` follows every change.

    The candidate is its name: two handles (or processes) campaigning under one name are one
    candidate to the server, and both would think they lead. Leave ``candidate`` unset (each
    handle gets a name of its own) or give each process its own.
    """

    def __init__(
        self, client: LockClient, key: bytes, candidate: Optional[bytes], **options: Any
    ) -> None:
        self.client = client
        self.key = key
        self._candidate = _Candidate(self, owner=candidate, **options)

    @property
    def candidate(self) -> bytes:
        """The name this handle campaigns under (``LOCK.LEADER`` shows it while it leads)."""
        return self._candidate.owner

    def campaign(self, value: Optional[Key] = None, timeout: Optional[float] = None) -> Leadership:
        """Blocks until this candidate leads (``LOCK.CAMPAIGN ... WAIT``, on a connection of its
        own) and returns its leadership; with ``value``, proclaims it with the election. Raises
        ``LockTimeout`` when ``timeout`` passes (0: one attempt, no wait). Campaigning again
        while leading returns the same leadership (the epoch is kept; ``value`` is proclaimed).
        """
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must not be negative")
        data = None if value is None else to_bytes(value)
        leadership = self._candidate._acquire(timeout != 0, timeout, data)
        if leadership is None:
            raise LockTimeout(timeout or 0.0)
        return leadership

    def leader(self) -> Optional[Leader]:
        """Who leads now (``LOCK.LEADER``): ``Leader(candidate, epoch, value)``, or None."""
        return parse_leader(self.client._query(self.key, ["LOCK.LEADER", self.key]))

    def observe(self) -> Observer:
        """Follows the key's leaders: an iterator of :class:`Leader`, in order (see
        :class:`Observer`). ``with election.observe() as leaders: for leader in leaders: ...``"""
        return Observer(self.client, self.key)


class Leadership(_Guard):
    """This candidate leads: its ``epoch`` (the fencing token of its hold), ``lost`` (a
    ``threading.Event``, set when it is deposed: lease ended, connection closed, forced out),
    ``proclaim(value)``, ``resign()``. ``with`` resigns on exit."""

    @property
    def epoch(self) -> int:
        """The epoch: a fencing token, above every earlier leader's. Pass it with every write
        the leader makes, and have the resource refuse an epoch below the highest it has seen."""
        return self._hold.token

    @property
    def key(self) -> bytes:
        return self._hold.key

    @property
    def candidate(self) -> bytes:
        return self._hold.owner

    def proclaim(self, value: Key) -> bool:
        """Publishes ``value`` (at most 4096 bytes) for observers (``LOCK.PROCLAIM``): True, or
        False when this leadership is over: resigned, lost, past its local deadline (it is then
        reported lost, ``UNREACHABLE``), or refused by the server because the candidate no
        longer leads in this epoch (reported lost, ``HOLD_GONE``). A deposed leader's
        proclamation is never published."""
        hold = self._hold
        if self._released or not hold.status.is_active():
            return False
        if hold.deadline.left() <= 0:
            hold.lose(LostReason.UNREACHABLE)
            return False
        args = ["LOCK.PROCLAIM", hold.key, hold.owner, hold.token, to_bytes(value)]
        try:
            reply = hold.send(args)
        except LockConnectionError:
            if hold.own is None:
                raise
            hold.lose(LostReason.CONNECTION_CLOSED)  # the server ends the hold with it
            return False
        if proclaimed(reply):
            return True
        hold.lose(LostReason.HOLD_GONE)
        return False

    def resign(self) -> Release:
        """Stops leading (``LOCK.RELEASE``): the next candidate in the queue is elected at once.
        As ``release()``: raises ``NotHeld`` if the leadership was lost before."""
        return self.release()

    def __repr__(self) -> str:
        return (
            f"Leadership(key={self.key!r}, candidate={self.candidate!r}, epoch={self.epoch}, "
            f"lost={self.lost_reason})"
        )


class Observer:
    """The leaders of one election key, in the order they led: an iterator of :class:`Leader`
    (``election.observe()``).

    It subscribes to the key's leader channel on a connection of its own (``SSUBSCRIBE`` on the
    key's master in a cluster), then reads ``LOCK.LEADER`` and yields the current leader, then a
    leader per message: each newly elected candidate (``value`` None), and each value it
    proclaims. It never yields an epoch below the last it yielded, nor the same leader twice in
    a row. When the connection breaks it connects again, subscribes, and reads ``LOCK.LEADER``
    again (pub/sub is at most once: what was published meanwhile is gone, the read tells the
    current leader). The end of a leadership is not announced: the next election is.

    ``next()`` blocks; ``close()`` (from any thread) ends the iteration; ``with`` closes.
    """

    def __init__(self, client: LockClient, key: bytes) -> None:
        self._client = client
        self._key = key
        self._channel = leader_channel(key)
        self._subscribe = "SSUBSCRIBE" if client._cluster is not None else "SUBSCRIBE"
        self._feed = LeaderFeed()
        self._ready: list[Leader] = []
        self._conn: Optional[RawConnection] = None
        self._lock = threading.Lock()
        self._closed = False
        self._reading = False

    def __iter__(self) -> Observer:
        return self

    def __next__(self) -> Leader:
        delay = 0.05
        while True:
            if self._closed:
                self._drop(self._conn)
                raise StopIteration
            if self._ready:
                return self._ready.pop(0)
            conn = self._conn
            if conn is None:
                try:
                    self._connect()
                    delay = 0.05
                except LockError:
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
                continue
            with self._lock:
                if self._closed:
                    continue
                self._reading = True
            try:
                reply = conn.read_response(timeout=None)
            except ResponseError:
                continue
            except _IO_ERRORS:
                self._drop(conn)
                continue
            finally:
                self._reading = False
            self._take(reply)

    def _connect(self) -> None:
        """Subscribes, then reads the leader (in that order: nothing is missed in between)."""
        connector = self._client._node_for(self._key).commands
        try:
            conn = connector.new()
        except _IO_ERRORS as e:
            raise LockConnectionError(f"connect: {e}") from e
        try:
            reply = connector.call(conn, [self._subscribe, self._channel], connector.timeout)
            if not (isinstance(reply, list) and reply[1:2] == [self._channel]):
                raise UnexpectedReply(f"{self._subscribe} answered {reply!r}")
            leader = parse_leader(self._client._query(self._key, ["LOCK.LEADER", self._key]))
        except Redirected:
            conn.disconnect()
            self._client._refresh()
            raise
        except BaseException:
            conn.disconnect()
            raise
        with self._lock:
            if self._closed:
                conn.disconnect()
                return
            self._conn = conn
        self._push(self._feed.read(leader))

    def _take(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel, payload = reply[0], reply[1], reply[2]
        if kind not in (b"message", b"smessage") or channel != self._channel:
            return
        if not isinstance(payload, bytes):
            return
        self._push(self._feed.message(payload))
        if self._feed.stale:
            try:
                leader = parse_leader(self._client._query(self._key, ["LOCK.LEADER", self._key]))
            except LockError:
                return  # the next message or reconnection tells
            self._push(self._feed.read(leader))

    def _push(self, leader: Optional[Leader]) -> None:
        if leader is not None:
            self._ready.append(leader)

    def _drop(self, conn: Optional[RawConnection]) -> None:
        with self._lock:
            if conn is None or self._conn is not conn:
                return
            self._conn = None
        conn.disconnect()

    def close(self) -> None:
        """Ends the iteration; a ``next()`` blocked in another thread returns at once (the
        socket is shut down under it, and that thread closes the connection)."""
        with self._lock:
            self._closed = True
            conn, reading = self._conn, self._reading
        if conn is None:
            return
        if reading:
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        else:
            self._drop(conn)

    def __enter__(self) -> Observer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _after_fork_in_child() -> None:
    for obj in list(_forkable):
        obj.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
