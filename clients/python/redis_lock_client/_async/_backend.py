"""Where the asyncio library and the threaded one truly differ: tasks instead of threads,
asyncio's locks and events, redis.asyncio's connections and cluster. Hand-written;
``_sync/_backend.py`` is its threaded twin, with the same names. Everything else in ``_sync/`` is
generated from ``_async/`` by ``unasync.py``."""

from __future__ import annotations

import collections

import asyncio
import logging
import math
import select
import time
from typing import Any, Callable, Coroutine, Literal, Optional, Protocol, TypeVar, cast

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection, ConnectionPool
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._masters import (
    STRAGGLER_GRACE,
    Address,
    FollowedMasters,
    majority,
    with_current_address,
)
from .._watchdog import OVER, Look

__all__ = [
    "CLOSED",
    "Cancelled",
    "ConnectionPool",
    "DefaultConnection",
    "Event",
    "IO_ERRORS",
    "LostEvent",
    "Mutex",
    "RawConnection",
    "Redis",
    "RedisCluster",
    "SentinelConnectionPool",
    "Subscriber",
    "closed_by_server",
    "closed_now",
    "is_closed",
    "close_connection",
    "cluster_node",
    "cluster_node_at",
    "cluster_node_known",
    "cluster_refresh",
    "current_loop",
    "new_gate",
    "open_connection",
    "peer",
    "ask_master",
    "interrupt",
    "pool_close",
    "pool_get",
    "pool_put",
    "read",
    "send",
    "send_packed",
    "sentinel_master",
    "sleep",
    "spawn",
    "spawn_from_any_thread",
    "start",
    "finish",
    "wait_event",
    "Watch",
    "Watchdog",
    "Watched",
]

log = logging.getLogger("redis_lock_client")

Redis = aredis.Redis
DefaultConnection = Connection
#: What a broken, closed or timed-out connection raises.
IO_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)
#: What a cancelled wait raises (the threaded library has no cancellation: never raised there).
Cancelled = asyncio.CancelledError
Event = asyncio.Event
#: A lock held across a command (the threaded twin: threading.Lock).
Mutex = asyncio.Lock


class LostEvent(asyncio.Event):
    """A hold's ``lost`` event, never stale: ``is_set()`` and ``wait()`` first call ``look``
    (the hold looks at its local deadline, and past it reports the loss, which sets the event),
    so an event kept from before a pause past the lease says so the instant the process resumes,
    before the watchdog has run. The threaded twin is a ``threading.Event``."""

    def __init__(self, look: Callable[[], object]) -> None:
        super().__init__()
        self._look = look

    def is_set(self) -> bool:
        if not super().is_set():
            self._look()
        return super().is_set()

    async def wait(self) -> Literal[True]:
        if not super().is_set():
            self._look()
        return await super().wait()


def new_gate() -> asyncio.Lock:
    """A handle's gate: its acquires and the releases that send something, one at a time."""
    return asyncio.Lock()


async def wait_event(event: asyncio.Event, timeout: Optional[float]) -> bool:
    """Waits up to ``timeout`` seconds (None: as long as it takes) for ``event``; whether it is
    set."""
    if timeout is not None and timeout <= 0:
        return event.is_set()
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except asyncio.TimeoutError:
        return event.is_set()


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


# Tasks started and forgotten: asyncio keeps only weak references to tasks.
_running: set[asyncio.Task[None]] = set()


