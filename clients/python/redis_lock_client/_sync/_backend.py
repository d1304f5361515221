"""Where the threaded library and the asyncio one truly differ: threads instead of tasks,
threading's locks and events, redis-py's blocking connections and cluster. Hand-written;
``_async/_backend.py`` is its asyncio twin, with the same names. Everything else in ``_sync/`` is
generated from ``_async/`` by ``unasync.py``."""

from __future__ import annotations

import collections
import logging
import select
import socket
import threading
import time
from typing import Any, Callable, Optional, Protocol, TypeVar, cast

import redis
from redis.cluster import RedisCluster
from redis.connection import Connection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from .. import _fork
from .._masters import (
    STRAGGLER_GRACE,
    Address,
    FollowedMasters,
    majority,
    with_current_address,
)
from .._watchdog import OVER, Look, Timetable

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

Redis = redis.Redis
DefaultConnection = Connection
#: What a broken, closed or timed-out connection raises.
IO_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class Cancelled(BaseException):
    """Never raised: a thread is not cancelled (asyncio's CancelledError in the asyncio twin)."""


Event = threading.Event
#: A lock held across a command (the asyncio twin: asyncio.Lock).
Mutex = threading.Lock


class LostEvent(threading.Event):
    """A hold's ``lost`` event, never stale: ``is_set()`` and ``wait()`` first call ``look``
    (the hold looks at its local deadline, and past it reports the loss, which sets the event),
    so an event kept from before a pause past the lease says so the instant the process resumes,
    before the watchdog has run. The asyncio twin is an ``asyncio.Event``."""

    def __init__(self, look: Callable[[], object]) -> None:
        super().__init__()
        self._look = look

    def is_set(self) -> bool:
        if not super().is_set():
            self._look()
        return super().is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        if not super().is_set():
            self._look()
        return super().wait(timeout)


def new_gate() -> threading.RLock:
    """A handle's gate: its acquires and the releases that send something, one at a time.
    Reentrant, so that an ``on_lost`` callback run inside an acquire may release."""
    return threading.RLock()


def wait_event(event: threading.Event, timeout: Optional[float]) -> bool:
    """Waits up to ``timeout`` seconds (None: as long as it takes) for ``event``; whether it is
    set."""
    if timeout is not None and timeout <= 0:
        return event.is_set()
    return event.wait(timeout)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def spawn(name: str, fn: Callable[..., None], *args: Any) -> None:
    """Runs ``fn(*args)`` in the background: a daemon thread."""
    threading.Thread(target=fn, args=args, name=name, daemon=True).start()


