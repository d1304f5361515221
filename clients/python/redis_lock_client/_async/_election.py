"""Leader election (etcd's ``concurrency.Election`` on LOCK.CAMPAIGN, LOCK.PROCLAIM,
LOCK.LEADER): a campaign is a hold like a lock's; an observer follows the leader channel."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional

from redis.exceptions import ResponseError

from .._commands import KeySet, Leader, campaign, leader, parse_leader, proclaim, proclaimed
from .._common import (
    Arg,
    Key,
    Kind,
    LockConnectionError,
    LockError,
    LockTimeout,
    NotSupported,
    Release,
    to_bytes,
)
from .._connect import Redirected
from .._leaders import LeaderFeed
from .._messages import leader_channel, parse_leader_message
from ._backend import CLOSED, IO_ERRORS, Cancelled, Subscriber, sleep, spawn
from ._connection import FOLLOW_PERIOD, Connector
from ._hold import Hold
from ._lock import _AsyncGuard, _AsyncHandle

if TYPE_CHECKING:
    from ._client import AsyncLockClient


class _AsyncCandidate(_AsyncHandle["AsyncLeadership"]):
    """The hold of a campaign: a lock handle whose acquire is ``LOCK.CAMPAIGN`` (same
    watchdog, lost signal, EPHEMERAL connection, waits and retries), and whose re-entry is
    never counted (campaigning again while leading returns the same leadership)."""

    _counts_reentry = False

    def __init__(self, election: AsyncElection, **options: Any) -> None:
        keys = KeySet((election.key,), multi=False)
        super().__init__(election.client, keys, Kind.EXCLUSIVE, 0, **options)
        self.election = election
        self._leadership: Optional[AsyncLeadership] = None

    def _args(
        self,
        waits: bool,
        wait: Optional[float],
        value: Optional[bytes],
        ephemeral: Optional[bool] = None,
    ) -> list[Any]:
        bound = self.ephemeral if ephemeral is None else ephemeral
        return campaign(self.election.key, self.owner, self.lease, bound, wait, waits, value)

    def _guard(self, hold: Hold) -> AsyncLeadership:
        current = self._leadership
        if current is None or current._hold is not hold:
            current = self._leadership = AsyncLeadership(self, hold)
        return current


class AsyncElection:
    """A handle on one election key, for one candidate (``client.election(key, candidate)``):
    campaign for it, read its leader, observe its leaders.

    - ``campaign(value=None, timeout=None)`` waits in the server's FIFO queue until this
      candidate leads and returns its :class:`AsyncLeadership` (the epoch, ``lost``,
      ``proclaim``, ``resign``); ``LockTimeout`` when ``timeout`` (seconds; 0 = one attempt)
      passes first. The leadership is a hold like a lock's: its lease (default 30 s) is renewed
      by the watchdog every ``lease / 3``, and it is reported lost as any hold is.
    - ``ephemeral`` (default True): the leadership is bound to a connection the leadership owns,
      so a crashed or killed process stops leading at once, not at its lease end.
    - ``leader()`` reads who leads now; ``observe()`` follows every change.

    The candidate is its name: two handles (or processes) campaigning under one name are one
    candidate to the server, and both would think they lead. Leave ``candidate`` unset (each
    handle gets a name of its own) or give each process its own.
    """

    def __init__(
        self, client: AsyncLockClient, key: bytes, candidate: Optional[bytes], **options: Any
    ) -> None:
        self.client = client
        self.key = key
        self._candidate = _AsyncCandidate(self, owner=candidate, **options)

    @property
    def candidate(self) -> bytes:
        """The name this handle campaigns under (``LOCK.LEADER`` shows it while it leads)."""
        return self._candidate.owner

    async def campaign(
        self, value: Optional[Key] = None, timeout: Optional[float] = None
    ) -> AsyncLeadership:
        """Waits until this candidate leads (``LOCK.CAMPAIGN ... WAIT``: EPHEMERAL, on a
        connection of its own; else with a ticket, as a lock's wait) and returns its leadership; with ``value``, proclaims it with the election. Raises
        ``LockTimeout`` when ``timeout`` passes (0: one attempt, no wait). Campaigning again
        while leading returns the same leadership (the epoch is kept; ``value`` is proclaimed).
        """
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must not be negative")
        data = None if value is None else to_bytes(value)
        leadership = await self._candidate._acquire(timeout != 0, timeout, data)
        if leadership is None:
            raise LockTimeout(timeout or 0.0)
        return leadership

    async def leader(self) -> Optional[Leader]:
        """Who leads now (``LOCK.LEADER``): ``Leader(candidate, epoch, value)``, or None."""
        return parse_leader(await self.client._query(self.key, leader(self.key)))

    def observe(self) -> AsyncObserver:
        """Follows the key's leaders: an iterator of :class:`Leader`, in order (see
        :class:`AsyncObserver`)."""
        return AsyncObserver(self.client, self.key)


class AsyncLeadership(_AsyncGuard):
    """This candidate leads: its ``epoch`` (the fencing token of its hold), ``lost`` (set when
    it is deposed: lease ended, connection closed, forced out), ``proclaim(value)``,
    ``resign()``. ``async with`` resigns on exit."""

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

    async def proclaim(self, value: Key) -> bool:
        """Publishes ``value`` (at most 4096 bytes) for observers (``LOCK.PROCLAIM``): True, or
        False when this leadership is over: resigned, lost, past its local deadline (it is then
        reported lost, ``UNREACHABLE``), refused by the server because the candidate no longer
        leads in this epoch (reported lost, ``HOLD_GONE``), or its EPHEMERAL connection closed
        (reported lost once a read finds the hold gone: the server ends it with its
        connection). A deposed leader's proclamation is never published. Raises
        ``LockConnectionError`` only when no answer came and the leadership may stand (a
        timeout on a live connection, a server that still holds it after the command
        timeout)."""
        hold = self._hold
        if self._released or hold.past_deadline():
            return False
        try:
            reply = await hold.send(proclaim(hold.key, hold.owner, hold.token, to_bytes(value)))
        except LockConnectionError:
            if hold.own is None:
                raise
            # The server ends the hold with its connection: reported lost once a read finds it
            # gone (then the leadership is over: False); until then it may stand (the error,
            # not a false "over").
            if await hold.closed_outcome():
                return False
            raise
        if proclaimed(reply):
            return True
        hold.refused()
        return False

    async def execute(self, *command: Arg) -> Any:
        """Runs ``command`` only while this candidate leads in this epoch, checked on the server
        in the same step (``LOCK.GUARD key candidate epoch command...``), and returns its reply:
        a write of a deposed leader never lands. As :meth:`AsyncLockGuard.execute`: ``Fenced``
        (and the leadership reported lost) when the server refused it."""
        hold = self._hold
        return await self._fenced(hold.key, hold.token, command)

    async def resign(self) -> Release:
        """Stops leading (``LOCK.RELEASE``): the next candidate in the queue is elected at once.
        As ``release()``: raises ``NotHeld`` if the leadership was lost before."""
        return await self.release()

    def __repr__(self) -> str:
        return (
            f"AsyncLeadership(key={self.key!r}, candidate={self.candidate!r}, "
            f"epoch={self.epoch}, lost={self.lost_reason})"
        )


class AsyncObserver:
    """The leaders of one election key, in the order they led: an iterator of :class:`Leader`
    (``election.observe()``).

    It subscribes to the key's leader channel on a connection of its own (``SSUBSCRIBE`` on the
    key's master in a cluster), then reads ``LOCK.LEADER`` and yields the current leader. Each
    message about its own database and key (an election, a proclamation) makes it read
    ``LOCK.LEADER`` again, one round trip on the client's connections, and it yields what the
    read answers when that changed: a newly elected candidate (``value`` None until it
    proclaims one; a candidate elected with a value comes with it), a new value. A message is
    never believed by itself: anyone allowed to publish on the channel can send one, so the
    observer yields only leaders the server names. It never yields an epoch below the last it
    yielded, nor the same leader twice in a row. When the connection breaks (or a read fails) it
    connects again, subscribes, and reads ``LOCK.LEADER`` again (pub/sub is at most once: what
    was published meanwhile is gone, the read tells the current leader). The end of a
    leadership is not announced: the next election is.

    Reading waits for the next leader; on a server with the ``redislock`` Functions library
    (no elections) it raises ``NotSupported``. Closing it (from any thread in the sync library; in
    asyncio, cancel a task waiting in it to stop it at once) ends the iteration; ``with``
    closes it.
    """

    def __init__(self, client: AsyncLockClient, key: bytes) -> None:
        self._client = client
        self._key = key
        self._channel = leader_channel(key)
        self._subscribe = "SSUBSCRIBE" if client._cluster is not None else "SUBSCRIBE"
        self._feed = LeaderFeed(client._db(), key)
        self._ready: list[Leader] = []
        self._sub: Optional[Subscriber] = None
        self._lock = threading.Lock()
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
            sub = self._sub
            if sub is None:
                try:
                    await self._connect()
                    delay = 0.05
                except NotSupported:  # the server has no elections: never tried again
                    await self._drop()
                    raise
                except LockError:
                    await sleep(delay)
                    delay = min(delay * 2, 2.0)
                continue
            try:
                reply = await sub.read()
            except ResponseError:
                continue
            except IO_ERRORS:
                await self._drop()
                continue
            except Cancelled:
                await self._drop()  # a half-read reply must never be read later
                raise
            if reply is not CLOSED:
                await self._take(reply)

    async def _connect(self) -> None:
        """Subscribes, then reads the leader (in that order: nothing is missed in between)."""
        connector = (await self._client._node_for(self._key)).commands
        sub = Subscriber(await connector.new())
        try:
            sub.post(self._subscribe, self._channel)
            try:
                reply = await sub.read(connector.timeout)
            except ResponseError as e:
                raise LockConnectionError(f"{self._subscribe}: {e}") from None
            except IO_ERRORS as e:
                raise LockConnectionError(f"{self._subscribe}: {e}") from e
            if not (isinstance(reply, list) and reply[1:2] == [self._channel]):
                raise LockConnectionError(f"{self._subscribe} answered {reply!r}")
            found = parse_leader(await self._client._query(self._key, leader(self._key)))
        except Redirected as e:
            await sub.close()
            # Escaped the read's own following: a MOVED names the slot's node from now on; an
            # ASK (the slot is moving: its target takes one command after ASKING) only has the
            # slot map loaded again. Noted as a MOVED, it sent every command of the slot to the
            # importing node until that node answered MOVED back.
            await self._client._redirects().follow(e, asked=True)
            raise
        except BaseException:
            await sub.close()
            raise
        with self._lock:
            closed = self._closed
            if not closed:
                self._sub = sub
        if closed:
            await sub.close()
            return
        if connector.sentinel:
            spawn("redis-lock-follow", self._follow, sub, connector)
        self._push(self._feed.read(found))

    async def _take(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel, payload = reply[0], reply[1], reply[2]
        if kind not in (b"message", b"smessage") or channel != self._channel:
            return
        if not isinstance(payload, bytes):
            return
        if not self._feed.message(parse_leader_message(payload)):
            return
        try:
            found = parse_leader(await self._client._query(self._key, leader(self._key)))
        except LockError:
            await self._drop()  # connect again, subscribe again and read: nothing is missed
            return
        self._push(self._feed.read(found))

    async def _follow(self, sub: Subscriber, connector: Connector) -> None:
        """Under Sentinel: leaves ``sub`` as soon as the Sentinels name another master (as the
        signal listener does); the observer connects again and reads the leader there."""
        while not self._closed and self._sub is sub:
            await sleep(FOLLOW_PERIOD)
            master = await connector.current_master()
            if self._sub is sub and master is not None and sub.address not in (None, master):
                await sub.kick()
                return

    def _push(self, found: Optional[Leader]) -> None:
        if found is not None:
            self._ready.append(found)

    async def _drop(self) -> None:
        with self._lock:
            sub, self._sub = self._sub, None
        if sub is not None:
            await sub.close()

    async def aclose(self) -> None:
        """Ends the iteration and closes the connection."""
        with self._lock:
            self._closed = True
        await self._drop()

    async def __aenter__(self) -> AsyncObserver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
