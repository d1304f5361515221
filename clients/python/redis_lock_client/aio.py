"""The asyncio library: AsyncLockClient, AsyncLock, AsyncLockGuard, AsyncMultiLock,
AsyncMultiLockGuard, AsyncElection, AsyncLeadership, AsyncObserver (redis.asyncio).

The same semantics as the sync library, with tasks instead of threads. **The watchdog is a task
on the event loop that acquired the hold: a loop blocked by synchronous code renews nothing.**
When the loop runs again the watchdog first looks at the hold's local deadline (the send time of
the last successful renewal + 90 % of the lease): if it passed, the hold is reported lost
(``LostReason.UNREACHABLE``) without asking the server, since another owner may have been
granted the key meanwhile. Keep blocking work off the loop (``asyncio.to_thread``) or take a
lease longer than the longest block.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import weakref
from types import TracebackType
from typing import Any, Generic, Optional, Protocol, Sequence, TypeVar, Union, cast

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import ConnectionPool
from redis.crc import key_slot
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
from ._connect import Redirected, own_kwargs, server_error

log = logging.getLogger("redis_lock_client")

_IO_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)

_forkable: "weakref.WeakSet[Any]" = weakref.WeakSet()


class _RawConnection(Protocol):
    """The part of redis.asyncio's (untyped) Connection the library uses."""

    async def connect(self) -> None: ...
    async def send_command(self, *args: Any, check_health: bool = True) -> None: ...
    async def read_response(self, disable_decoding: bool = False, timeout: Any = None) -> Any: ...
    async def disconnect(self, nowait: bool = False) -> None: ...


class _Connector:
    def __init__(self, cls: type[Any], kwargs: dict[str, Any], timeout: float) -> None:
        self.cls = cls
        self.kwargs = own_kwargs(kwargs, timeout)
        self.timeout = timeout
        self.pool = ConnectionPool(connection_class=cls, **self.kwargs)

    async def new(self) -> _RawConnection:
        conn = cast(_RawConnection, self.cls(**self.kwargs))
        await conn.connect()
        return conn

    @staticmethod
    async def call(conn: _RawConnection, args: list[Any], timeout: Optional[float]) -> Any:
        try:
            await conn.send_command(*args, check_health=False)
            return await conn.read_response(timeout=math.inf if timeout is None else timeout)
        except ResponseError as e:
            raise server_error(e) from None
        except _IO_ERRORS as e:
            await conn.disconnect(nowait=True)
            raise LockConnectionError(f"{args[0]}: {e}") from e
        except asyncio.CancelledError:
            await conn.disconnect(nowait=True)  # a half-read reply must never be read later
            raise

    async def query(self, args: list[Any]) -> Any:
        try:
            pooled = await self.pool.get_connection()  # type: ignore[no-untyped-call]
        except _IO_ERRORS as e:
            raise LockConnectionError(f"connect: {e}") from e
        try:
            return await self.call(cast(_RawConnection, pooled), args, self.timeout)
        finally:
            await self.pool.release(pooled)


class _OwnConnection:
    """The connection an EPHEMERAL hold is bound to: never replaced; any error closes it."""

    def __init__(self, conn: _RawConnection) -> None:
        self.conn = conn
        self.lock = asyncio.Lock()
        self.broken = False

    async def call(self, args: list[Any], timeout: Optional[float]) -> Any:
        async with self.lock:
            if self.broken:
                raise LockConnectionError("the EPHEMERAL hold's connection is closed")
            try:
                return await _Connector.call(self.conn, args, timeout)
            except (LockConnectionError, asyncio.CancelledError):
                self.broken = True
                raise

    def alive(self) -> bool:
        """False once the server closed it (the stream saw EOF)."""
        reader = getattr(self.conn, "_reader", None)
        if self.broken or reader is None or reader.at_eof():
            self.broken = True
        return not self.broken

    async def close(self) -> None:
        self.broken = True
        await self.conn.disconnect(nowait=True)

    def after_fork(self) -> None:
        self.broken = True