def spawn_short(name: str, fn: Callable[..., None], *args: Any) -> None:
    """Runs ``fn(*args)``, one round trip of work asked for by a reader that must read on (the
    check a lost-hold message asks for): at once, on the calling thread (the signal listener's),
    which reads on when it returns. Starting a thread would cost more than the work (a
    millisecond and more at the 99th percentile on a busy machine); the asyncio twin makes a
    task. An error of ``fn`` ends ``fn`` only, as it would end its own thread or task: logged,
    never raised into the reader (the listener of every hold's messages)."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the reader reads on; the error is logged
        log.exception("%s failed", name)


T = TypeVar("T")


def start(work: T) -> T:
    """The asyncio twin runs its coroutine as a task of its own (a cancel of the caller does
    not reach it); here the work has run already: its result."""
    return work


def finish(task: T) -> T:
    return task


def current_loop() -> Optional[object]:
    """No loop to come back to: a thread can start from anywhere."""
    return None


def spawn_from_any_thread(loop: Optional[object], name: str, fn: Callable[..., None], *args: Any) -> None:
    """From any thread (a finalizer runs where the collector runs): ``spawn``."""
    spawn(name, fn, *args)


class Watched(Protocol):
    """What the watchdog watches (a hold)."""

    def look(self, now: float, renewing: bool) -> Look:
        """What to do at ``now`` (``renewing``: a renewal asked for earlier is under way). Never
        waits: one thread looks at every hold of a client."""
        ...

    def renew_once(self) -> None:
        """The renewal a look asked for: a round trip, up to the command timeout."""
        ...

    def unwatched(self) -> None:
        """The watch is over (after the renewal under way, if one was)."""
        ...

    def where(self) -> Optional[str]:
        """The node its renewals go to as far as its client knows (never a request); None: the
        one server, or not known."""
        ...


#: How many threads at most send a client's renewals to one node at once (each a round trip of
#: up to the command timeout); the others wait their turn. Each node has its own: renewals stuck
#: on a node that does not answer never hold back another node's.
RENEWAL_WORKERS = 4
#: How long the watchdog's thread and its workers wait with nothing to do before they end (the
#: next hold starts them again).
IDLE_END = 5.0


class Watch:
    """One hold under the watchdog. ``wake()`` (from any thread) has it looked at at once: it
    was stopped (released, or lost by other news than the watchdog's)."""

    def __init__(self, watchdog: Watchdog, watched: Watched, name: str) -> None:
        self.watched = watched
        self.name = name
        self._watchdog = watchdog
        #: A renewal of it is on a worker (the watchdog's lock guards this and ``over``).
        self.renewing = False
        #: No more looks: the watch ends (after the renewal under way, if one is).
        self.over = False

    def wake(self) -> None:
        self._watchdog._plan(self, time.monotonic())


class Watchdog:
    """A client's watchdog: ONE thread looks at each hold of the client when the hold asked to
    be looked at (the soonest first, from a ``Timetable``: a renewal due, its deadline, an
    EPHEMERAL hold's connection every 100 ms) and decides there, never waiting on the network;
    each renewal it decides on, a round trip of up to the command timeout, is sent by one of up
    to ``RENEWAL_WORKERS`` threads of the hold's node (``Watched.where``). A server that does not
    answer delays its own holds' renewals (its workers wait on it), never another node's, never
    a look: every deadline is seen when it comes. The thread and the workers
    start with the first hold and end once idle for ``IDLE_END``. (The asyncio twin runs a task
    per hold, with the same looks.)"""

    def __init__(self) -> None:
        self._reset()
        _fork.register(self)

    def _reset(self) -> None:
        self._lock = threading.Condition()
        self._timetable: Timetable[Watch] = Timetable()
        self._looking = False  # the thread runs
        #: Each node's renewal workers, by ``Watched.where`` (a cluster's masters seen so far).
        self._workers: dict[Optional[str], _Workers] = {}

    def after_fork(self) -> None:
        """In a forked child: none of the parent's threads are here, and its holds are not
        renewed here (``Hold.after_fork``); the child's own start afresh."""
        self._reset()

    def watch(self, name: str, watched: Watched) -> Watch:
        """Watches ``watched`` from now on: looked at at once, then when it says."""
        watch = Watch(self, watched, name)
        self._plan(watch, time.monotonic())
        return watch

    def _plan(self, watch: Watch, at: float) -> None:
        with self._lock:
            if watch.over:
                return
            if self._timetable.plan(watch, at):
                self._lock.notify()
            if not self._looking:
                self._looking = True
                thread = threading.Thread(target=self._look_on, name="redis-lock-watchdog")
                thread.daemon = True
                thread.start()

    def _look_on(self) -> None:
        """The watchdog's thread: every look, when it comes."""
        while True:
            with self._lock:
                watch = self._next_due()
                if watch is None:
                    self._looking = False
                    return
            self._look(watch)

    def _next_due(self) -> Optional[Watch]:
        """(Locked.) The watch whose look is due, once one is; None after ``IDLE_END`` with
        nothing planned."""
        idle_until: Optional[float] = None
        while True:
            now = time.monotonic()
            watch = self._timetable.take_due(now)
            if watch is not None:
                return watch
            soonest = self._timetable.soonest()
            if soonest is not None:
                idle_until = None
                self._lock.wait(soonest - now)
            elif idle_until is None:
                idle_until = now + IDLE_END
            elif now >= idle_until:
                return None
            else:
                self._lock.wait(idle_until - now)

    def _look(self, watch: Watch) -> None:
        with self._lock:
            renewing = watch.renewing
        try:
            look = watch.watched.look(time.monotonic(), renewing)
        except Exception:  # noqa: BLE001 - one hold's failure must not stop the others' looks
            log.exception("the watchdog's look at %s failed", watch.name)
            look = OVER
        with self._lock:
            if look.renew:
                watch.renewing = True
            if look.again is None:
                watch.over = True
                self._timetable.drop(watch)
            else:
                self._timetable.plan(watch, look.again)  # (or sooner: woken meanwhile)
            ended = watch.over and not watch.renewing
        if look.renew:
            self._workers_of(watch).run(lambda: self._renew(watch))
        if ended:  # closing an EPHEMERAL hold's connection may wait for its command to break
            self._workers_of(watch).run(lambda: self._end(watch))

    def _workers_of(self, watch: Watch) -> _Workers:
        """The workers of the node the hold's renewals go to."""
        try:
            where = watch.watched.where()
        except Exception:  # noqa: BLE001 - not known: the shared workers
            log.exception("where %s is served is not known", watch.name)
            where = None
        with self._lock:
            workers = self._workers.get(where)
            if workers is None:
                workers = self._workers[where] = _Workers(RENEWAL_WORKERS, "redis-lock-renewal")
            return workers

    def _renew(self, watch: Watch) -> None:
        """On a worker: the renewal a look asked for; then the hold is looked at again at once
        (the answer moved its times), or its watch ends."""
        try:
            watch.watched.renew_once()
        except Exception:  # noqa: BLE001 - the deadline stands: the next look reports it
            log.exception("a renewal of %s failed", watch.name)
        with self._lock:
            watch.renewing = False
            over = watch.over
        if over:
            self._end(watch)
        else:
            self._plan(watch, time.monotonic())

    def _end(self, watch: Watch) -> None:
        try:
            watch.watched.unwatched()
        except Exception:  # noqa: BLE001
            log.exception("ending the watch of %s failed", watch.name)


class _Workers:
    """Up to ``most`` daemon threads running the jobs given, in the order given: started as jobs
    come (one more while the jobs waiting outnumber the idle ones), each ending once idle for
    ``IDLE_END``."""

    def __init__(self, most: int, name: str) -> None:
        self._most = most
        self._name = name
        self._lock = threading.Condition()
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._threads = 0
        self._idle = 0

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._jobs.append(job)
            if len(self._jobs) > self._idle and self._threads < self._most:
                self._threads += 1
                threading.Thread(target=self._work, name=self._name, daemon=True).start()
            else:
                self._lock.notify()

    def _work(self) -> None:
        while True:
            with self._lock:
                idle_until = time.monotonic() + IDLE_END
                while not self._jobs:
                    left = idle_until - time.monotonic()
                    if left <= 0:
                        self._threads -= 1
                        return
                    self._idle += 1
                    self._lock.wait(left)
                    self._idle -= 1
                job = self._jobs.popleft()
            try:
                job()
            except Exception:  # noqa: BLE001 - the worker serves the next job
                log.exception("a job of %s failed", self._name)


class RawConnection(Protocol):
    """The part of redis-py's (untyped) Connection the library uses."""

    def connect(self) -> None: ...
    def send_command(self, *args: Any, check_health: bool = True) -> None: ...
    def send_packed_command(
        self, command: list[bytes], check_health: bool = True
    ) -> None: ...
    def read_response(self, disable_decoding: bool = False, *, timeout: Any = ...) -> Any: ...
    def can_read(self, timeout: float = 0) -> bool: ...
    def disconnect(self, *args: Any) -> None: ...


def peer(conn: RawConnection) -> Optional[tuple[str, int]]:
    """The server a connection reached (under Sentinel: the master it was told of)."""
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    return (host, port) if isinstance(host, str) and isinstance(port, int) else None


def open_connection(cls: type[Any], kwargs: dict[str, Any]) -> RawConnection:
    conn = cast(RawConnection, cls(**kwargs))
    conn.connect()
    return conn


def send(conn: RawConnection, args: list[Any]) -> None:
    conn.send_command(*args, check_health=False)


def send_packed(conn: RawConnection, packed: list[bytes]) -> None:
    """A command already in RESP (``packed``: its pieces, sent as they are)."""
    conn.send_packed_command(packed, check_health=False)


def read(conn: RawConnection, timeout: Optional[float]) -> Any:
    """One reply; ``timeout`` None waits as long as it takes."""
    return conn.read_response(timeout=timeout)


def close_connection(conn: RawConnection) -> None:
    conn.disconnect()


def closed_by_server(conn: RawConnection, mutex: threading.Lock) -> bool:
    """Whether an idle connection was closed by the server: readable with nothing asked (EOF).
    A connection in use (``mutex`` held) is not looked at: its command's outcome tells."""
    if not mutex.acquire(blocking=False):
        return False
    try:
        if getattr(conn, "_sock", None) is None:
            return True
        return conn.can_read(timeout=0)
    finally:
        mutex.release()


def is_closed(conn: RawConnection) -> bool:
    """Whether ``conn`` was disconnected (redis-py drops its socket then)."""
    return getattr(conn, "_sock", None) is None


def closed_now(conn: RawConnection) -> bool:
    """Whether an idle connection the caller holds (nothing asked on it) is closed: by this
    side, or by the server (readable with nothing asked: the end of the stream)."""
    if getattr(conn, "_sock", None) is None:
        return True
    try:
        return conn.can_read(timeout=0)
    except (*IO_ERRORS, ValueError, AttributeError):
        return True


def new_pool(cls: type[Any], kwargs: dict[str, Any]) -> ConnectionPool:
    return ConnectionPool(connection_class=cls, **kwargs)


def pool_get(pool: ConnectionPool) -> RawConnection:
    try:
        return cast(RawConnection, pool.get_connection())
    except (ValueError, AttributeError) as e:
        # Closed from another thread during its connect's handshake (the client's close(), the
        # interruption of connections to a replaced master): redis-py then fails on its closed
        # socket buffer ("I/O operation on closed file"). The connection's loss, as any other.
        raise RedisConnectionError(f"the connection closed under its handshake: {e}") from e


def pool_put(pool: ConnectionPool, conn: RawConnection) -> None:
    pool.release(cast(Any, conn))


def pool_close(pool: ConnectionPool) -> None:
    pool.disconnect()


def pool_in_use(pool: ConnectionPool) -> list[RawConnection]:
    """The pool's connections taken out now: a command on each, or its connect and handshake
    (redis-py connects a connection after taking it out). A copy, made under the pool's lock."""
    return list(cast(Any, pool)._get_in_use_connections())


#: What ``Subscriber.read`` returns once the subscriber is closed.
CLOSED: Any = object()


class Subscriber:
    """A pub/sub connection read by one thread. ``post`` (from any thread) queues a
    (un)subscription, which the reading thread sends; ``read`` returns the next reply, or
    ``CLOSED`` once ``close`` (from any thread) was called. Only the reading thread touches the
    connection while it reads."""

    def __init__(self, conn: RawConnection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._pending: list[tuple[str, bytes]] = []
        self._closed = False
        self._kicked = False
        #: The server this connection reached (host, port).
        self.address = peer(conn)
        #: The (un)subscriptions sent, oldest first, until their reply is read.
        self._sent: collections.deque[tuple[str, bytes]] = collections.deque()
        self._reading = False
        self._shut_down = False
        self._wake_r, self._wake_w = socket.socketpair()

    def post(self, op: str, channel: bytes) -> None:
        with self._lock:
            self._pending.append((op, channel))
        self._wake()

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

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def kick(self) -> None:
        """Breaks the connection from another thread: a ``read`` waiting meanwhile raises a
        ConnectionError, as for a connection the server closed (the reader connects again)."""
        with self._lock:
            self._kicked = True
        self._wake()

    def read(self, timeout: Optional[float] = None) -> Any:
        """The next reply (``timeout`` None: as long as it takes; past it, a TimeoutError)."""
        with self._lock:
            if self._closed:
                return CLOSED
            self._reading = True
        until = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return CLOSED
                    if self._kicked:
                        raise RedisConnectionError("left for the new master")
                    ops, self._pending = self._pending, []
                for op, channel in ops:
                    self._sent.append((op, channel))
                    send(self._conn, [op, channel])
                if self._conn.can_read(timeout=0):
                    return self._conn.read_response()
                sock = getattr(self._conn, "_sock", None)
                if sock is None:
                    raise RedisConnectionError("the pub/sub connection closed")
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    raise RedisTimeoutError("no reply on the pub/sub connection")
                ready, _, _ = select.select([sock, self._wake_r], [], [], left)
                if self._wake_r in ready:
                    self._wake_r.recv(4096)
        finally:
            with self._lock:
                self._reading = False
                closed = self._closed
            if closed:
                self._shut()

    def close(self) -> None:
        """Ends the reads; a ``read`` waiting meanwhile (in another thread) returns ``CLOSED``."""
        with self._lock:
            self._closed = True
            reading = self._reading
        if reading:
            self._wake()  # the reading thread closes the connection
        else:
            self._shut()

    def _shut(self) -> None:
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        self._conn.disconnect()
        self._wake_r.close()
        self._wake_w.close()


def cluster_node(cluster: RedisCluster, slot: int) -> tuple[str, type[Any], dict[str, Any]]:
    """The master serving ``slot``: its name, connection class and connection settings."""
    node = cluster.nodes_manager.get_node_from_slot(slot)
    pool = node.redis_connection.connection_pool
    return node.name, pool.connection_class, pool.connection_kwargs


def cluster_node_known(cluster: RedisCluster, slot: int) -> Optional[str]:
    """The name of the master serving ``slot`` in the slot map as loaded, or None (no map yet,
    the slot not covered): never a request."""
    try:
        return str(cluster.nodes_manager.get_node_from_slot(slot).name)
    except Exception:  # noqa: BLE001 - not known: the caller's default
        return None


def cluster_node_at(
    cluster: RedisCluster, host: str, port: int
) -> Optional[tuple[str, type[Any], dict[str, Any]]]:
    node = cluster.nodes_manager.get_node(host=host, port=port)
    if node is None or node.redis_connection is None:
        return None
    pool = node.redis_connection.connection_pool
    return node.name, pool.connection_class, pool.connection_kwargs


def cluster_refresh(cluster: RedisCluster) -> None:
    cluster.nodes_manager.initialize()


class EpochSentinel(Sentinel):
    """redis-py's Sentinel manager, whose master is the one named with the highest configuration
    epoch by the Sentinels that answer, never one named with a lower epoch than the master it
    follows (``_masters.py``). redis-py's takes the first Sentinel whose answer looks healthy:
    one that has not heard of a failover yet names the old master. Every Sentinel is asked at
    once (a thread each but the first); one that fails or times out is left out."""

    def __init__(self, sentinels: list[tuple[str, int]], sentinel_kwargs: dict[str, Any]) -> None:
        # redis-py's Sentinel is untyped.
        super().__init__(sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        self.followed = FollowedMasters()

    def discover_master(self, service_name: str) -> Address:
        sentinels = list(self.sentinels)
        answers: list[object] = [None] * len(sentinels)

        done = threading.Condition()
        counts = {"answered": 0, "finished": 0}

        def ask(i: int) -> None:
            try:
                state = sentinels[i].execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL MASTER", service_name
                )
                address = sentinels[i].execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL GET-MASTER-ADDR-BY-NAME", service_name
                )
                answer: object = with_current_address(state, address)
            except (RedisError, OSError) as e:
                answer = e
            with done:
                answers[i] = answer
                counts["answered"] += isinstance(answer, dict)
                counts["finished"] += 1
                done.notify_all()

        for i in range(len(sentinels)):
            threading.Thread(target=ask, args=(i,), name="redis-lock-sentinel", daemon=True).start()
        with done:
            done.wait_for(
                lambda: counts["finished"] == len(sentinels)
                or counts["answered"] >= majority(len(sentinels))
            )
            # A majority answered: the others get a moment more, not the whole timeout (a
            # paused Sentinel would otherwise slow every lookup, each failover's included).
            done.wait_for(lambda: counts["finished"] == len(sentinels), timeout=STRAGGLER_GRACE)
            heard = list(answers)  # a copy: a late answer goes on being written into answers
        return self.followed.pick(
            service_name,
            list(zip(sentinels, heard)),
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
    master = manager.master_for(service_name, **connection_kwargs)  # type: ignore[no-untyped-call]
    return manager, master


def ask_master(pool: Any) -> None:
    """Asks the Sentinels for the master now (redis-py's Sentinel pool remembers it)."""
    pool.get_master_address()


def interrupt(conn: RawConnection) -> None:
    """Breaks ``conn`` under a thread reading from it: that read ends with a ConnectionError (as
    for a connection the server closed), and its caller closes the connection."""
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
