"""The client: the library's connections to one server or one Redis Cluster, and the handles
it makes."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Optional, Sequence, Union, cast

import redis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from .. import _fork
from .._commands import KeySet, multi_keys
from .._common import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_FAILOVER_TIMEOUT,
    DEFAULT_LEASE,
    DEFAULT_REPLICAS_TIMEOUT,
    RETRIES,
    Backend,
    Key,
    Kind,
    LockConnectionError,
    LockError,
    LostCallback,
    NoPermission,
    Renewal,
    new_client_id,
    to_bytes,
)
from .._connect import Redirected
from ._backend import (
    ConnectionPool,
    DefaultConnection,
    Mutex,
    Redis,
    RedisCluster,
    SentinelConnectionPool,
    Watchdog,
    cluster_node,
    cluster_node_at,
    cluster_node_known,
    cluster_refresh,
    peer,
    sentinel_master,
    sleep,
    spawn,
)
from ._connection import Connector, OwnConnection
from ._election import AsyncElection
from ._hold import Hold
from ._lock import AsyncLock, AsyncMultiLock
from ._signals import SignalHub, Watcher
from ._tickets import TicketDesk


class _Node:
    """One server (a cluster: one master): its connections and its signal listener."""

    def __init__(self, client: AsyncLockClient, connector: Connector, sharded: bool) -> None:
        self.commands = connector
        self.signals = (
            SignalHub(connector, sharded, client._slot_left) if client._lost_signal else None
        )
        # In a cluster the desk groups its tickets by slot, and routes LOCK.CANCEL through the
        # client (by the ticket's name, following MOVED and ASK).
        self.tickets = (
            TicketDesk(connector, client if sharded else None) if client._tickets else None
        )

    async def close(self) -> None:
        if self.signals is not None:
            await self.signals.close()
        if self.tickets is not None:
            await self.tickets.close()
        await self.commands.close()


class _Route:
    """How one hold reaches its keys' server: commands through the client (following MOVED and
    ASK), the signal listener of the node that serves the keys."""

    def __init__(self, client: AsyncLockClient, key: bytes) -> None:
        self._client = client
        self._key = key
        self.hub: Optional[SignalHub] = None

    async def query(
        self, args: list[Any], then: Optional[list[Any]] = None, then_timeout: float = 0.0
    ) -> Any:
        return await self._client._query(self._key, args, then, then_timeout)

    async def watch(self, hold: Hold) -> None:
        node = await self._client._node_for(self._key)
        # The redislock library publishes no lost-hold signal: nothing to listen to there.
        if await node.commands.backend() is Backend.FUNCTIONS:
            return
        self.hub = node.signals
        if self.hub is not None:
            await self.hub.watch(hold)

    def unwatch(self, hold: Hold) -> None:
        if self.hub is not None:
            self.hub.unwatch(hold)

    async def relocate(self, hold: Hold) -> None:
        await self._client._relocate(self, hold)

    def where(self) -> Optional[str]:
        return self._client._known_node(self._key)

    async def replaced(self, own: OwnConnection) -> bool:
        try:
            node = await self._client._node_for(self._key)
        except LockError:  # no node serves the key now: not known to be replaced
            return False
        master = await node.commands.current_master()
        reached = peer(own.conn)
        return master is not None and reached is not None and master != reached


class AsyncLockClient:
    """Makes lock handles on one server or one Redis Cluster, with the library's own
    connections to it.

    ``AsyncLockClient(redis.asyncio.Redis(...))``,
    ``AsyncLockClient(redis.asyncio.cluster.RedisCluster(...))``,
    ``AsyncLockClient.from_url("redis://...")`` or ``AsyncLockClient(host=..., port=...)``: the
    address, credentials, database and TLS are taken from what is given; the library's
    connections use their own read timeout (``command_timeout``, default 2 s) and no redis-py
    retries. Options:

    - ``command_timeout`` (seconds, default 2): how long an ordinary command may take.
    - ``lost_signal`` (default None: wherever the server has it): one pub/sub connection per
      server hears the server's lost-hold signal, so that a hold ended from outside
      (``LOCK.FORCERELEASE``, ``DEL``, an EPHEMERAL connection's close, a flush) is reported at
      once, not at the next renewal. The ``redislock`` Functions library has none: there a
      loss is seen by the next renewal, and ``lost_signal=True`` makes each acquire raise
      ``NotSupported``. False: no listener anywhere.
    - ``load_functions`` (default False): on a server without the module whose ``redislock``
      Functions library is missing or older than this package's, load the package's copy
      (``FUNCTION LOAD REPLACE``, which needs ``+function|load``) instead of raising
      ``NotSupported`` at the first command.
    - ``wait_with_tickets`` (default True): an acquire that waits waits with a ticket
      (``... WAIT ms TICKET``; an EPHEMERAL one asked on the connection its hold will be bound
      to): every such wait of the client on a server shares one asking and one waiting
      connection (in a cluster, per master: one asking connection and
      one waiting connection per slot with a wait in progress), instead of a connection each,
      and costs the server under 1 KB instead of about 36 KB. False: each wait blocks on a
      connection of its own. On the ``redislock`` Functions library too (its FIFO line; the
      acquire is asked again within the second the library names); False there: each wait
      listens to the unlock message on a connection of its own and asks again (no line).

    Connections, per server (in a cluster: per master, each command going to the master that
    serves its key, following MOVED and ASK): a pool for ordinary commands (acquire without
    waiting, renewals, releases, reads), for the acquires that wait two connections shared by all
    (``wait_with_tickets``; named ``...:tickets-ask`` and ``...:tickets-wait``, closed 5 s after
    the last wait; in a cluster a waiting connection per slot with a wait in progress) or else a fresh connection for each acquire that waits, one
    connection owned by each EPHEMERAL hold, and (``lost_signal=True``) one pub/sub connection
    (``SSUBSCRIBE`` in a cluster). Each is named (``CLIENT SETNAME``) ``redis-lock-client``, or
    the name the application gave its own connections; those of a wait or of an EPHEMERAL hold
    add ``:<owner>``, so that ``CLIENT LIST`` shows which connection holds an EPHEMERAL hold.

    Each client has a random id; each handle it makes is its own owner ``<client id>:<n>``.
    """

    def __init__(
        self,
        redis_client: Optional[Union[Redis, ConnectionPool, RedisCluster]] = None,
        *,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        lost_signal: Optional[bool] = None,
        failover_timeout: Optional[float] = None,
        wait_with_tickets: bool = True,
        load_functions: bool = False,
        **connection_kwargs: Any,
    ) -> None:
        if command_timeout <= 0:
            raise ValueError("command_timeout must be positive")
        if failover_timeout is not None and failover_timeout < 0:
            raise ValueError("failover_timeout must not be negative")
        self.command_timeout = command_timeout
        self._lost_signal = lost_signal is not False
        #: Asked for by name (``lost_signal=True``): refused where the backend has none.
        self._lost_signal_asked = lost_signal is True
        self._load_functions = load_functions
        self._tickets = wait_with_tickets
        self._extra = connection_kwargs
        self._cluster: Optional[RedisCluster] = None
        self._nodes: dict[str, _Node] = {}
        self._nodes_lock = threading.Lock()
        self._refreshing = Mutex()
        self._refreshed_at = 0.0
        # slot -> (host, port) a MOVED named: where the slot is served now, even while the
        # slot map's source has not heard of the move (the nodes learn a failover one after
        # another). A wrong one is mended by the MOVED its node answers.
        self._moved_to: dict[int, tuple[str, int]] = {}
        self._single: Optional[_Node] = None
        self._sentinel: Optional[tuple[Any, Any]] = None
        self._pool: Optional[ConnectionPool] = None
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
                sentinel = isinstance(pool, SentinelConnectionPool)
                # A Sentinel pool's connections refer to it weakly: it lives as long as we do.
                self._pool = pool
            else:
                cls = DefaultConnection
                kwargs = connection_kwargs
                sentinel = False
            connector = Connector(cls, kwargs, command_timeout, load_functions)
            self._single = _Node(self, connector, sharded=False)
        #: How long an acquire whose connection broke is sent again while no master answers
        #: (a failover under Sentinel); 0: twice, at once, as anywhere else.
        self.failover_timeout = (
            failover_timeout
            if failover_timeout is not None
            else DEFAULT_FAILOVER_TIMEOUT if self._single is not None and sentinel else 0.0
        )
        #: Renews every hold of the client (a thread and a few workers; asyncio: a task each).
        self._watchdog = Watchdog()
        self.id = new_client_id()
        self._pid = os.getpid()
        self._next = 0
        self._next_lock = threading.Lock()
        _fork.register(self)

    def after_fork(self) -> None:
        """In a forked child: a new id, so that the child's owners are not the parent's."""
        self._next_lock = threading.Lock()
        self._nodes_lock = threading.Lock()
        self._refreshing = Mutex()
        self.id, self._pid = new_client_id(), os.getpid()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncLockClient:
        """A client on ``url`` (``redis://``, ``rediss://``, ``unix://``; the database is the
        URL's path, ``redis://host:6379/1``); ``command_timeout``, ``lost_signal``,
        ``wait_with_tickets`` and ``load_functions`` as for the constructor, any other keyword goes to redis-py's connection pool."""
        command_timeout = kwargs.pop("command_timeout", DEFAULT_COMMAND_TIMEOUT)
        lost_signal = kwargs.pop("lost_signal", None)
        wait_with_tickets = kwargs.pop("wait_with_tickets", True)
        load_functions = kwargs.pop("load_functions", False)
        return cls(
            ConnectionPool.from_url(url, **kwargs),
            command_timeout=command_timeout,
            lost_signal=lost_signal,
            wait_with_tickets=wait_with_tickets,
            load_functions=load_functions,
        )

    @classmethod
    def from_sentinel(
        cls,
        sentinels: Sequence[tuple[str, int]],
        service_name: str,
        *,
        sentinel_kwargs: Optional[dict[str, Any]] = None,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        lost_signal: Optional[bool] = None,
        failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT,
        wait_with_tickets: bool = True,
        load_functions: bool = False,
        **connection_kwargs: Any,
    ) -> AsyncLockClient:
        """A client on the master Sentinel names for ``service_name`` (as redis-py's
        ``Sentinel(sentinels).master_for(service_name)``, but the master followed is the one
        named with the highest configuration epoch by any Sentinel, never one named with a
        lower epoch than the master followed: a Sentinel that has not heard of a failover yet
        does not send the client back), following failovers: every connection the library opens asks the Sentinels for the master first, so commands,
        waits, EPHEMERAL holds and the signal listener reach the new master once the old
        one's connections broke (a demoted master's are closed by Sentinel; its READONLY
        answers count as broken). ``sentinels``: ``[(host, port), ...]``;
        ``sentinel_kwargs``: the connections to the Sentinels (default: ``command_timeout``
        for their timeouts); ``failover_timeout`` (default 30 s): how long an acquire (not
        EPHEMERAL) whose connection broke is sent again while no master answers. Other
        keywords (``password``, ``db``, ``ssl``, ``client_name``, ...) are the masters'."""
        if sentinel_kwargs is None:
            sentinel_kwargs = {
                "socket_timeout": command_timeout,
                "socket_connect_timeout": command_timeout,
            }
        manager, master = sentinel_master(
            list(sentinels), service_name, sentinel_kwargs, connection_kwargs
        )
        client = cls(
            master,
            command_timeout=command_timeout,
            lost_signal=lost_signal,
            failover_timeout=failover_timeout,
            wait_with_tickets=wait_with_tickets,
            load_functions=load_functions,
        )
        client._sentinel = (manager, master)  # the pool's proxy refers to them weakly
        return client

    def _node_named(self, name: str, cls: type[Any], kwargs: dict[str, Any]) -> _Node:
        with self._nodes_lock:
            known = self._nodes.get(name)
            if known is None:
                connector = Connector(
                    cls, {**kwargs, **self._extra}, self.command_timeout, self._load_functions
                )
                known = self._nodes[name] = _Node(self, connector, sharded=True)
            return known

    async def _node_for(self, key: bytes) -> _Node:
        """The server that serves ``key`` (standalone: the one server): the node the last MOVED
        for its slot named, else the slot map's."""
        if self._single is not None:
            return self._single
        cluster = cast(RedisCluster, self._cluster)
        slot = key_slot(key)
        moved_to = self._moved_to.get(slot)
        if moved_to is not None:
            named = await self._node_at(*moved_to)
            if named is not None:
                return named
            self._moved_to.pop(slot, None)
        try:
            name, cls, kwargs = await cluster_node(cluster, slot)
        except (redis.RedisError, RedisClusterException) as e:
            raise LockConnectionError(f"no node serves {key!r}: {e}") from e
        return self._node_named(name, cls, kwargs)

    def _known_node(self, key: bytes) -> Optional[str]:
        """The name (``host:port``) of the master serving ``key`` by what the client knows now
        (the last MOVED for its slot, else the slot map), never asking a server; None
        standalone, or with no slot map yet."""
        if self._cluster is None:
            return None
        slot = key_slot(key)
        moved_to = self._moved_to.get(slot)
        if moved_to is not None:
            return f"{moved_to[0]}:{moved_to[1]}"
        return cluster_node_known(self._cluster, slot)

    async def _node_at(self, host: str, port: int) -> Optional[_Node]:
        """The cluster master at ``host``:``port`` (an ASK's target), if the slot map knows it."""
        if self._cluster is None:
            return None
        found = await cluster_node_at(self._cluster, host, port)
        if found is None:
            await self._refresh()
            found = await cluster_node_at(self._cluster, host, port)
        return None if found is None else self._node_named(*found)

    async def _moved(self, moved: Redirected) -> None:
        """A MOVED reply: its slot is sent where it names from now on, and the slot map is
        loaded again."""
        if moved.slot is not None and moved.host is not None and moved.port is not None:
            self._moved_to[moved.slot] = (moved.host, moved.port)
        await self._refresh()

    async def _refresh(self) -> None:
        """The slot map is stale (a MOVED, a slot that left a node: a resharding, a failover):
        load it again. Many callers at once (every hold of a moved slot) load it once: one that waited while
        another load began after it asked does not load it again (one that began before may
        have read the map before the move this caller saw)."""
        if self._cluster is None:
            return
        asked = time.monotonic()
        async with self._refreshing:
            if self._refreshed_at > asked:
                return  # a load that began after this caller saw the MOVED
            began = time.monotonic()
            try:
                await cluster_refresh(self._cluster)
            except (redis.RedisError, RedisClusterException) as e:
                raise LockConnectionError(f"cluster slot map: {e}") from e
            finally:
                self._refreshed_at = began

    async def _redirect(self, e: Redirected, asked: bool) -> Optional[Redirected]:
        """What follows a MOVED or an ASK (``e``) answered to a command about a key, for every
        path that sends one (the pooled commands of ``_query``, the acquires that wait or are
        EPHEMERAL on connections of their own; each counts its tries itself): the ASK to follow
        (the command goes once to the node it names, after ASKING: ``_node_to``), or None: the
        command goes to the node serving the key. A MOVED names that node from now on (noted,
        and the slot map loaded again). An ASK answered to a command sent after ASKING
        (``asked``: the node the last ASK named does not take it either), or naming no node,
        has the slot map loaded again."""
        if not e.asking:
            await self._moved(e)
            return None
        if asked or e.host is None or e.port is None:
            await self._refresh()
            return None
        return e

    async def _node_to(self, key: bytes, ask: Optional[Redirected]) -> tuple[_Node, bool]:
        """Where the next command about ``key`` goes, and whether after ASKING: the node an ASK
        (``ask``) named, when the slot map knows it (loaded again if not); else the node that
        serves ``key``."""
        if ask is not None and ask.host is not None and ask.port is not None:
            named = await self._node_at(ask.host, ask.port)
            if named is not None:
                return named, True
        return await self._node_for(key), False

    async def _query(
        self,
        key: bytes,
        args: list[Any],
        then: Optional[list[Any]] = None,
        then_timeout: float = 0.0,
    ) -> Any:
        """One command on a pooled connection to the key's server. In a cluster, a MOVED
        sends it again to the node named (and reloads the slot map); an ASK (the slot is being
        moved) sends it once to the node named, after ASKING (``_redirect``); up to twice, an
        ASK and its send counting as one. ``then``: a second command on the same connection
        (see ``Connector.query``)."""
        attempt = 0
        ask: Optional[Redirected] = None
        while True:
            node, asking = await self._node_to(key, ask)
            try:
                return await node.commands.query(
                    args, asking=asking, then=then, then_timeout=then_timeout
                )
            except Redirected as e:
                if self._cluster is None:
                    raise
                if not asking:  # (the send after an ASK was counted with the ASK)
                    if attempt >= RETRIES:
                        raise
                    attempt += 1
                ask = await self._redirect(e, asked=asking)

    def _route(self, key: bytes) -> _Route:
        return _Route(self, key)

    def _slot_left(self, hub: SignalHub, watchers: list[Watcher]) -> None:
        """A node dropped shard channels by itself: their slot left it. Each hold listened to
        there is listened to where its keys are now."""
        for watcher in watchers:
            if isinstance(watcher, Hold) and isinstance(watcher.route, _Route):
                spawn("redis-lock-relocate", self._relocate, watcher.route, watcher, hub)

    async def _relocate(
        self, route: _Route, hold: Hold, dropped_by: Optional[SignalHub] = None
    ) -> None:
        """Listens to ``hold``'s channels on the node that serves its keys now. In a cluster
        whose slot map does not show the move yet (the nodes learn it one after another), the
        map is loaded again, with a growing pause, for up to about 5 s."""
        old = route.hub if dropped_by is None else dropped_by
        if dropped_by is not None:
            self._moved_to.clear()  # a slot left a node a MOVED may have named
        delay = 0.05
        while True:
            try:
                await self._refresh()
                hub = (await self._node_for(route._key)).signals
            except LockConnectionError:
                hub = old
            if hub is not old or self._cluster is None or delay > 2.0:
                break
            await sleep(delay)
            delay *= 2
        if hub is None or not hold.active:
            return
        if route.hub is hub:
            hub.resubscribe(hold)
            return
        if route.hub is not None:
            route.hub.unwatch(hold)
        route.hub = hub
        try:
            await hub.watch(hold)
        except NoPermission as e:
            # After the guard was handed out, nobody waits for this: the watchdog covers it.
            logging.getLogger("redis_lock_client").warning("%s", e)

    def _all_nodes(self) -> list[_Node]:
        if self._single is not None:
            return [self._single]
        with self._nodes_lock:
            return list(self._nodes.values())

    async def aclose(self) -> None:
        """Stops the signal listeners and closes pooled connections. Holds keep their own."""
        for node in self._all_nodes():
            await node.close()

    async def __aenter__(self) -> AsyncLockClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _owner(self) -> bytes:
        if self._pid != os.getpid():
            self.after_fork()
        with self._next_lock:
            self._next += 1
            return f"{self.id}:{self._next}".encode()

    async def backend(self, key: Optional[Key] = None) -> Backend:
        """What serves the locks (``Backend.MODULE`` or ``Backend.FUNCTIONS``; its
        ``supports_ephemeral`` says whether holds can be EPHEMERAL), found at the first
        command to the server, or now (this asks it). In a cluster, of the master that serves
        ``key`` (required there). Raises ``NotSupported`` when the server has neither (and
        ``load_functions`` is off), as every command to it would."""
        if key is None and self._cluster is not None:
            raise ValueError("in a cluster, name a key: each master is asked on its own")
        node = await self._node_for(b"" if key is None else to_bytes(key))
        return await node.commands.backend()

    def _db(self) -> int:
        """The database of the client's holds (0 in a cluster)."""
        return self._single.commands.db if self._single is not None else 0

    def lock(self, key: Key, **options: Any) -> AsyncLock:
        """A handle on the exclusive lock of ``key`` (also the write side of its read-write
        lock). Options: see :class:`AsyncLock`."""
        return AsyncLock(self, to_bytes(key), Kind.EXCLUSIVE, 0, **options)

    def read_lock(self, key: Key, **options: Any) -> AsyncLock:
        """A handle on a shared (read) hold of ``key``. Options: see :class:`AsyncLock`."""
        return AsyncLock(self, to_bytes(key), Kind.SHARED, 0, **options)

    def semaphore(self, key: Key, limit: int, **options: Any) -> AsyncLock:
        """A handle on one permit of the counting semaphore ``key`` with ``limit`` permits
        (1 to 1,000, the server's cap). Options: see :class:`AsyncLock`."""
        if not 1 <= limit <= 1000:
            raise ValueError("limit must be between 1 and 1000")
        return AsyncLock(self, to_bytes(key), Kind.PERMIT, limit, **options)

    def multi_lock(
        self, keys: Sequence[Key], *, shared: bool = False, **options: Any
    ) -> AsyncMultiLock:
        """A handle on several keys held together, all or nothing (``LOCK.MACQUIRE``): exclusive
        holds, or shared (read) holds with ``shared=True``. 1 to 64 distinct keys; in a cluster
        all in one slot (use a hash tag: ``{order:42}:a``, ``{order:42}:b``). Options: see
        :class:`AsyncLock`."""
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
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        aof: bool = False,
    ) -> AsyncElection:
        """A handle on the election ``key`` (``LOCK.CAMPAIGN``/``PROCLAIM``/``LEADER``), as
        ``candidate`` (default: a name of its own, ``<client id>:<n>``), with a lease of 30 s by
        default, EPHEMERAL by default; ``replicas``, ``replicas_timeout`` and ``aof`` as for a
        lock. See :class:`AsyncElection`."""
        return AsyncElection(
            self,
            to_bytes(key),
            None if candidate is None else to_bytes(candidate),
            lease=lease,
            renewal=renewal,
            ephemeral=ephemeral,
            on_lost=on_lost,
            replicas=replicas,
            replicas_timeout=replicas_timeout,
            aof=aof,
        )