class _Hold:
    def __init__(
        self,
        *,
        client: AsyncLockClient,
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
        self.lost_event = asyncio.Event()
        self.stop = asyncio.Event()
        self.renewing = asyncio.Lock()
        self.on_lost = on_lost
        self.status = HoldStatus(self._lost)
        self.pid = os.getpid()
        self.loop = asyncio.get_running_loop()
        self.task: Optional[asyncio.Task[None]] = None
        self.hub: Optional[_SignalHub] = None
        _forkable.add(self)

    async def start(self) -> None:
        self.task = asyncio.create_task(_keep(self), name=f"redis-lock-watchdog:{self.token}")
        self.hub = (await self.client._node_for(self.key)).signals
        if self.hub is not None:
            await self.hub.watch(self)

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
            except Exception:  # noqa: BLE001
                log.exception("the lost callback of lock %r raised", self.keys.keys)

    async def send(self, args: list[Any]) -> Any:
        if self.own is not None:
            return await self.own.call(args, self.client.command_timeout)
        return await self.client._query(self.key, args)

    async def end(self) -> None:
        self.stop.set()
        async with self.renewing:
            pass
        if self.hub is not None:
            self.hub.unwatch(self)

    def after_fork(self) -> None:
        self.status.after_fork()
        self.status.mark_lost(LostReason.FORKED, notify=False)
        self.lost_event = asyncio.Event()
        self.lost_event.set()
        self.stop = asyncio.Event()
        self.stop.set()
        if self.own is not None:
            self.own.after_fork()


async def _wait_stop(hold: _Hold, seconds: float) -> bool:
    if seconds <= 0:
        return hold.stop.is_set()
    try:
        await asyncio.wait_for(hold.stop.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False


async def _sleep(hold: _Hold, until: float) -> bool:
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return hold.stop.is_set()
        if hold.own is None:
            return await _wait_stop(hold, left)
        if await _wait_stop(hold, min(left, 0.1)):
            return True
        if not hold.own.alive():
            hold.lose(LostReason.CONNECTION_CLOSED)
            return True


async def _keep(hold: _Hold) -> None:
    try:
        if hold.renewal is Renewal.FIXED:
            while not await _wait_stop(hold, hold.deadline.left()):
                if hold.deadline.left() <= 0:
                    hold.lose(LostReason.LEASE_ENDED)
                    return
            return
        await _watchdog(hold)
    finally:
        if hold.own is not None and hold.status.reason is not None:
            await hold.own.close()


async def _watchdog(hold: _Hold) -> None:
    interval = max(hold.lease / 3, 0.001)
    retry = min(interval, 0.1)
    renew = hold.keys.renew(hold.owner, hold.lease)
    next_at = time.monotonic() + interval
    while True:
        if await _sleep(hold, min(next_at, hold.deadline.at)):
            return
        # Also where a loop that was blocked past the deadline lands.
        if hold.deadline.left() <= 0:
            hold.lose(LostReason.UNREACHABLE)
            return
        async with hold.renewing:
            if hold.stop.is_set():
                return
            sent = time.monotonic()
            try:
                reply = await hold.send(renew)
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
    """One pub/sub connection per client (per master in a cluster), read by one task;
    subscriptions are sent by the acquiring task and confirmed to it by the reader. In a cluster
    the key channels are shard channels (``SSUBSCRIBE``). The flush channel (classic
    ``SUBSCRIBE``) is subscribed first on every connection: on ``flushed <db>`` the holds
    watched here are checked with ``LOCK.INFO`` and reported ``FLUSHED`` when gone."""

    def __init__(self, client: AsyncLockClient, connector: _Connector, sharded: bool) -> None:
        self._client = client
        self._connector = connector
        self._subscribe = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        self._unsubscribe = "SUNSUBSCRIBE" if sharded else "UNSUBSCRIBE"
        self._db = int(connector.kwargs.get("db", 0) or 0)
        self._reset()
        _forkable.add(self)

    def _reset(self) -> None:
        self._watched: dict[bytes, list[weakref.ref[_Hold]]] = {}
        self._confirmed: dict[bytes, asyncio.Event] = {}
        self._conn: Optional[_RawConnection] = None
        self._connected: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._verifying: set[asyncio.Task[None]] = set()

    async def watch(self, hold: _Hold) -> None:
        """Subscribes to the hold's channels (a multi-key hold: one per key) and waits for the
        confirmations, up to the command timeout."""
        events: list[asyncio.Event] = []
        for channel in hold.channels:
            entry = self._watched.setdefault(channel, [])
            entry[:] = [r for r in entry if r() is not None]
            entry.append(weakref.ref(hold))
            event = self._confirmed.get(channel)
            if event is None:
                event = self._confirmed[channel] = asyncio.Event()
                if self._task is None:
                    self._connected = asyncio.Event()
                    self._task = asyncio.create_task(self._run(), name="redis-lock-signal")
                elif self._conn is not None:
                    await self._send(self._subscribe, channel)
            events.append(event)
        try:
            await asyncio.wait_for(
                asyncio.gather(*(e.wait() for e in events)), self._connector.timeout
            )
        except asyncio.TimeoutError:
            pass  # the watchdog still covers the hold

    def unwatch(self, hold: _Hold) -> None:
        for channel in hold.channels:
            entry = self._watched.get(channel)
            if entry is None:
                continue
            entry[:] = [r for r in entry if r() not in (None, hold)]
            if entry:
                continue
            del self._watched[channel]
            self._confirmed.pop(channel, None)
            if self._conn is not None:
                asyncio.get_running_loop().create_task(self._send(self._unsubscribe, channel))

    async def _send(self, op: str, channel: bytes) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            await conn.send_command(op, channel, check_health=False)
        except _IO_ERRORS:
            pass  # the reader sees the broken connection, reconnects and subscribes again

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._conn is not None:
            await self._conn.disconnect(nowait=True)
            self._conn = None

    async def _run(self) -> None:
        delay = 0.05
        while True:
            try:
                conn = await self._connector.new()
            except _IO_ERRORS:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.05
            self._conn = conn
            try:
                # The flush channel first: confirmed before any key's channel is.
                await conn.send_command("SUBSCRIBE", flush_channel(), check_health=False)
                for channel in list(self._confirmed):
                    await conn.send_command(self._subscribe, channel, check_health=False)
                while True:
                    try:
                        reply = await conn.read_response(timeout=math.inf)
                    except ResponseError:
                        continue  # e.g. MOVED for a key whose channel is in another slot
                    self._handle(reply)
            except _IO_ERRORS:
                self._conn = None
                await conn.disconnect(nowait=True)

    def _handle(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel, payload = reply[0], reply[1], reply[2]
        if kind in (b"subscribe", b"ssubscribe"):
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
            for ref in list(self._watched.get(channel, [])):
                hold = ref()
                if (
                    hold is not None
                    and hold.owner == signal.owner
                    and hold.channels.get(channel) == signal.token
                ):
                    hold.lose(signal.reason)

    def _verify_all(self) -> None:
        found = [h for refs in self._watched.values() for r in refs if (h := r()) is not None]
        holds = list({id(h): h for h in found}.values())  # a multi-key hold once
        if holds:
            task = asyncio.get_running_loop().create_task(self._client._verify(holds))
            self._verifying.add(task)
            task.add_done_callback(self._verifying.discard)

    def after_fork(self) -> None:
        self._reset()


class _Node:
    """One server (a cluster: one master): its connections and its signal listener."""

    def __init__(self, client: AsyncLockClient, connector: _Connector, sharded: bool) -> None:
        self.commands = connector
        self.signals = _SignalHub(client, connector, sharded) if client._lost_signal else None

    async def close(self) -> None:
        if self.signals is not None:
            await self.signals.close()
        await self.commands.pool.disconnect()


class AsyncLockClient:
    """The asyncio twin of :class:`redis_lock_client.LockClient`: same constructors (and
    ``redis.asyncio.cluster.RedisCluster``), same connections (per server or cluster master: a
    pool, a fresh one per waiting acquire, one per EPHEMERAL hold, one pub/sub connection read by
    one task). Create it, and use its locks, on one event loop."""

    def __init__(
        self,
        redis_client: Optional[Union[aredis.Redis, ConnectionPool, RedisCluster]] = None,
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
                cls: type[Any] = pool.connection_class
                kwargs = {**pool.connection_kwargs, **connection_kwargs}
            else:
                cls = aredis.Connection
                kwargs = connection_kwargs
            self._single = _Node(self, _Connector(cls, kwargs, command_timeout), sharded=False)
        self.id = new_client_id()
        self._pid = os.getpid()
        self._next = 0

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncLockClient:
        command_timeout = kwargs.pop("command_timeout", DEFAULT_COMMAND_TIMEOUT)
        lost_signal = kwargs.pop("lost_signal", True)
        return cls(
            ConnectionPool.from_url(url, **kwargs),
            command_timeout=command_timeout,
            lost_signal=lost_signal,
        )

    async def _node_for(self, key: bytes) -> _Node:
        if self._single is not None:
            return self._single
        cluster = cast(RedisCluster, self._cluster)
        try:
            await cluster.initialize()  # loads the slot map once; at once afterwards
            node = cluster.nodes_manager.get_node_from_slot(key_slot(key))
        except redis.RedisError as e:
            raise LockConnectionError(f"no node serves {key!r}: {e}") from e
        known = self._nodes.get(node.name)
        if known is None:
            kwargs = {**node.connection_kwargs, **self._extra}
            connector = _Connector(node.connection_class, kwargs, self.command_timeout)
            known = self._nodes[node.name] = _Node(self, connector, sharded=True)
        return known

    async def _refresh(self) -> None:
        if self._cluster is None:
            return
        try:
            await self._cluster.nodes_manager.initialize()
        except redis.RedisError as e:
            raise LockConnectionError(f"cluster slot map: {e}") from e

    async def _query(self, key: bytes, args: list[Any]) -> Any:
        attempt = 0
        while True:
            try:
                return await (await self._node_for(key)).commands.query(args)
            except Redirected:
                if self._cluster is None or attempt >= RETRIES:
                    raise
                attempt += 1
                await self._refresh()

    async def _verify(self, holds: list[_Hold]) -> None:
        """After a flush message: see LockClient._verify."""
        for hold in holds:
            for key, token in zip(hold.keys.keys, hold.tokens):
                if not hold.status.is_active():
                    break
                try:
                    reply = await self._query(hold.key, ["LOCK.INFO", key])
                except LockServerError as e:
                    if is_final(str(e)):
                        hold.lose(LostReason.FLUSHED)
                    break
                except LockError:
                    break
                if not shows_hold(reply, hold.owner, token):
                    hold.lose(LostReason.FLUSHED)

    async def aclose(self) -> None:
        nodes = [self._single] if self._single is not None else list(self._nodes.values())
        for node in nodes:
            if node is not None:
                await node.close()

    async def __aenter__(self) -> AsyncLockClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _owner(self) -> bytes:
        if self._pid != os.getpid():  # a forked child: owners of its own
            self.id, self._pid = new_client_id(), os.getpid()
        self._next += 1
        return f"{self.id}:{self._next}".encode()

    def lock(self, key: Key, **options: Any) -> AsyncLock:
        return AsyncLock(self, to_bytes(key), Kind.EXCLUSIVE, 0, **options)

    def read_lock(self, key: Key, **options: Any) -> AsyncLock:
        return AsyncLock(self, to_bytes(key), Kind.SHARED, 0, **options)

    def semaphore(self, key: Key, limit: int, **options: Any) -> AsyncLock:
        if not 1 <= limit <= 10000:
            raise ValueError("limit must be between 1 and 10000")
        return AsyncLock(self, to_bytes(key), Kind.PERMIT, limit, **options)

    def multi_lock(
        self, keys: Sequence[Key], *, shared: bool = False, **options: Any
    ) -> AsyncMultiLock:
        """The asyncio twin of :meth:`redis_lock_client.LockClient.multi_lock`."""
        checked = KeySet(multi_keys(keys), multi=True)
        kind = Kind.SHARED if shared else Kind.EXCLUSIVE
        return AsyncMultiLock(self, tuple(keys), checked, kind, **options)

    def election(
        self,
        key: Key,
        candidate: Optional[Key] = None,
        *,
        lease: float = DEFAULT_LEASE,
        renewal: Renewal = Renewal.WATCHDOG,
        ephemeral: bool = True,
        on_lost: Optional[LostCallback] = None,
    ) -> AsyncElection:
        """The asyncio twin of :meth:`redis_lock_client.LockClient.election`."""
        return AsyncElection(
            self,
            to_bytes(key),
            None if candidate is None else to_bytes(candidate),
            lease=lease,
            renewal=renewal,
            ephemeral=ephemeral,
            on_lost=on_lost,
        )


_G = TypeVar("_G", bound="_AsyncGuard")


class _AsyncHandle(Generic[_G]):
    """What AsyncLock and AsyncMultiLock share (see the sync _Handle)."""

    def __init__(
        self,
        client: AsyncLockClient,
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
        self._gate = asyncio.Lock()
        self._active: Optional[_Hold] = None
        self._guards = 0
        self._stack: list[_G] = []
        _forkable.add(self)

    #: See the sync _Handle: False for an election's leadership.
    _counts_reentry = True

    def _guard(self, hold: _Hold) -> _G:
        raise NotImplementedError

    def after_fork(self) -> None:
        """In a forked child: a new owner holding nothing (see the sync Lock)."""
        self._active, self._guards, self._stack = None, 0, []
        self.owner = self.client._owner() if self._named is None else self._named

    async def try_acquire(self) -> Optional[_G]:
        return await self._acquire(False, self.wait_timeout)

    async def acquire(self) -> _G:
        guard = await self._acquire(self.wait_timeout != 0, self.wait_timeout)
        if guard is None:
            raise LockTimeout(self.wait_timeout or 0.0)
        return guard

    async def __aenter__(self) -> _G:
        guard = await self.acquire()
        self._stack.append(guard)
        return guard

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self._stack.pop().__aexit__(exc_type, exc, tb)

    def _args(self, waits: bool, wait: Optional[float], value: Optional[bytes]) -> list[Any]:
        return self.keys.acquire(
            self.owner, self.lease, self.kind, self.limit, self.ephemeral, wait, waits
        )

    async def _acquire(
        self, waits: bool, wait_timeout: Optional[float], value: Optional[bytes] = None
    ) -> Optional[_G]:
        async with self._gate:
            current = self._active
            if current is not None and not current.status.is_active():
                current = None
            sent = time.monotonic()
            own: Optional[_OwnConnection] = None
            if self.ephemeral:
                reply, own = await self._send_ephemeral(current, waits, wait_timeout, value)
            else:
                reply = await self._send_with_retries(waits, wait_timeout, value)
            try:
                tokens = self.keys.tokens(reply)
            except UnexpectedReply:
                if own is not None and (current is None or own is not current.own):
                    await own.close()
                raise
            return await self._settle(current, tokens, sent, own)

    async def _send_with_retries(
        self, waits: bool, wait_timeout: Optional[float], value: Optional[bytes]
    ) -> Any:
        until = None if wait_timeout is None else time.monotonic() + wait_timeout
        attempt = 0
        while True:
            this_waits, wait = waits, wait_timeout
            if waits and until is not None:
                wait = until - time.monotonic()
                if wait < 0.001:
                    this_waits = False
            try:
                if this_waits:
                    return await self._send_waiting(self._args(True, wait, value), wait)
                return await self.client._query(self.keys.route, self._args(False, None, value))
            except LockConnectionError:
                if attempt >= RETRIES:
                    raise
                attempt += 1
            except Redirected:
                if attempt >= RETRIES:
                    raise
                attempt += 1
                await self.client._refresh()

    async def _send_waiting(self, args: list[Any], wait: Optional[float]) -> Any:
        connector = (await self.client._node_for(self.keys.route)).commands
        try:
            conn = await connector.new()
        except _IO_ERRORS as e:
            raise LockConnectionError(f"connect: {e}") from e
        try:
            return await connector.call(conn, args, None if wait is None else wait + WAIT_MARGIN)
        finally:
            await conn.disconnect(nowait=True)

    async def _send_ephemeral(
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
                return await current.own.call(args, timeout), current.own
            except LockConnectionError:
                current.lose(LostReason.CONNECTION_CLOSED)
                raise
        attempt = 0
        while True:
            try:
                node = await self.client._node_for(self.keys.route)
                own = _OwnConnection(await node.commands.new())
            except _IO_ERRORS as e:
                raise LockConnectionError(f"connect: {e}") from e
            try:
                return await own.call(args, timeout), own
            except Redirected:
                await own.close()
                if attempt >= RETRIES:
                    raise
                attempt += 1
                await self.client._refresh()
            except (LockError, asyncio.CancelledError):
                await own.close()
                raise

    async def _settle(
        self,
        current: Optional[_Hold],
        tokens: Optional[tuple[int, ...]],
        sent: float,
        own: Optional[_OwnConnection],
    ) -> Optional[_G]:
        if tokens is not None and current is not None and current.tokens == tokens:
            if self._active is current:
                if self._counts_reentry:
                    self._guards += 1
                current.deadline.extend(sent)
                return self._guard(current)
        if current is not None:
            current.lose(LostReason.HOLD_GONE)
        old, self._active, self._guards = self._active, None, 0
        if old is not None:
            old.stop.set()
        if tokens is None:
            if own is not None:
                await own.close()
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
        self._active, self._guards = hold, 1
        await hold.start()
        return self._guard(hold)

    def _end_guard(self, hold: _Hold) -> Optional[bool]:
        if self._active is not hold:
            return None
        self._guards -= 1
        if self._guards > 0:
            return False
        self._active = None
        return True


class AsyncLock(_AsyncHandle["AsyncLockGuard"]):
    """The asyncio twin of :class:`redis_lock_client.Lock` (same options)."""

    def __init__(
        self, client: AsyncLockClient, key: bytes, kind: Kind, limit: int, **options: Any
    ) -> None:
        super().__init__(client, KeySet((key,), multi=False), kind, limit, **options)
        self.key = key

    def _guard(self, hold: _Hold) -> AsyncLockGuard:
        return AsyncLockGuard(self, hold)


class AsyncMultiLock(_AsyncHandle["AsyncMultiLockGuard"]):
    """The asyncio twin of :class:`redis_lock_client.MultiLock` (same options)."""

    def __init__(
        self,
        client: AsyncLockClient,
        given: tuple[Key, ...],
        keys: KeySet,
        kind: Kind,
        **options: Any,
    ) -> None:
        super().__init__(client, keys, kind, 0, **options)
        self.given = given

    def _guard(self, hold: _Hold) -> AsyncMultiLockGuard:
        return AsyncMultiLockGuard(self, hold)


async def _release_quietly(hold: _Hold) -> None:
    await hold.end()
    try:
        await hold.send(hold.keys.release(hold.owner))
    except Exception:  # noqa: BLE001 - best effort: the lease ends it
        log.debug("releasing an abandoned hold of %r failed", hold.keys.keys, exc_info=True)
    finally:
        if hold.own is not None:
            await hold.own.close()


def _abandon(handle: _AsyncHandle[Any], hold: _Hold, pid: int) -> None:
    """A guard was garbage-collected unreleased: stop its watchdog and release it from a task on
    its loop (if that loop still runs; else the lease ends the hold)."""
    if os.getpid() != pid or handle._end_guard(hold) is not True:
        return
    if hold.status.mark_released() is not None:
        return
    try:
        hold.loop.call_soon_threadsafe(lambda: hold.loop.create_task(_release_quietly(hold)))
    except RuntimeError:
        pass  # the loop is closed


async def _release_rest(hold: _Hold) -> None:
    """A lost multi-key hold: see the sync _release_rest."""
    try:
        await hold.send(hold.keys.release(hold.owner))
    except LockError:
        log.debug("releasing the rest of lost hold %r failed", hold.keys.keys, exc_info=True)
    finally:
        if hold.own is not None:
            await hold.own.close()


class _AsyncGuard:
    """What AsyncLockGuard and AsyncMultiLockGuard share."""

    def __init__(self, handle: _AsyncHandle[Any], hold: _Hold) -> None:
        self._handle = handle
        self._hold = hold
        self._released = False
        self._finalizer = weakref.finalize(self, _abandon, handle, hold, os.getpid())

    @property
    def owner(self) -> bytes:
        return self._hold.owner

    @property
    def lost(self) -> asyncio.Event:
        return self._hold.lost_event

    @property
    def lost_reason(self) -> Optional[LostReason]:
        return self._hold.status.reason

    async def release(self) -> Release:
        if self._released:
            return Release.ALREADY_RELEASED
        self._released = True
        self._finalizer.detach()
        hold = self._hold
        if hold.pid != os.getpid():
            raise NotHeld(LostReason.FORKED)
        if hold.keys.multi:
            # As in the sync guard: no acquire of this handle between count-down and MRELEASE.
            async with self._handle._gate:
                return await self._release(hold)
        return await self._release(hold)

    async def _release(self, hold: _Hold) -> Release:
        last = self._handle._end_guard(hold)
        if last is None:
            raise NotHeld(hold.status.reason)
        if not last:
            if hold.status.reason is not None:
                raise NotHeld(hold.status.reason)
            return Release.STILL_HELD
        error = hold.status.mark_released()
        await hold.end()
        if error is not None:
            if hold.keys.multi:
                await _release_rest(hold)
            raise error
        try:
            reply = await hold.send(hold.keys.release(hold.owner))
        finally:
            if hold.own is not None:
                await hold.own.close()
        if not hold.keys.released(reply):
            raise NotHeld(None)
        return Release.RELEASED

    async def __aenter__(self: _G) -> _G:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if exc_type is None:
                raise


class AsyncLockGuard(_AsyncGuard):
    """The asyncio twin of :class:`redis_lock_client.LockGuard`; ``lost`` is an
    ``asyncio.Event`` (``await guard.lost.wait()``)."""

    @property
    def token(self) -> int:
        return self._hold.token

    @property
    def key(self) -> bytes:
        return self._hold.key

    def __repr__(self) -> str:
        return (
            f"AsyncLockGuard(key={self.key!r}, owner={self.owner!r}, token={self.token}, "
            f"lost={self.lost_reason})"
        )


class AsyncMultiLockGuard(_AsyncGuard):
    """The asyncio twin of :class:`redis_lock_client.MultiLockGuard`."""

    @property
    def tokens(self) -> dict[Key, int]:
        """Each key's fencing token, keyed by the keys as given, in that order."""
        handle = cast(AsyncMultiLock, self._handle)
        return dict(zip(handle.given, self._hold.tokens))

    @property
    def keys(self) -> tuple[bytes, ...]:
        return self._hold.keys.keys

    def __repr__(self) -> str:
        return (
            f"AsyncMultiLockGuard(keys={self.keys!r}, owner={self.owner!r}, "
            f"tokens={self._hold.tokens}, lost={self.lost_reason})"
        )


class _AsyncCandidate(_AsyncHandle["AsyncLeadership"]):
    """The hold of a campaign (see the sync _Candidate)."""

    _counts_reentry = False

    def __init__(self, election: AsyncElection, **options: Any) -> None:
        keys = KeySet((election.key,), multi=False)
        super().__init__(election.client, keys, Kind.EXCLUSIVE, 0, **options)
        self.election = election
        self._leadership: Optional[AsyncLeadership] = None

    def _args(self, waits: bool, wait: Optional[float], value: Optional[bytes]) -> list[Any]:
        return campaign_args(
            self.election.key, self.owner, self.lease, self.ephemeral, wait, waits, value
        )

    def _guard(self, hold: _Hold) -> AsyncLeadership:
        current = self._leadership
        if current is None or current._hold is not hold:
            current = self._leadership = AsyncLeadership(self, hold)
        return current


class AsyncElection:
    """The asyncio twin of :class:`redis_lock_client.Election`: ``await campaign()``,
    ``await leader()``, ``async for leader in election.observe()``."""

    def __init__(
        self, client: AsyncLockClient, key: bytes, candidate: Optional[bytes], **options: Any
    ) -> None:
        self.client = client
        self.key = key
        self._candidate = _AsyncCandidate(self, owner=candidate, **options)

    @property
    def candidate(self) -> bytes:
        return self._candidate.owner

    async def campaign(
        self, value: Optional[Key] = None, timeout: Optional[float] = None
    ) -> AsyncLeadership:
        """See :meth:`redis_lock_client.Election.campaign`."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must not be negative")
        data = None if value is None else to_bytes(value)
        leadership = await self._candidate._acquire(timeout != 0, timeout, data)
        if leadership is None:
            raise LockTimeout(timeout or 0.0)
        return leadership

    async def leader(self) -> Optional[Leader]:
        return parse_leader(await self.client._query(self.key, ["LOCK.LEADER", self.key]))

    def observe(self) -> AsyncObserver:
        """``async with election.observe() as leaders: async for leader in leaders: ...``"""
        return AsyncObserver(self.client, self.key)


class AsyncLeadership(_AsyncGuard):
    """The asyncio twin of :class:`redis_lock_client.Leadership`; ``lost`` is an
    ``asyncio.Event``."""

    @property
    def epoch(self) -> int:
        return self._hold.token

    @property
    def key(self) -> bytes:
        return self._hold.key

    @property
    def candidate(self) -> bytes:
        return self._hold.owner

    async def proclaim(self, value: Key) -> bool:
        """See :meth:`redis_lock_client.Leadership.proclaim`."""
        hold = self._hold
        if self._released or not hold.status.is_active():
            return False
        if hold.deadline.left() <= 0:
            hold.lose(LostReason.UNREACHABLE)
            return False
        args = ["LOCK.PROCLAIM", hold.key, hold.owner, hold.token, to_bytes(value)]
        try:
            reply = await hold.send(args)
        except LockConnectionError:
            if hold.own is None:
                raise
            hold.lose(LostReason.CONNECTION_CLOSED)
            return False
        if proclaimed(reply):
            return True
        hold.lose(LostReason.HOLD_GONE)
        return False

    async def resign(self) -> Release:
        return await self.release()

    def __repr__(self) -> str:
        return (
            f"AsyncLeadership(key={self.key!r}, candidate={self.candidate!r}, "
            f"epoch={self.epoch}, lost={self.lost_reason})"
        )


class AsyncObserver:
    """The asyncio twin of :class:`redis_lock_client.Observer`: an async iterator of
    :class:`Leader`; ``aclose()`` (or ``async with``) ends it."""

    def __init__(self, client: AsyncLockClient, key: bytes) -> None:
        self._client = client
        self._key = key
        self._channel = leader_channel(key)
        self._subscribe = "SSUBSCRIBE" if client._cluster is not None else "SUBSCRIBE"
        self._feed = LeaderFeed()
        self._ready: list[Leader] = []
        self._conn: Optional[_RawConnection] = None
        self._closed = False

    def __aiter__(self) -> AsyncObserver:
        return self

    async def __anext__(self) -> Leader:
        delay = 0.05
        while True:
            if self._closed:
                await self._drop()
                raise StopAsyncIteration
            if self._ready:
                return self._ready.pop(0)
            conn = self._conn
            if conn is None:
                try:
                    await self._connect()
                    delay = 0.05
                except LockError:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                continue
            try:
                reply = await conn.read_response(timeout=math.inf)
            except ResponseError:
                continue
            except _IO_ERRORS:
                await self._drop()
                continue
            except asyncio.CancelledError:
                await self._drop()  # a half-read reply must never be read later
                raise
            await self._take(reply)

    async def _connect(self) -> None:
        connector = (await self._client._node_for(self._key)).commands
        try:
            conn = await connector.new()
        except _IO_ERRORS as e:
            raise LockConnectionError(f"connect: {e}") from e
        try:
            reply = await connector.call(conn, [self._subscribe, self._channel], connector.timeout)
            if not (isinstance(reply, list) and reply[1:2] == [self._channel]):
                raise UnexpectedReply(f"{self._subscribe} answered {reply!r}")
            leader = parse_leader(
                await self._client._query(self._key, ["LOCK.LEADER", self._key])
            )
        except Redirected:
            await conn.disconnect(nowait=True)
            await self._client._refresh()
            raise
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        self._conn = conn
        self._push(self._feed.read(leader))

    async def _take(self, reply: Any) -> None:
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
                reply = await self._client._query(self._key, ["LOCK.LEADER", self._key])
            except LockError:
                return
            self._push(self._feed.read(parse_leader(reply)))

    def _push(self, leader: Optional[Leader]) -> None:
        if leader is not None:
            self._ready.append(leader)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect(nowait=True)

    async def aclose(self) -> None:
        """Ends the iteration and closes the connection (cancel a task blocked in
        ``__anext__`` to stop it at once)."""
        self._closed = True
        await self._drop()

    async def __aenter__(self) -> AsyncObserver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _after_fork_in_child() -> None:
    for obj in list(_forkable):
        obj.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