def spawn(name: str, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
    """Runs ``fn(*args)`` in the background: a task on the running loop."""
    task: asyncio.Task[None] = asyncio.get_running_loop().create_task(fn(*args), name=name)
    _running.add(task)
    task.add_done_callback(_running.discard)


def spawn_short(name: str, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
    """Runs ``fn(*args)``, one round trip of work asked for by a reader that must read on (the
    check a lost-hold message asks for): here a task, as ``spawn``. The threaded twin runs it
    at once on the calling thread, where starting a thread would cost more than the work."""
    spawn(name, fn, *args)


T = TypeVar("T")


def start(work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Runs ``work`` as a task of its own, so that a cancel of the caller does not reach it
    (awaited with ``finish``). The threaded twin runs it at once (nothing cancels a thread)."""
    return asyncio.ensure_future(work)


async def finish(task: asyncio.Task[T]) -> T:
    """What ``start``'s task returned (or raised); a cancel of the caller leaves it running."""
    return await asyncio.shield(task)


def current_loop() -> Optional[asyncio.AbstractEventLoop]:
    """What ``spawn_from_any_thread`` needs to reach this loop again (the running loop)."""
    return asyncio.get_running_loop()


def spawn_from_any_thread(
    loop: Optional[asyncio.AbstractEventLoop],
    name: str,
    fn: Callable[..., Coroutine[Any, Any, None]],
    *args: Any,
) -> None:
    """From any thread (a finalizer runs where the collector runs): ``spawn`` on ``loop``. A
    closed loop runs nothing."""
    if loop is None:
        return
    try:
        loop.call_soon_threadsafe(lambda: spawn(name, fn, *args))
    except RuntimeError:
        pass  # the loop is closed


class Watched(Protocol):
    """What the watchdog watches (a hold)."""

    def look(self, now: float, renewing: bool) -> Look:
        """What to do at ``now`` (``renewing``: a renewal asked for earlier is under way). Never
        waits (the threaded twin looks at every hold of a client on one thread)."""
        ...

    async def renew_once(self) -> None:
        """The renewal a look asked for: a round trip, up to the command timeout."""
        ...

    async def unwatched(self) -> None:
        """The watch is over (after the renewal under way, if one was)."""
        ...


class Watch:
    """One hold under the watchdog: a task on the loop that acquired it, which looks at the
    hold when the hold says and runs each renewal a look asks for as a task of its own (the
    looks go on meanwhile: a renewal that waits on the server never delays the deadline's).
    ``wake()`` (from any thread) has it looked at at once: it was stopped (released, or lost by
    other news than the watchdog's)."""

    def __init__(self, watched: Watched, name: str) -> None:
        self._watched = watched
        self._name = name
        self._woken = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        spawn(name, self._run)

    def wake(self) -> None:
        try:
            here: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is self._loop:
            self._woken.set()
            return
        try:
            self._loop.call_soon_threadsafe(self._woken.set)
        except RuntimeError:
            pass  # the loop is closed

    async def _run(self) -> None:
        renewal: Optional[asyncio.Task[None]] = None
        try:
            while True:
                self._woken.clear()  # (a wake from now on is seen by the wait below)
                try:
                    look = self._watched.look(time.monotonic(), renewal is not None)
                except Exception:  # noqa: BLE001 - as the threaded twin: logged, watch over
                    log.exception("the watchdog's look at %s failed", self._name)
                    look = OVER
                if look.renew:
                    renewal = asyncio.ensure_future(self._renew())
                if look.again is None:
                    return
                woken = asyncio.ensure_future(self._woken.wait())
                try:
                    await asyncio.wait(
                        {woken} if renewal is None else {woken, renewal},
                        timeout=max(0.0, look.again - time.monotonic()),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    woken.cancel()
                if renewal is not None and renewal.done():
                    renewal = None  # its answer moved the hold's times: looked at again now
        finally:
            if renewal is not None:
                await asyncio.wait({renewal})
            try:
                await self._watched.unwatched()
            except Exception:  # noqa: BLE001
                log.exception("ending the watch of %s failed", self._name)

    async def _renew(self) -> None:
        try:
            await self._watched.renew_once()
        except Exception:  # noqa: BLE001 - the deadline stands: the next look reports it
            log.exception("a renewal of %s failed", self._name)


class Watchdog:
    """A client's watchdog: a task per hold (``Watch``) on the loop that acquired it. (The
    threaded twin looks at every hold of the client on one thread and sends renewals on a few
    workers, with the same looks.)"""

    def watch(self, name: str, watched: Watched) -> Watch:
        """Watches ``watched`` from now on: looked at at once, then when it says."""
        return Watch(watched, name)


class RawConnection(Protocol):
    """The part of redis.asyncio's (untyped) Connection the library uses."""

    async def connect(self) -> None: ...
    async def send_command(self, *args: Any, check_health: bool = True) -> None: ...
    async def send_packed_command(
        self, command: list[bytes], check_health: bool = True
    ) -> None: ...
    async def read_response(self, disable_decoding: bool = False, timeout: Any = None) -> Any: ...
    async def disconnect(self, nowait: bool = False) -> None: ...


def peer(conn: RawConnection) -> Optional[tuple[str, int]]:
    """The server a connection reached (under Sentinel: the master it was told of)."""
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    return (host, port) if isinstance(host, str) and isinstance(port, int) else None


async def open_connection(cls: type[Any], kwargs: dict[str, Any]) -> RawConnection:
    conn = cast(RawConnection, cls(**kwargs))
    await conn.connect()
    return conn


async def send(conn: RawConnection, args: list[Any]) -> None:
    await conn.send_command(*args, check_health=False)


async def send_packed(conn: RawConnection, packed: list[bytes]) -> None:
    """A command already in RESP (``packed``: its pieces, sent as they are)."""
    await conn.send_packed_command(packed, check_health=False)


async def read(conn: RawConnection, timeout: Optional[float]) -> Any:
    """One reply; ``timeout`` None waits as long as it takes. Past ``timeout``: a TimeoutError,
    the connection closed. (redis.asyncio answers ``None`` to a read its own ``timeout`` ended,
    and leaves the reply on its way for the next read: a command that timed out then looked
    answered nil, and the next command on the connection read its reply.)"""
    if timeout is None:
        return await conn.read_response(timeout=math.inf)
    # The read ends cancelled, which closes the connection (redis.asyncio closes it then).
    return await asyncio.wait_for(conn.read_response(timeout=math.inf), timeout)


async def close_connection(conn: RawConnection) -> None:
    await conn.disconnect(nowait=True)


def closed_by_server(conn: RawConnection, mutex: asyncio.Lock) -> bool:
    """Whether an idle connection was closed by the server (its stream saw EOF)."""
    reader = getattr(conn, "_reader", None)
    return reader is None or bool(reader.at_eof())


def is_closed(conn: RawConnection) -> bool:
    """Whether ``conn`` was disconnected (redis.asyncio drops its stream then)."""
    return getattr(conn, "_reader", None) is None


def closed_now(conn: RawConnection) -> bool:
    """Whether an idle connection the caller holds (nothing asked on it) is closed: by this
    side, or by the server, also when the event loop has not read the server's close yet (its
    socket is readable with nothing asked: the end of the stream). A TLS connection is judged by
    its stream alone (a TLS record may arrive on an idle one)."""
    reader = getattr(conn, "_reader", None)
    if reader is None or reader.at_eof():
        return True
    transport = getattr(getattr(conn, "_writer", None), "transport", None)
    if transport is None or transport.is_closing():
        return True
    if transport.get_extra_info("sslcontext") is not None:
        return False
    sock = transport.get_extra_info("socket")
    fd = sock.fileno() if sock is not None else -1
    if fd < 0:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def new_pool(cls: type[Any], kwargs: dict[str, Any]) -> ConnectionPool:
    return ConnectionPool(connection_class=cls, **kwargs)


async def pool_get(pool: ConnectionPool) -> RawConnection:
    return cast(RawConnection, await pool.get_connection())  # type: ignore[no-untyped-call]


async def pool_put(pool: ConnectionPool, conn: RawConnection) -> None:
    await pool.release(cast(Any, conn))


async def pool_close(pool: ConnectionPool) -> None:
    await pool.disconnect()


def pool_in_use(pool: ConnectionPool) -> list[RawConnection]:
    """The pool's connections taken out now: a command on each, or its connect and handshake
    (redis-py connects a connection after taking it out)."""
    return list(cast(Any, pool)._get_in_use_connections())


#: What ``Subscriber.read`` returns once the subscriber is closed.
CLOSED: Any = object()


class Subscriber:
    """A pub/sub connection read by one task. ``post`` sends a (un)subscription without
    waiting; ``read`` returns the next reply, or ``CLOSED`` once ``close`` was called."""

    def __init__(self, conn: RawConnection) -> None:
        self._conn = conn
        self._closed = False
        self._kicked = False
        #: The server this connection reached (host, port).
        self.address = peer(conn)
        #: The (un)subscriptions sent, oldest first, until their reply is read.
        self._sent: collections.deque[tuple[str, bytes]] = collections.deque()

    def post(self, op: str, channel: bytes) -> None:
        spawn("redis-lock-subscribe", self._send, op, channel)

    def answered(
        self, kind: Optional[bytes] = None, channel: Optional[bytes] = None
    ) -> Optional[tuple[str, bytes]]:
        """The (un)subscription a reply answers, taken off the ones sent and not yet answered:
        the oldest for an error reply (``kind`` None), else the oldest if it is ``kind`` of
        ``channel`` (a ``sunsubscribe`` the server sent by itself answers nothing). Only the
        reading task (thread) calls it."""
        if not self._sent:
            return None
        op, sent = self._sent[0]
        if kind is not None and (op.lower().encode() != kind or sent != channel):
            return None
        return self._sent.popleft()

    async def kick(self) -> None:
        """Breaks the connection from another task: a ``read`` waiting meanwhile raises a
        ConnectionError, as for a connection the server closed (the reader connects again)."""
        self._kicked = True
        interrupt(self._conn)

    async def _send(self, op: str, channel: bytes) -> None:
        if self._closed:
            return
        # Written before this task's first pause: the tasks of ``post`` write in their order.
        self._sent.append((op, channel))
        try:
            await send(self._conn, [op, channel])
        except IO_ERRORS:
            pass  # the reader sees the broken connection

    async def read(self, timeout: Optional[float] = None) -> Any:
        """The next reply (``timeout`` None: as long as it takes; past it, a TimeoutError)."""
        if self._closed:
            return CLOSED
        try:
            return await read(self._conn, timeout)
        except Exception as e:
            if self._closed:
                return CLOSED
            if self._kicked:
                raise RedisConnectionError("left for the new master") from e
            raise

    async def close(self) -> None:
        """Ends the reads; a ``read`` waiting meanwhile returns ``CLOSED``."""
        self._closed = True
        await close_connection(self._conn)


async def cluster_node(cluster: RedisCluster, slot: int) -> tuple[str, type[Any], dict[str, Any]]:
    """The master serving ``slot``: its name, connection class and connection settings."""
    await cluster.initialize()  # loads the slot map once; at once afterwards
    node = cluster.nodes_manager.get_node_from_slot(slot)
    return node.name, node.connection_class, node.connection_kwargs


def cluster_node_known(cluster: RedisCluster, slot: int) -> Optional[str]:
    """The name of the master serving ``slot`` in the slot map as loaded, or None (no map yet,
    the slot not covered): never a request."""
    try:
        return str(cluster.nodes_manager.get_node_from_slot(slot).name)
    except Exception:  # noqa: BLE001 - not known: the caller's default
        return None


async def cluster_node_at(
    cluster: RedisCluster, host: str, port: int
) -> Optional[tuple[str, type[Any], dict[str, Any]]]:
    node = cluster.nodes_manager.get_node(host=host, port=port)
    if node is None:
        return None
    return node.name, node.connection_class, node.connection_kwargs


async def cluster_refresh(cluster: RedisCluster) -> None:
    await cluster.nodes_manager.initialize()


class EpochSentinel(Sentinel):
    """redis-py's Sentinel manager, whose master is the one named with the highest configuration
    epoch by the Sentinels that answer, never one named with a lower epoch than the master it
    follows (``_masters.py``). redis-py's takes the first Sentinel whose answer looks healthy:
    one that has not heard of a failover yet names the old master. Every Sentinel is asked at
    once; one that fails or times out is left out, and once a majority answered the others are
    waited for ``STRAGGLER_GRACE`` more."""

    def __init__(self, sentinels: list[tuple[str, int]], sentinel_kwargs: dict[str, Any]) -> None:
        # redis-py's Sentinel is untyped.
        super().__init__(sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        self.followed = FollowedMasters()

    async def discover_master(self, service_name: str) -> Address:
        sentinels = list(self.sentinels)

        async def ask(sentinel: Any) -> object:
            try:
                state = await sentinel.execute_command("SENTINEL MASTER", service_name)
                address = await sentinel.execute_command(
                    "SENTINEL GET-MASTER-ADDR-BY-NAME", service_name
                )
            except (RedisError, OSError, asyncio.TimeoutError) as e:
                return e
            return with_current_address(state, address)

        tasks = [asyncio.ensure_future(ask(s)) for s in sentinels]
        pending = set(tasks)
        answered = 0
        while pending and answered < majority(len(sentinels)):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            answered += sum(isinstance(t.result(), dict) for t in done)
        if pending:
            # A majority answered: the others get a moment more, not the whole timeout (a
            # paused Sentinel would otherwise slow every lookup, each failover's included).
            _, pending = await asyncio.wait(pending, timeout=STRAGGLER_GRACE)
            for task in pending:
                task.cancel()
        answers = [t.result() if t.done() and not t.cancelled() else None for t in tasks]
        return self.followed.pick(
            service_name,
            list(zip(sentinels, answers)),
            self._usable(service_name),
            self._force_master_ip,
            MasterNotFoundError,
        )

    def _usable(self, service_name: str) -> Callable[[dict[str, Any]], bool]:
        """redis-py's check of a Sentinel's answer (the master not flagged down, the Sentinel
        seeing ``min_other_sentinels``)."""
        check: Callable[[dict[str, Any], str], Any] = self.check_master_state
        return lambda state: bool(check(state, service_name))


def sentinel_master(
    sentinels: list[tuple[str, int]],
    service_name: str,
    sentinel_kwargs: dict[str, Any],
    connection_kwargs: dict[str, Any],
) -> tuple[Sentinel, Redis]:
    """The library's Sentinel manager (``EpochSentinel``) and its client of the master named
    ``service_name``."""
    manager = EpochSentinel(sentinels, sentinel_kwargs=sentinel_kwargs)
    return manager, manager.master_for(service_name, **connection_kwargs)


async def ask_master(pool: Any) -> None:
    """Asks the Sentinels for the master now (redis-py's Sentinel pool remembers it)."""
    await pool.get_master_address()


def interrupt(conn: RawConnection) -> None:
    """Breaks ``conn`` under a task reading from it: that read ends with a ConnectionError (as
    for a connection the server closed), and its caller closes the connection."""
    writer = getattr(conn, "_writer", None)
    transport = getattr(writer, "transport", None)
    if transport is not None:
        transport.abort()
